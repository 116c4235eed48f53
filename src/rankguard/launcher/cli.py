"""``rankguard run``: command-line options, torchrun's spellings included, and their checks.

Every bad input ends in one line on stderr that names the option and how to fix it, and exit
code 2, before anything is started.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import os
import re
import shutil
import socket
import sys
import uuid

from ..inputs import options
from ..records import private_files
from ..records.ledger import MAX_INJECTIONS
from ..store import sealed
from ..errors import UsageError
from ..inputs.options import (MAX_LOCAL_RANKS, Parser, missing_dirs, number, remove_empty_dirs,
                              writable_dir, writable_file)
from ..inject import spec as inject_spec
from . import config as _config
from . import torchrun_flags
from .streams import Std, StreamChoice, TerminalStreams, parse_choice, parse_ranks


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="rankguard run",
        description="Run a torch.distributed script on N local ranks, like torchrun, so that no "
        "rank fault can hang it: crashes, kills, frozen or deadlocked ranks and evictions end "
        "in a bounded, explained outcome, then a restart or the right exit code.",
        allow_abbrev=False,
    )
    p.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc", default="1",
                   help="ranks to start on this node: a number, 'cpu' (one per core), 'gpu' or "
                   "'xpu' (one per device) or 'auto' (one per accelerator device, else per "
                   "core)")
    p.add_argument("--nnodes", default="1",
                   help="nodes of the job: N, or MIN:MAX (default 1: this node alone; more "
                   "needs --rdzv-backend c10d or etcd-v2, and --rdzv-endpoint)")
    p.add_argument("--node-rank", "--node_rank", dest="node_rank", default="0",
                   help="this node's rank, from 0, with --rdzv-backend static (c10d and "
                   "etcd-v2 number the nodes themselves)")
    p.add_argument("--rdzv-backend", "--rdzv_backend", dest="rdzv_backend", default="static",
                   help="how the nodes meet: static (the default, as torchrun's: fixed "
                   "--nnodes N and --node-rank, node 0 hosts the store at --master-addr/"
                   "--master-port), c10d (torch's dynamic rendezvous on a TCPStore hosted by "
                   "the agent at --rdzv-endpoint) or etcd-v2 (the same on an etcd server at "
                   "--rdzv-endpoint, which outlives every node)")
    p.add_argument("--rdzv-endpoint", "--rdzv_endpoint", dest="rdzv_endpoint", default="",
                   help="HOST:PORT of the job's store (several nodes): the c10d store's agent "
                   "(default port 29400) or the etcd server (default port 2379); static: "
                   "node 0's, instead of --master-addr/--master-port")
    p.add_argument("--rdzv-conf", "--rdzv_conf", dest="rdzv_conf", default="",
                   help="k=v,... for torch's rendezvous: join_timeout (default 600), "
                   "last_call_timeout (30), close_timeout (30), read_timeout (60), "
                   "keep_alive_interval, keep_alive_max_attempt; c10d: is_host; etcd-v2: "
                   "protocol, ssl_cert, ssl_cert_key, ca_cert")
    p.add_argument("--local-addr", "--local_addr", dest="local_addr", default=None,
                   help="this node's address in the rendezvous (default: its FQDN)")
    p.add_argument("--max-restarts", "--max_restarts", dest="max_restarts", default="0",
                   help="restart the whole group up to this many times after a fault (default 0)")
    p.add_argument("--master-addr", "--master_addr", dest="master_addr", default="127.0.0.1",
                   help="address of the job's store, hosted by this launcher (default "
                   "127.0.0.1); with several static nodes, node 0's")
    p.add_argument("--master-port", "--master_port", dest="master_port",
                   default=str(_config.DEFAULT_MASTER_PORT),
                   help="port of the job's store (default 29500; 0: any free port)")
    p.add_argument("--standalone", action="store_true",
                   help="as in torchrun: pick a free port for the store")
    p.add_argument("--run-id", "--run_id", "--rdzv-id", "--rdzv_id", dest="run_id", default=None,
                   help="the run's name in logs and the journal (default: a random id)")
    p.add_argument("--log-dir", "--log_dir", dest="log_dir", default="",
                   help="folder for rank logs, stacks and the journal "
                   "(default: $TMPDIR/rankguard-UID/RUN_ID, private to you)")
    p.add_argument("--journal", dest="journal", default="",
                   help="path of the JSON-lines journal (default: LOG_DIR/journal.jsonl)")
    p.add_argument("--hang-timeout", dest="hang_timeout",
                   default=str(_config.DEFAULT_HANG_TIMEOUT),
                   help="seconds a rank may make no progress at all while its peers wait in a "
                   "collective before it is blamed as hung (default 10)")
    p.add_argument("--straggler-timeout", dest="straggler_timeout",
                   default=str(_config.DEFAULT_STRAGGLER_TIMEOUT),
                   help="seconds peers may wait for a rank that is busy (using CPU or doing I/O) "
                   "before it too is blamed as hung (default 300)")
    p.add_argument("--grace", dest="grace", default=None,
                   help="seconds between SIGTERM and SIGKILL when stopping ranks (default 5)")
    p.add_argument("--collective-timeout", dest="collective_timeout", default="",
                   help="deadline in seconds of every collective of every rank: one that has not "
                   "completed by then raises rankguard.CollectiveTimeout in the rank, naming the "
                   "ranks that had not arrived (default: none; the hang detector still applies)")
    p.add_argument("--recovery", dest="recovery", default=_config.RESTART,
                   help="what a rank's fault leads to: 'restart' (default) stops every rank and "
                   "starts the attempt again; 'in-place' replaces the failed rank with a warm "
                   "spare while the others wait, for scripts whose loop runs in "
                   "rankguard.StepLoop (others restart); each replacement counts against "
                   "--max-restarts")
    p.add_argument("--inject", dest="inject", action="append", default=[], metavar="SPEC",
                   help="inject a fault, e.g. hang:rank=2,at=op30 (repeatable; see README)")
    p.add_argument("--no-tee", dest="no_tee", action="store_true",
                   help="write rank output only to the log dir, not to this terminal (as "
                   "--redirects 3)")
    p.add_argument("-r", "--redirects", dest="redirects", default=None,
                   help="as torchrun's: these streams of these local ranks only to the log, not "
                   "to this terminal (3: stdout and stderr of every local rank, 1 stdout, 2 "
                   "stderr; 0:3,1:2 per local rank); the log always has everything")
    p.add_argument("-t", "--tee", dest="tee", default=None,
                   help="as torchrun's: these streams to this terminal too, even if redirected "
                   "(same format as --redirects)")
    p.add_argument("--local-ranks-filter", "--local_ranks_filter", dest="local_ranks_filter",
                   default=None, help="show only these local ranks' output on this terminal, "
                   "e.g. 0 or 0,1 (their logs have everything)")
    p.add_argument("--no-python", "--no_python", dest="no_python", action="store_true",
                   help="run SCRIPT as an executable, not with python (its Python children "
                   "that call rankguard.init() are watched for hangs)")
    p.add_argument("--run-path", "--run_path", dest="run_path", action="store_true",
                   help="run the script with runpy.run_path in the rank's interpreter: what "
                   "rankguard always does; it takes precedence over --no-python, as in torchrun")
    p.add_argument("--role", dest="role", default="default",
                   help="the workers' role, in each rank's ROLE_NAME (default 'default')")
    p.add_argument("--virtual-local-rank", "--virtual_local_rank", dest="virtual_local_rank",
                   action="store_true", help="as torchrun's: every rank gets LOCAL_RANK 0 and "
                   "CUDA_VISIBLE_DEVICES naming its own device")
    p.add_argument("--signals-to-handle", "--signals_to_handle", dest="signals",
                   default=None,
                   help="signals that stop every rank and end the run with 128 + the signal's "
                   "number (default SIGTERM,SIGINT,SIGHUP,SIGQUIT, as torchrun's, less a "
                   "SIGHUP or SIGQUIT this launcher was started ignoring, as by nohup)")
    p.add_argument("--shutdown-timeout", "--shutdown_timeout", dest="shutdown_timeout",
                   default=None, help="torchrun's name of --grace")
    torchrun_flags.add_no_effect_options(p)
    p.add_argument("--no-spares", dest="spares", action="store_false",
                   help="restart with freshly started ranks instead of warm spares (spares: one "
                   "process per rank with torch imported, started once an attempt has taken its "
                   "first step, only while restarts remain)")
    p.add_argument("-m", "--module", dest="module", action="store_true",
                   help="run SCRIPT as a Python module, like python -m")
    p.add_argument("script", metavar="SCRIPT", help="the training script (or module with -m)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS",
                   help="arguments for the script")
    return p


def _cores() -> int:
    """The cores this process may run on (taskset, cgroups), as torchrun counts them."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _nproc(text: str) -> int:
    if text == "cpu":
        return _cores()
    if text in ("gpu", "xpu", "auto"):
        return _devices(text)
    nproc = int(number("--nproc-per-node", text, int, 1, "give the number of ranks, e.g. 4"))
    if nproc > MAX_LOCAL_RANKS:
        raise UsageError("--nproc-per-node", f"{nproc} ranks on one node is beyond this launcher",
                         f"use at most {MAX_LOCAL_RANKS}")
    return nproc


