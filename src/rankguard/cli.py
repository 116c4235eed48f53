"""The ``rankguard`` command (also ``python -m rankguard``): ``rankguard run ...`` (the launcher),
``rankguard serve APP`` (an HTTP server in front of a rankguard.Pool; see
``rankguard.serving.cli``), and the commands that look at a run (``OBSERVE``, in
``rankguard.observe``).

Exit codes (stable, documented in the README): 0 every rank succeeded; 1 a rank failed (raised,
exited non-zero, was killed) and restarts ran out; 2 bad usage, nothing started; 3 a rank hung
and restarts ran out; 4 an internal error of rankguard (every rank stopped); 130 / 143 the launcher
received SIGINT / SIGTERM. A command that looks at a run and whose output pipe closed
(`rankguard status | head -1`) ends quietly with 141, as one killed by SIGPIPE.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys

from .errors import UsageError

# command -> its module in rankguard.observe (each has ``main(argv) -> exit code``)
OBSERVE = {"stacks": "stacks_cli", "status": "status_cli", "report": "report_cli",
           "flight-recorder": "flight_recorder_cli"}

USAGE = """usage: rankguard run [options] SCRIPT [ARGS...]
       rankguard run [options] -m MODULE [ARGS...]
       rankguard serve [options] APP
       rankguard stacks [options] [RUN]
       rankguard status [options] [RUN]
       rankguard report [options] [RUN]
       rankguard flight-recorder [options] [RUN]

Commands:
  run    launch a torch.distributed job on this node, protected against hangs
         (rankguard run --help for its options)
  serve  serve a rankguard.Service over HTTP on a self-healing pool of rank processes
         (rankguard serve --help for its options)
  stacks the Python stacks of every rank of a run, now, grouped by identical stack
         (rankguard stacks --help)
  status a live view of a run's ranks: where each is, who the others wait for
         (rankguard status --help)
  report a run as one HTML file with a timeline of every rank (rankguard report --help)
  flight-recorder
         an attempt's recent operations as PyTorch Flight Recorder dumps, for torch's trace
         analyser (rankguard flight-recorder --help)"""


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
    if command in OBSERVE:
        module = importlib.import_module(f".observe.{OBSERVE[command]}", __package__)
        try:
            return int(module.main(rest))
        except BrokenPipeError:  # its reader went away (`| head -1`): nobody left to tell
            _drop_stdout()
            return 128 + signal.SIGPIPE
    if command != "run":
        print(f"rankguard: unknown command {command!r} (commands: run, serve, "
              f"{', '.join(OBSERVE)}; see rankguard --help)", file=sys.stderr)
        return 2
    return _run(rest)


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush of what is still
    buffered for a closed pipe does not print an error of its own at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _run(argv: list[str]) -> int:
    """``rankguard run``. A signal before the agent took the signals over (while torch and the
    launcher import, or the job's store is joined: ``launcher.early_signals``) ends it with
    128 + the signal and a line, having started nothing and leaving no empty folder; the agent
    handles every signal from then on."""
    from .inputs.options import remove_empty_dirs
    from .launcher import early_signals
    from .store import store_calls

    early_signals.hold()
    config = agent = None
    try:
        from .launcher import cli as run_cli
        from .launcher import store

        config = run_cli.parse(argv)
        for note in config.notes:
            print(f"rankguard run: {note}", file=sys.stderr)
        if config.rendezvous is not None:  # several nodes: the store is at --rdzv-endpoint
            from .launcher import node_agent

            return node_agent.main(config)
        sock = store.reserve_port(config.master_addr, config.master_port)
        from .launcher.agent import Agent
        from .launcher.node_link import OneNode

        one_node = OneNode(config, sock)
        agent = Agent(config, one_node.port, lambda _: one_node)
        early_signals.check()
    except UsageError as exc:  # nothing started, and no folder made for it is left
        if config is not None:
            remove_empty_dirs(config.made_dirs)
        print(f"rankguard run: error: {exc}", file=sys.stderr, flush=True)
        if store_calls.abandoned():  # see below
            sys.stdout.flush()
            os._exit(2)
        return 2
    except early_signals.Interrupted as stop:
        if agent is not None:
            agent.abandon()
        if config is not None:
            remove_empty_dirs(config.made_dirs)
        print(f"rankguard run: {stop}; nothing was started", file=sys.stderr, flush=True)
        sys.stdout.flush()
        # not by returning: a store handshake the signal cut short is still blocked on the
        # endpoint, and the interpreter's exit would wait for it (exit_waits), then abort if it
        # came back during the finalization
        os._exit(128 + stop.signum)
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
