"""``rankguard run``: command-line options, torchrun's spellings included, and their checks.

Every bad input ends in one line on stderr that names the option and how to fix it, and exit
code 2, before anything is started.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import uuid

from .. import private_files
from ..errors import UsageError
from ..options import Parser, number, writable_dir
from ..inject import spec as inject_spec
from . import config as _config


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="rankguard run",
        description="Run a torch.distributed script on N local ranks, like torchrun, so that no "
        "rank fault can hang it: crashes, kills, frozen or deadlocked ranks and evictions end "
        "in a bounded, explained outcome, then a restart or the right exit code.",
        allow_abbrev=False,
    )
    p.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc", default="1",
                   help="ranks to start on this node: a number, 'cpu' (one per core) or 'auto'")
    p.add_argument("--nnodes", default="1", help="only 1 is supported for now")
    p.add_argument("--node-rank", "--node_rank", dest="node_rank", default="0",
                   help="only 0 is supported for now")
    p.add_argument("--max-restarts", "--max_restarts", dest="max_restarts", default="0",
                   help="restart the whole group up to this many times after a fault (default 0)")
    p.add_argument("--master-addr", "--master_addr", dest="master_addr", default="127.0.0.1",
                   help="address of the job's store, hosted by this launcher (default 127.0.0.1)")
    p.add_argument("--master-port", "--master_port", dest="master_port",
                   default=str(_config.DEFAULT_MASTER_PORT),
                   help="port of the job's store (default 29500; 0: any free port)")
    p.add_argument("--standalone", action="store_true",
                   help="as in torchrun: pick a free port for the store")
    p.add_argument("--run-id", "--run_id", "--rdzv-id", "--rdzv_id", dest="run_id", default="",
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
    p.add_argument("--grace", dest="grace", default=str(_config.DEFAULT_GRACE),
                   help="seconds between SIGTERM and SIGKILL when stopping ranks (default 5)")
    p.add_argument("--collective-timeout", dest="collective_timeout", default="",
                   help="deadline in seconds of every collective of every rank: one that has not "
                   "completed by then raises rankguard.CollectiveTimeout in the rank, naming the "
                   "ranks that had not arrived (default: none; the hang detector still applies)")
    p.add_argument("--inject", dest="inject", action="append", default=[], metavar="SPEC",
                   help="inject a fault, e.g. hang:rank=2,at=op30 (repeatable; see README)")
    p.add_argument("--no-tee", dest="tee", action="store_false",
                   help="write rank output only to the log dir, not to this terminal")
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


def _nproc(text: str) -> int:
    if text in ("cpu", "auto"):
        return os.cpu_count() or 1
    nproc = int(number("--nproc-per-node", text, int, 1, "give the number of ranks, e.g. 4"))
    if nproc > 1024:
        raise UsageError("--nproc-per-node", f"{nproc} ranks on one node is beyond this launcher",
                         "use at most 1024")
    return nproc


def _check_script(module: bool, script: str) -> None:
    if module:
        sys.path.insert(0, os.getcwd())
        try:
            found = importlib.util.find_spec(script) is not None
        except (ImportError, ValueError):
            found = False
        finally:
            sys.path.pop(0)
        if not found:
            raise UsageError("-m", f"no module named {script!r}",
                             "check the name and that it is importable from this folder")
        return
    if not os.path.exists(script):
        raise UsageError("SCRIPT", f"{script!r} does not exist",
                         "give the path of the training script")
    if not os.path.isfile(script):
        raise UsageError("SCRIPT", f"{script!r} is not a file", "give a Python script")


def parse(argv: list[str]) -> _config.RunConfig:
    """Turn ``rankguard run`` arguments into a :class:`RunConfig`.

    Raises:
        UsageError: any bad flag, value or path; the message names it and says how to fix it.
    """
    ns = build_parser().parse_args(argv)
    if ns.nnodes not in ("1", "1:1"):
        raise UsageError("--nnodes", f"{ns.nnodes!r}: only single-node runs are supported yet",
                         "use --nnodes 1")
    if ns.node_rank != "0":
        raise UsageError("--node-rank", f"{ns.node_rank!r}: only node 0 exists in a "
                         "single-node run", "use --node-rank 0")
    nproc = _nproc(ns.nproc)
    max_restarts = int(number("--max-restarts", ns.max_restarts, int, 0, "e.g. --max-restarts 3"))
    port = int(number("--master-port", ns.master_port, int, 0, "use a port from 1 to 65535"))
    if port > 65535:
        raise UsageError("--master-port", f"{port} is above 65535", "use a port from 1 to 65535")
    if ns.standalone:
        port = 0
    hang = number("--hang-timeout", ns.hang_timeout, float, 0.1, "e.g. --hang-timeout 10")
    straggler = number("--straggler-timeout", ns.straggler_timeout, float, 0.1,
                        "e.g. --straggler-timeout 300")
    if straggler < hang:
        raise UsageError("--straggler-timeout", f"{straggler:g} s is shorter than "
                         f"--hang-timeout {hang:g} s", "a busy rank gets at least as long as a "
                         "frozen one; raise --straggler-timeout")
    grace = number("--grace", ns.grace, float, 0, "e.g. --grace 5")
    collective_timeout = None
    if ns.collective_timeout:
        collective_timeout = number("--collective-timeout", ns.collective_timeout, float, 0.001,
                                     "e.g. --collective-timeout 60")
    injections = tuple(inject_spec.parse(text) for text in ns.inject)
    for fault in injections:
        if fault.rank >= nproc:
            raise UsageError("--inject", f"{fault.text!r} targets rank {fault.rank}, but the run "
                             f"has ranks 0 to {nproc - 1}", "pick an existing rank")
    _check_script(ns.module, ns.script)
    if not ns.master_addr.strip():
        raise UsageError("--master-addr", "is empty", "e.g. --master-addr 127.0.0.1")
    run_id = ns.run_id or f"rg-{uuid.uuid4().hex[:8]}"
    if not all(c.isalnum() or c in "-_." for c in run_id):
        raise UsageError("--run-id", f"{run_id!r} has characters other than letters, digits, "
                         "'-', '_' and '.'", "pick a simple name")
    log_dir = writable_dir("--log-dir", ns.log_dir or os.path.join(
        private_files.user_dir("--log-dir"), run_id))
    journal = os.path.abspath(ns.journal) if ns.journal else os.path.join(log_dir,
                                                                          "journal.jsonl")
    writable_dir("--journal", os.path.dirname(journal))
    command = ("-m", ns.script, *ns.script_args) if ns.module else (ns.script, *ns.script_args)
    return _config.RunConfig(
        command=command, nproc=nproc, max_restarts=max_restarts, master_addr=ns.master_addr,
        master_port=port, run_id=run_id, log_dir=log_dir, journal_path=journal,
        hang_timeout=hang, straggler_timeout=straggler, grace=grace, injections=injections,
        tee=ns.tee, spares=ns.spares, collective_timeout=collective_timeout,
    )