def _devices(kind: str) -> int:
    """``--nproc-per-node gpu``, ``xpu`` or ``auto``, as torchrun counts them: the CUDA or XPU
    devices (auto: the accelerator's, else one per core). Imports torch (seconds), only here.

    Raises:
        UsageError: gpu or xpu where there is no such device.
    """
    import torch

    if kind == "auto":
        if torch.accelerator.is_available():
            return int(torch.accelerator.device_count())
        return _cores()
    backend = torch.cuda if kind == "gpu" else torch.xpu
    if not backend.is_available():
        raise UsageError("--nproc-per-node", f"{kind}: no {'CUDA' if kind == 'gpu' else 'XPU'} "
                         "device is available here", "give a number of ranks, or cpu")
    return int(backend.device_count())


# A run id names files and folders: a letter or digit first (no ".", "..", "-x"), then
# letters, digits, "-", "_" and "."; short enough for a file name with a suffix.
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", re.ASCII)


def _check_run_id(run_id: str) -> str:
    if not _RUN_ID.fullmatch(run_id):
        raise UsageError("--run-id", f"{run_id!r} is not a simple name", "use up to 128 "
                         "letters, digits, '-', '_' and '.', starting with a letter or digit")
    return run_id


def _check_module(name: str) -> None:
    """``name`` is a module ``python -m`` can run from here: a module, or a package with a
    ``__main__``. Found without importing any of it where its packages' folders tell (its code
    may start a job, or take seconds to import torch); only a submodule those folders do not
    hold (a package that extends its ``__path__`` when imported) is looked up by importing its
    parents, as ``python -m`` would."""
    parts = name.split(".")
    if not all(part.isidentifier() for part in parts):
        raise UsageError("-m", f"{name!r} is not a module name",
                         "give a dotted module name, e.g. -m mypackage.train")
    sys.path.insert(0, os.getcwd())
    try:
        spec = importlib.util.find_spec(parts[0])
        for depth in range(1, len(parts)):
            if spec is None or spec.submodule_search_locations is None:
                break
            child = ".".join(parts[:depth + 1])
            spec = (importlib.machinery.PathFinder.find_spec(child, spec.submodule_search_locations)
                    or importlib.util.find_spec(child))
        if spec is not None and spec.submodule_search_locations is not None:
            main = importlib.machinery.PathFinder.find_spec(
                f"{name}.__main__", spec.submodule_search_locations)
            if main is None:
                raise UsageError("-m", f"{name!r} is a package without a __main__ module, so "
                                 "it cannot be run", "give a module inside it, or add "
                                 f"{name.replace('.', '/')}/__main__.py")
    except (ImportError, ValueError):
        spec = None
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 (a parent package's own code raised)
        raise UsageError("-m", f"importing the packages of {name!r} raised "
                         f"{type(exc).__name__}: {exc}", "fix the error in the package's "
                         "__init__.py") from None
    finally:
        sys.path.pop(0)
    if spec is None:
        raise UsageError("-m", f"no module named {name!r}",
                         f"give the module's name without .py, e.g. -m {name[:-3]}"
                         if name.endswith(".py") else
                         "check the name and that it is importable from this folder")


def _check_script(module: bool, script: str, no_python: bool = False) -> None:
    if module:
        _check_module(script)
        return
    if no_python:
        _check_executable(script)
        return
    if not os.path.exists(script):
        raise UsageError("SCRIPT", f"{script!r} does not exist",
                         "give the path of the training script")
    if not os.path.isfile(script):
        raise UsageError("SCRIPT", f"{script!r} is not a file", "give a Python script")


def _check_executable(program: str) -> None:
    """``--no-python``: ``program`` is an executable file, by its path or on ``PATH``."""
    if os.sep not in program:
        if shutil.which(program) is None:
            raise UsageError("SCRIPT", f"{program!r} is no executable on PATH (--no-python)",
                             f"give its path, e.g. ./{program}")
        return
    if not os.path.isfile(program):
        raise UsageError("SCRIPT", f"{program!r} is not a file" if os.path.exists(program)
                         else f"{program!r} does not exist", "give the path of the executable")
    if not os.access(program, os.X_OK):
        raise UsageError("SCRIPT", f"{program!r} is not executable (--no-python runs it as a "
                         "program)", f"chmod +x {program}, or leave out --no-python")


def parse(argv: list[str]) -> _config.RunConfig:
    """Turn ``rankguard run`` arguments into a :class:`RunConfig`.

    Raises:
        UsageError: any bad flag, value or path; the message names it and says how to fix it.
    """
    p = build_parser()
    torchrun_flags.environment_defaults(p)
    ns = p.parse_args(argv)
    sealed.check_env()
    options.gloo_mode()
    options.check_ranks_env()
    min_nodes, max_nodes = _nnodes(ns.nnodes)
    node_rank = int(number("--node-rank", ns.node_rank, int, 0, "e.g. --node-rank 0"))
    port = int(number("--master-port", ns.master_port, int, 0, "use a port from 1 to 65535"))
    if port > 65535:
        raise UsageError("--master-port", f"{port} is above 65535", "use a port from 1 to 65535")
    if ns.standalone:
        port = 0
    if not ns.master_addr.strip():
        raise UsageError("--master-addr", "is empty", "e.g. --master-addr 127.0.0.1")
    if node_rank and (max_nodes == 1 or ns.rdzv_backend != "static"):
        raise UsageError("--node-rank", f"{node_rank} is only for several nodes with "
                         "--rdzv-backend static: one node is node 0, and c10d and etcd-v2 "
                         "number the nodes themselves", "leave --node-rank out")
    if ns.local_addr is not None and not ns.local_addr.strip():
        raise UsageError("--local-addr", "is empty", "give this node's address, or leave it out")
    _check_backend(ns.rdzv_backend)
    rendezvous = None
    if max_nodes > 1:
        rendezvous = (_static(ns, min_nodes, max_nodes, node_rank, port)
                      if ns.rdzv_backend == "static" else _rendezvous(ns, min_nodes, max_nodes))
    nproc = _nproc(ns.nproc)
    max_restarts = int(number("--max-restarts", ns.max_restarts, int, 0, "e.g. --max-restarts 3"))
    hang = number("--hang-timeout", ns.hang_timeout, float, 0.1, "e.g. --hang-timeout 10")
    straggler = number("--straggler-timeout", ns.straggler_timeout, float, 0.1,
                        "e.g. --straggler-timeout 300")
    if straggler < hang:
        raise UsageError("--straggler-timeout", f"{straggler:g} s is shorter than "
                         f"--hang-timeout {hang:g} s", "a busy rank gets at least as long as a "
                         "frozen one; raise --straggler-timeout")
    grace = _grace(ns.grace, ns.shutdown_timeout)
    collective_timeout = None
    if ns.collective_timeout:
        collective_timeout = number("--collective-timeout", ns.collective_timeout, float, 0.001,
                                     "e.g. --collective-timeout 60")
    recovery = _recovery(ns.recovery, max_restarts, max_nodes)
    injections = tuple(inject_spec.parse(text) for text in ns.inject)
    if len(injections) > MAX_INJECTIONS:
        raise UsageError("--inject", f"is given {len(injections)} times, more than the "
                         f"{MAX_INJECTIONS} a run may have", "give fewer faults")
    for fault in injections:
        if fault.rank >= nproc * max_nodes:
            raise UsageError("--inject", f"{fault.text!r} targets rank {fault.rank}, but the run "
                             f"has ranks 0 to {nproc * max_nodes - 1}", "pick an existing rank")
        if fault.attempt is not None and fault.attempt > max_restarts:
            raise UsageError("--inject", f"{fault.text!r} targets attempt {fault.attempt}, but "
                             f"the run has attempts 0 to {max_restarts}",
                             "raise --max-restarts, or pick an attempt that will run")
    notes = torchrun_flags.notes(ns)
    no_python = ns.no_python and not ns.run_path
    if no_python and ns.module:
        raise UsageError("--no-python", "runs SCRIPT as an executable, and -m runs a Python "
                         "module: they cannot go together (torchrun refuses them too)",
                         "leave out one of them")
    streams = _streams(ns)
    signals = (torchrun_flags.signals(ns.signals) if ns.signals is not None
               else torchrun_flags.default_signals())
    if not ns.role.strip():
        raise UsageError("--role", "is empty", "give the workers' role, or leave it out")
    if ns.virtual_local_rank:
        _check_devices(nproc)
    _check_script(ns.module, ns.script, no_python)
    if rendezvous is not None and rendezvous.backend == "static" and ns.run_id is None:
        ns.run_id = f"static-{rendezvous.port}"  # torchrun needs none there: one job per store
    if rendezvous is not None and ns.run_id is None:
        raise UsageError("--rdzv-id", "is needed with several nodes: every agent of the job "
                         "gives the same one", "e.g. --rdzv-id job42")
    run_id = _check_run_id(ns.run_id) if ns.run_id is not None else f"rg-{uuid.uuid4().hex[:8]}"
    home = private_files.user_dir("--log-dir")
    parts = (run_id,) if rendezvous is None else \
        (run_id, f"{socket.gethostname()}-{os.getpid()}")  # several agents may share a machine
    log_dir = os.path.abspath(ns.log_dir or os.path.join(home, *parts))
    journal = os.path.abspath(ns.journal or os.path.join(log_dir, "journal.jsonl"))
    made = missing_dirs(log_dir)
    try:
        if ns.log_dir:
            writable_dir("--log-dir", log_dir)
            private_files.check_own(log_dir, "--log-dir")
        else:  # each made 0700 or refused if found planted, never followed
            os.close(private_files.make_private(home, parts, "--log-dir"))
        made += missing_dirs(os.path.dirname(journal))
        writable_file("--journal", journal)
        private_files.check_own_file(journal, "--journal")
    except UsageError:
        remove_empty_dirs(made)
        raise
    command = ("-m", ns.script, *ns.script_args) if ns.module else (ns.script, *ns.script_args)
    return _config.RunConfig(
        command=command, nproc=nproc, max_restarts=max_restarts, master_addr=ns.master_addr,
        master_port=port, run_id=run_id, log_dir=log_dir, journal_path=journal, made_dirs=made,
        hang_timeout=hang, straggler_timeout=straggler, grace=grace, injections=injections,
        streams=streams, spares=ns.spares and not no_python,
        collective_timeout=collective_timeout, rendezvous=rendezvous, recovery=recovery,
        no_python=no_python, role=ns.role, virtual_local_rank=ns.virtual_local_rank,
        signals=signals, notes=notes,
    )


def _grace(grace: str | None, shutdown_timeout: str | None) -> float:
    """``--grace``, or torchrun's name for it, ``--shutdown-timeout``."""
    if grace is not None and shutdown_timeout is not None:
        raise UsageError("--shutdown-timeout", "is torchrun's name of --grace, and both are "
                         "given", "give one of them")
    if shutdown_timeout is not None:
        return number("--shutdown-timeout", shutdown_timeout, float, 0,
                      "e.g. --shutdown-timeout 30")
    return number("--grace", grace if grace is not None else str(_config.DEFAULT_GRACE), float,
                  0, "e.g. --grace 5")


def _streams(ns: argparse.Namespace) -> TerminalStreams:
    """``--redirects``, ``--tee``, ``--local-ranks-filter`` and ``--no-tee``."""
    if ns.no_tee and ns.redirects is not None:
        raise UsageError("--no-tee", "is --redirects 3, and --redirects is given too",
                         "give one of them")
    redirects = (StreamChoice(Std.ALL) if ns.no_tee else
                 parse_choice("--redirects", ns.redirects) if ns.redirects is not None
                 else StreamChoice())
    tee = parse_choice("--tee", ns.tee) if ns.tee is not None else StreamChoice()
    ranks = (parse_ranks("--local-ranks-filter", ns.local_ranks_filter)
             if ns.local_ranks_filter else None)  # torchrun: an empty filter is no filter
    return TerminalStreams(redirects, tee, ranks)


def _check_devices(nproc: int) -> None:
    """``--virtual-local-rank``: each local rank has its device in ``CUDA_VISIBLE_DEVICES``
    (when it is set; else local rank N is device N, as in torchrun)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and nproc > len(visible.split(",")):
        raise UsageError("--virtual-local-rank", f"{nproc} local ranks, but "
                         f"CUDA_VISIBLE_DEVICES={visible} names fewer devices",
                         "lower --nproc-per-node, or name more devices")


def _recovery(text: str, max_restarts: int, max_nodes: int) -> str:
    """``--recovery``, checked against the run's other settings."""
    if text not in (_config.RESTART, _config.IN_PLACE):
        raise UsageError("--recovery", f"{text!r} is not a recovery mode",
                         f"give {_config.RESTART} or {_config.IN_PLACE}")
    if text == _config.IN_PLACE and max_restarts < 1:
        raise UsageError("--recovery", "in-place needs --max-restarts of at least 1 (each "
                         "replacement of a rank counts as one)", "e.g. --max-restarts 3")
    return text


def _nnodes(text: str) -> tuple[int, int]:
    """``--nnodes N`` or ``MIN:MAX``, as (min, max)."""
    hint = "give a number of nodes, e.g. --nnodes 2, or a range, e.g. --nnodes 2:4"
    parts = text.split(":")
    if len(parts) > 2:
        raise UsageError("--nnodes", f"{text!r} is neither N nor MIN:MAX", hint)
    low, high = (int(number("--nnodes", part, int, 1, hint, 1 << 20)) for part in
                 (parts[0], parts[-1]))
    if low > high:
        raise UsageError("--nnodes", f"{text!r}: the minimum {low} is above the maximum {high}",
                         hint)
    return low, high


# Keys of --rdzv-conf this launcher reads (whole seconds, as torch takes them), and those it
# passes on to torch's dynamic rendezvous as they are.
_TIMEOUTS = ("join_timeout", "last_call_timeout", "close_timeout", "read_timeout")
_PASSED_ON = ("keep_alive_interval", "keep_alive_max_attempt")
_ETCD_ONLY = ("protocol", "ssl_cert", "ssl_cert_key", "ca_cert")  # torch's etcd client's


def _check_backend(backend: str) -> None:
    """Raises UsageError for a ``--rdzv-backend`` rankguard does not run, on any number of
    nodes (torchrun refuses an unknown one on one node too)."""
    if backend == "etcd":
        raise UsageError("--rdzv-backend", "'etcd' is torch's older etcd rendezvous, which "
                         "rankguard does not run", "use --rdzv-backend etcd-v2 (the same etcd "
                         "server, with torch's dynamic rendezvous)")
    if backend not in ("static", "c10d", "etcd-v2"):
        raise UsageError("--rdzv-backend", f"unknown backend {backend!r}",
                         "use --rdzv-backend static, c10d or etcd-v2")


def _rendezvous(ns: argparse.Namespace, min_nodes: int,
                max_nodes: int) -> _config.RendezvousConfig:
    """The rendezvous settings of a run of several nodes.

    Raises:
        UsageError: an unknown or unsupported backend, a missing or malformed endpoint, a bad
            ``--rdzv-conf`` key or value.
    """
    backend = ns.rdzv_backend
    host, port = _endpoint(ns.rdzv_endpoint, _DEFAULT_PORTS[backend])
    values, extra = _conf(ns.rdzv_conf, backend)
    return _config.RendezvousConfig(min_nodes=min_nodes, max_nodes=max_nodes, host=host,
                                    port=port, backend=backend, local_addr=ns.local_addr,
                                    extra=tuple(extra), **values)  # type: ignore[arg-type]


def _static(ns: argparse.Namespace, min_nodes: int, max_nodes: int, node_rank: int,
            master_port: int) -> _config.RendezvousConfig:
    """The settings of a static rendezvous (torchrun's default with several nodes): a fixed
    number of nodes, each given its rank; node 0 hosts the job's store at ``--rdzv-endpoint``,
    or else at ``--master-addr:--master-port``.

    Raises:
        UsageError: a range of nodes, a node rank out of range, no port for the store, a bad
            ``--rdzv-conf``.
    """
    if min_nodes != max_nodes:
        raise UsageError("--nnodes", f"{ns.nnodes!r}: --rdzv-backend static needs a fixed "
                         "number of nodes", "give --nnodes N, or use --rdzv-backend c10d for "
                         "a range")
    if node_rank >= max_nodes:
        raise UsageError("--node-rank", f"{node_rank} is not below --nnodes {max_nodes}",
                         f"give each node a rank from 0 to {max_nodes - 1}")
    if ns.rdzv_endpoint:
        host, port = _endpoint(ns.rdzv_endpoint, _config.DEFAULT_MASTER_PORT)
    elif master_port == 0:
        raise UsageError("--master-port", "0 (or --standalone) cannot be found by the other "
                         "nodes", "give node 0's port, e.g. --master-port 29500")
    else:
        host, port = ns.master_addr, master_port
    values, _ = _conf(ns.rdzv_conf, "static")
    return _config.RendezvousConfig(
        min_nodes=max_nodes, max_nodes=max_nodes, host=host, port=port, backend="static",
        is_host=node_rank == 0, local_addr=ns.local_addr, node_rank=node_rank,
        **values)  # type: ignore[arg-type]


def _conf(text: str, backend: str) -> tuple[dict[str, object], list[tuple[str, str]]]:
    """``--rdzv-conf k=v,...`` for ``backend``: (the settings this launcher reads, the ones
    passed on to torch).

    Raises:
        UsageError: not KEY=VALUE, an unknown key for the backend, a bad value.
    """
    if backend == "static":
        passed_on: tuple[str, ...] = ()
    else:
        passed_on = _PASSED_ON + (_ETCD_ONLY if backend == "etcd-v2" else ())
    values: dict[str, object] = {}
    extra = []
    for item in filter(None, text.split(",")):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise UsageError("--rdzv-conf", f"{item!r} is not KEY=VALUE",
                             "e.g. --rdzv-conf join_timeout=60,last_call_timeout=5")
        if key in _TIMEOUTS:
            values[key] = int(number(f"--rdzv-conf {key}", value, int, 1,
                                     f"whole seconds, e.g. {key}=60", 1 << 30))
        elif key == "is_host" and backend == "c10d":
            if value.lower() not in ("1", "0", "true", "false"):
                raise UsageError("--rdzv-conf is_host", f"{value!r} is not a boolean",
                                 "use is_host=1 or is_host=0")
            values[key] = value.lower() in ("1", "true")
        elif key in _ETCD_ONLY and key in passed_on:
            extra.append((key, value))
        elif key in passed_on:
            number(f"--rdzv-conf {key}", value, int, 1, f"a whole number, e.g. {key}=5")
            extra.append((key, value))
        else:
            known = _TIMEOUTS + (("is_host",) if backend == "c10d" else ()) + passed_on
            raise UsageError("--rdzv-conf", f"unknown key {key!r} for --rdzv-backend "
                             f"{backend}", "known keys: " + ", ".join(known))
    return values, extra


_DEFAULT_PORTS = {"c10d": 29400, "etcd-v2": 2379}  # torch's, for an endpoint without one


def _endpoint(text: str, default_port: int) -> tuple[str, int]:
    """``--rdzv-endpoint HOST[:PORT]`` (``[IPv6]:PORT`` too), as (host, port)."""
    hint = "give HOST:PORT of the job's store, e.g. --rdzv-endpoint 10.0.0.1:29400"
    if not text:
        raise UsageError("--rdzv-endpoint", "is needed with several nodes", hint)
    match = _ENDPOINT.fullmatch(text)
    if match is None:
        raise UsageError("--rdzv-endpoint", f"{text!r} is not HOST:PORT", hint)
    host = match.group("v6") or match.group("host")
    port = int(match.group("port")) if match.group("port") else default_port
    if not 1 <= port <= 65535:
        raise UsageError("--rdzv-endpoint", f"{text!r}: port {port} is not from 1 to 65535", hint)
    return host, port


_ENDPOINT = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9_.-]+))"
                       r"(?::(?P<port>[0-9]{1,5}))?", re.ASCII)
