"""The rank processes of one attempt: torchrun's environment for each rank, and a warm spare or
a new bootstrap process to run it, on the supervisor of rank processes
(``rankguard.supervisor``).

Each rank runs ``python -m rankguard.runtime.bootstrap`` in its own session (so its process group
can be signalled as a whole) with torchrun's environment plus rankguard's own variables. Its
stdout and stderr are pipes that the supervisor reads into the rank's log and, as
``config.streams`` says (all of it by default, see ``streams``), to the launcher's terminal,
each line prefixed with ``[rankN]:`` (see ``supervisor.output``); the terminal never blocks the
launcher (see ``terminal``).

Exits are events, not polls: each rank's pidfd is in the supervisor's selector, beside its
output pipes and whatever the agent registers (its signal wakeup fd).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable

from .. import margins
from ..records import private_files, recovery_file
from ..store import sealed
from ..processes.proctree import MARKER, is_stopped
from ..supervisor import RankFiles, RankProcesses, spawn
from ..inputs.nccl_env import nccl_settings
from ..supervisor.rank_processes import Tee, Writer
from .config import RunConfig
from .store_keys import attempt_namespace
from .streams import Std
from .terminal import Terminal


def _activate(spare: subprocess.Popen[bytes], env: dict[str, str]) -> bool:
    """Hand ``env`` to a waiting spare; False (and the spare discarded) when it is gone, or
    stopped (SIGSTOP: it would never join its peers)."""
    assert spare.stdin is not None
    try:
        if spare.poll() is None and not is_stopped(spare.pid):
            spare.stdin.write(json.dumps(env).encode() + b"\n")
            spare.stdin.close()
            return True
    except OSError:  # it died meanwhile
        pass
    discard(spare)
    return False


def discard(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a bootstrap process that never became a rank, reap it, close its pipes."""
    proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


@dataclass(frozen=True)
class Layout:
    """Where this node's ranks sit in the job for one attempt: what torchrun's environment
    tells each rank about the job (its store, the world, this node's place in it)."""

    master_addr: str
    master_port: int
    namespace: str  # the attempt's (or round's) store prefix, RANKGUARD_NAMESPACE
    world: int  # WORLD_SIZE: ranks of every node
    base: int = 0  # the global rank of this node's local rank 0
    group_rank: int = 0  # GROUP_RANK: this node's rank among the nodes of the round
    group_world: int = 1  # GROUP_WORLD_SIZE: nodes in the round
    round: int | None = None  # the rendezvous round (several nodes only)

    @classmethod
    def one_node(cls, config: RunConfig, attempt: int, master_port: int) -> "Layout":
        """This node alone: every rank of the job is local, the store is the launcher's."""
        return cls(config.master_addr, master_port, attempt_namespace(config.run_id, attempt),
                   config.nproc)


