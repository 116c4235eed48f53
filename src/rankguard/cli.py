"""The ``rankguard`` command (also ``python -m rankguard``): ``rankguard run ...`` (the launcher),
``rankguard serve APP`` (an HTTP server in front of a rankguard.Pool; see
``rankguard.serving.cli``), ``rankguard stacks [RUN]`` (``rankguard.observe.stacks_cli``).

Exit codes (stable, documented in the README): 0 every rank succeeded; 1 a rank failed (raised,
exited non-zero, was killed) and restarts ran out; 2 bad usage, nothing started; 3 a rank hung
and restarts ran out; 4 an internal error of rankguard (every rank stopped); 130 / 143 the launcher
received SIGINT / SIGTERM.
"""

from __future__ import annotations

import sys

from .errors import UsageError

USAGE = """usage: rankguard run [options] SCRIPT [ARGS...]
       rankguard run [options] -m MODULE [ARGS...]
       rankguard serve [options] APP
       rankguard stacks [options] [RUN]
       rankguard status [options] [RUN]

Commands:
  run    launch a torch.distributed job on this node, protected against hangs
         (rankguard run --help for its options)
  serve  serve a rankguard.Service over HTTP on a self-healing pool of rank processes
         (rankguard serve --help for its options)
  stacks the Python stacks of every rank of a run, now, grouped by identical stack
         (rankguard stacks --help)
  status a live view of a run's ranks: where each is, who the others wait for
         (rankguard status --help)"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "--version":
        from . import __version__

        print(f"rankguard {__version__}")
        return 0
    if command == "serve":
        from .serving import cli as serve_cli

        return serve_cli.main(rest)
    if command == "stacks":
        from .observe import stacks_cli

        return stacks_cli.main(rest)
    if command == "status":
        from .observe import status_cli

        return status_cli.main(rest)
    if command != "run":
        print(f"rankguard: unknown command {command!r} (commands: run, serve, stacks, status; "
              "see rankguard --help)", file=sys.stderr)
        return 2
    return _run(rest)


def _run(argv: list[str]) -> int:
    from .launcher import cli as run_cli
    from .launcher import store

    try:
        config = run_cli.parse(argv)
        if config.rendezvous is not None:  # several nodes: the store is at --rdzv-endpoint
            from .launcher import node_agent

            return node_agent.main(config)
        sock = store.reserve_port(config.master_addr, config.master_port)
    except UsageError as exc:
        print(f"rankguard run: error: {exc}", file=sys.stderr)
        return 2
    from .launcher.agent import Launcher

    return Launcher(config, sock).run()


if __name__ == "__main__":
    sys.exit(main())