def base_env(config: RunConfig, token: str, master_port: int) -> dict[str, str]:
    """The environment every rank of the run shares (a warm spare starts with this).

    With several nodes the ranks get no secret from the agent (each agent would draw its own):
    unless ``RANKGUARD_SECRET`` is set alike on every node, rank 0 draws one when the default
    group forms and sends it to the others over gloo (``sealed.agree``)."""
    env = dict(os.environ)
    for own in ("RANKGUARD_REPLACING", "RANKGUARD_RECOVERY_FILE", "RANKGUARD_REPLACE_TIMEOUT",
                sealed.KEPT_ENV):
        env.pop(own, None)  # the launcher's to give: left in the user's shell, they would mislead
    world = config.nproc
    env.update(
        WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world), GROUP_RANK="0", GROUP_WORLD_SIZE="1",
        ROLE_WORLD_SIZE=str(world), ROLE_NAME=config.role, MASTER_ADDR=config.master_addr,
        MASTER_PORT=str(master_port), TORCHELASTIC_MAX_RESTARTS=str(config.max_restarts),
        TORCHELASTIC_RUN_ID=config.run_id, TORCHELASTIC_USE_AGENT_STORE="True",
        **nccl_settings(env),
        OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"),
        PYTHONUNBUFFERED=env.get("PYTHONUNBUFFERED", "1"),
        RANKGUARD_LAUNCHER_PID=str(os.getpid()),
        RANKGUARD_INJECT=";".join(spec.text for spec in config.injections),
        RANKGUARD_GRACE=f"{config.rank_grace:g}",
        RANKGUARD_HANG_TIMEOUT=f"{config.hang_timeout:g}",  # bounds a rank's wait for a store
        RANKGUARD_LOG_DIR=config.log_dir,  # the run's private folder (0700), e.g. for checkpoints
    )
    if config.rendezvous is None:
        env[sealed.ENV] = config.secret
    if config.collective_timeout is not None:
        env["RANKGUARD_COLLECTIVE_TIMEOUT"] = f"{config.collective_timeout:g}"
    elif config.in_place:  # bounded mode, so that a notice releases the survivors at once
        env["RANKGUARD_COLLECTIVE_TIMEOUT"] = f"{margins.IN_PLACE_COLLECTIVE_S:g}"
    if config.in_place:
        env["RANKGUARD_REPLACE_TIMEOUT"] = f"{margins.replace_timeout(config.hang_timeout):g}"
    env[MARKER] = token
    return env


def rank_env(config: RunConfig, local_rank: int, attempt: int, token: str, layout: Layout,
             ledger_path: str, stacks_path: str) -> dict[str, str]:
    """torchrun's environment for local rank ``local_rank`` of ``layout`` plus rankguard's
    variables."""
    env = base_env(config, token, layout.master_port)
    rank = layout.base + local_rank
    env.update(
        RANK=str(rank), LOCAL_RANK=str(local_rank), ROLE_RANK=str(rank),
        WORLD_SIZE=str(layout.world), LOCAL_WORLD_SIZE=str(config.nproc),
        GROUP_RANK=str(layout.group_rank), GROUP_WORLD_SIZE=str(layout.group_world),
        ROLE_WORLD_SIZE=str(layout.world), MASTER_ADDR=layout.master_addr,
        MASTER_PORT=str(layout.master_port),
        TORCHELASTIC_RESTART_COUNT=str(attempt), RANKGUARD_LEDGER=ledger_path,
        RANKGUARD_STACKS=stacks_path, RANKGUARD_ATTEMPT=str(attempt),
        RANKGUARD_NAMESPACE=layout.namespace,
    )
    if config.virtual_local_rank:
        env.update(virtual_local_rank(local_rank))
    if layout.round is not None:
        env["RANKGUARD_ROUND"] = str(layout.round)
    if config.in_place and not env.get(sealed.ENV):  # set but empty: no secret either
        # the ranks agree on a secret over gloo (several nodes): a replacement, which cannot
        # take part in that, reads it where they keep it, in the private ledger folder
        env[sealed.KEPT_ENV] = os.path.join(os.path.dirname(ledger_path),
                                            f"attempt{attempt}.secret")
    return env


def virtual_local_rank(local_rank: int) -> dict[str, str]:
    """torchrun's ``--virtual-local-rank``: the rank sees its own device only, as device 0
    (local rank N's is the N-th of the launcher's ``CUDA_VISIBLE_DEVICES``, else device N)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    device = visible.split(",")[local_rank].strip() if visible is not None else str(local_rank)
    return {"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": device}


def terminal_tee(config: RunConfig, terminal: Terminal | None, base: int) -> Tee | None:
    """What of each rank's output ``terminal`` shows (``config.streams``, by local rank: the
    global rank less ``base``); None: nothing at all."""
    if terminal is None or not config.streams.any_shown(config.nproc):
        return None

    def writers(rank: int) -> tuple[Writer | None, Writer | None]:
        shown = config.streams.shown(rank - base)
        return (terminal.rank_out if Std.OUT in shown else None,
                terminal.rank_err if Std.ERR in shown else None)

    return writers


def start_bootstrap(config: RunConfig, env: dict[str, str],
                    spare: bool = False) -> subprocess.Popen[bytes]:
    """Start ``python -m rankguard.runtime.bootstrap`` for the run's command, in its own session,
    its output into pipes. A spare gets a stdin pipe, for its activation line; a rank gets no
    stdin. With ``--no-python`` the bootstrap becomes the command (``exec``), once it has tied
    its life to the launcher's."""
    mode = ["--spare"] if spare else ["--no-python"] if config.no_python else []
    argv = [sys.executable, "-m", "rankguard.runtime.bootstrap", *mode, *config.command]
    return spawn(argv, env, stdin_pipe=spare)


def start_attempt(config: RunConfig, attempt: int, token: str, layout: Layout,
                  ledger_dir: str,
                  spares: Callable[[], subprocess.Popen[bytes] | None] = lambda: None,
                  terminal: Terminal | None = None, replacing: bool = False) -> RankProcesses:
    """Create the ledgers and start every local rank of attempt ``attempt`` (the set's
    ``number``) where ``layout`` puts them; returns at once (ranks import in parallel). The
    set's members are numbered by global rank.

    Each rank is a warm spare from ``spares()`` when it gives one, else a new process. Its log
    and stacks go to ``LOG_DIR/attemptN/``, its ledger to ``ledger_dir`` (the run's private
    ledger folder, ``ledger.make_dir``). Rank output is teed to ``terminal`` when given, as
    ``config.streams`` says. With ``replacing``, every rank is the replacement of a lost one
    (a standby node taking a lost node's place): see :func:`replacement_env`.

    Raises:
        UsageError: ``LOG_DIR/attemptN`` is a link, not a folder, or a folder of someone else's
            or that others can write (planted there by whoever can write ``LOG_DIR``).
    """
    # 0700, and a link or someone else's folder found at the name is refused, never followed
    attempt_dir = private_files.private_dir(os.path.join(config.log_dir, f"attempt{attempt}"),
                                            "--log-dir")
    ranks = RankProcesses(attempt, layout.world, terminal_tee(config, terminal, layout.base))
    for local_rank in range(config.nproc):
        rank = layout.base + local_rank
        files = RankFiles(log=os.path.join(attempt_dir, f"rank{rank}.log"),
                          stacks=os.path.join(attempt_dir, f"stacks_rank{rank}.txt"),
                          ledger=os.path.join(ledger_dir, f"attempt{attempt}-rank{rank}.ledger"))
        env = rank_env(config, local_rank, attempt, token, layout, files.ledger, files.stacks)
        if replacing:
            env.update(replacement_env(recovery_path(attempt_dir, rank)))
        spare = spares()
        member = ranks.start(rank, files, env, launcher_for(config, spare))
        member.warm = member.proc is spare
    return ranks


def recovery_path(attempt_dir: str, rank: int, number: int = 0) -> str:
    """Where replacement ``number`` of rank ``rank`` says it holds the state
    (``recovery_file``); 0: a rank started as a replacement with its attempt."""
    return os.path.join(attempt_dir, f"replacement{number}_rank{rank}.json")


def replacement_env(recovery: str) -> dict[str, str]:
    """What makes a rank a replacement: it joins the survivors' generation
    (``RANKGUARD_REPLACING``) and says at ``recovery`` when it holds the state. An injected
    fault is the first process's: the replacement would meet it again."""
    return {"RANKGUARD_REPLACING": "1", recovery_file.PATH_ENV: recovery, "RANKGUARD_INJECT": ""}


def launcher_for(config: RunConfig, spare: subprocess.Popen[bytes] | None
                 ) -> Callable[[dict[str, str]], subprocess.Popen[bytes]]:
    """What starts a rank given its environment: ``spare`` becomes it if there is one and it
    is still alive, else a new bootstrap process."""

    def launch(env: dict[str, str]) -> subprocess.Popen[bytes]:
        return spare if spare is not None and _activate(spare, env) else \
            start_bootstrap(config, env)

    return launch
