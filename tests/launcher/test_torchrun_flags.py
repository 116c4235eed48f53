"""Every flag of ``torchrun --help`` (the pinned torch's own parser) is taken by ``rankguard
run``, in each spelling torchrun takes, with what it means there; a flag torchrun adds later
fails ``test_the_table_covers_every_torchrun_option`` until it is decided here."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path
from typing import Callable

import pytest
from torch.distributed.run import determine_local_world_size, get_args_parser

from rankguard.errors import UsageError
from rankguard.launcher import cli, torchrun_flags
from rankguard.launcher.config import RunConfig
from rankguard.launcher.streams import StreamChoice, Std, TerminalStreams
from tests.conftest import script

SCRIPT = script("allreduce.py")
Check = Callable[[RunConfig], bool]


def _noted(flag: str) -> Check:
    return lambda config: sum(note.startswith(f"{flag} has no effect here: ")
                              for note in config.notes) == 1


# torchrun's dest -> (a value torchrun takes, or None for a switch; what it does here)
TABLE: dict[str, tuple[str | None, Check]] = {
    "nnodes": ("1", lambda c: c.rendezvous is None),
    "nproc_per_node": ("2", lambda c: c.nproc == 2),
    "rdzv_backend": ("static", lambda c: c.rendezvous is None),
    "rdzv_endpoint": ("127.0.0.1:29400", lambda c: c.rendezvous is None),  # one node: unused
    "rdzv_id": ("job7", lambda c: c.run_id == "job7"),
    "rdzv_conf": ("join_timeout=60", lambda c: c.rendezvous is None),
    "standalone": (None, lambda c: c.master_port == 0),
    "max_restarts": ("3", lambda c: c.max_restarts == 3),
    "monitor_interval": ("0.5", _noted("--monitor-interval")),
    "start_method": ("fork", _noted("--start-method")),
    "event_log_handler": ("null", _noted("--event-log-handler")),
    "role": ("trainer", lambda c: c.role == "trainer"),
    "module": (None, lambda c: c.command[:2] == ("-m", "json.tool")),
    "no_python": (None, lambda c: c.no_python and not c.spares),
    "run_path": (None, lambda c: not c.no_python and c.command[0] == SCRIPT),
    "log_dir": ("LOG_DIR", lambda c: Path(c.log_dir).name == "given-log-dir"),
    "redirects": ("3", lambda c: c.streams.redirects == StreamChoice(Std.ALL)),
    "tee": ("0:1,1:2", lambda c: c.streams.tee.of(0) == Std.OUT and c.streams.tee.of(1) == Std.ERR),
    "local_ranks_filter": ("0", lambda c: c.streams.local_ranks == frozenset({0})),
    "duplicate_stdout_filters": ("apple,orange", _noted("--duplicate-stdout-filters")),
    "duplicate_stderr_filters": ("apple", _noted("--duplicate-stderr-filters")),
    "node_rank": ("0", lambda c: c.rendezvous is None),
    "master_addr": ("127.0.0.1", lambda c: c.master_addr == "127.0.0.1"),
    "master_port": ("29511", lambda c: c.master_port == 29511),
    "local_addr": ("127.0.0.1", lambda c: c.rendezvous is None),  # one node: no rendezvous
    "logs_specs": ("my_specs", _noted("--logs-specs")),
    "numa_binding": ("node", _noted("--numa-binding")),
    "signals_to_handle": ("SIGTERM,SIGUSR1", lambda c: c.signals == (signal.SIGTERM,
                                                                     signal.SIGUSR1)),
    "shutdown_timeout": ("30", lambda c: c.grace == 30),
    "virtual_local_rank": (None, lambda c: c.virtual_local_rank),
}


def _torchrun_options() -> list[tuple[str, str]]:
    """(option string, dest) of every option of ``torchrun --help``, every spelling."""
    return [(flag, action.dest) for action in get_args_parser()._actions
            for flag in action.option_strings if action.dest != "help"]


def test_the_table_covers_every_torchrun_option() -> None:
    dests = {dest for _, dest in _torchrun_options()}
    assert dests - TABLE.keys() == set(), "torchrun has options this table does not decide"
    assert TABLE.keys() - dests == set(), "the table names options torchrun no longer has"


def _value(dest: str, tmp_path: Path) -> str | None:
    value, _ = TABLE[dest]
    return str(tmp_path / "given-log-dir") if value == "LOG_DIR" else value


def _target(dest: str) -> list[str]:
    """What the run starts: a module for -m, an executable for --no-python."""
    target = {"module": ["json.tool"], "no_python": [shutil.which("true") or "/bin/true"]}
    return target.get(dest, [SCRIPT])


def _argv(flag: str, dest: str, tmp_path: Path) -> list[str]:
    value = _value(dest, tmp_path)
    return ([flag] if value is None else [flag, value]) + _target(dest)


@pytest.mark.parametrize("flag, dest", _torchrun_options())
def test_rankguard_run_takes_each_torchrun_option_with_its_meaning(flag: str, dest: str,
                                                                    tmp_path: Path,
                                                                    monkeypatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    argv = _argv(flag, dest, tmp_path)
    get_args_parser().parse_args(argv)  # the table's value is one torchrun takes
    log_dir = [] if dest == "log_dir" else ["--log-dir", str(tmp_path / "logs")]
    config = cli.parse([*log_dir, *argv])
    assert TABLE[dest][1](config), (argv, config)


@pytest.mark.parametrize("value", ["cpu", "gpu", "xpu", "auto", "3"])
def test_nproc_per_node_counts_ranks_as_torchrun_does(value: str, tmp_path: Path) -> None:
    try:
        expected = determine_local_world_size(value)
    except ValueError:  # no such device here: torchrun fails, rankguard says so in one line
        with pytest.raises(UsageError, match=f"--nproc-per-node: {value}: no .* device is "
                           "available here"):
            cli.parse(["--log-dir", str(tmp_path), "--nproc-per-node", value, SCRIPT])
        return
    config = cli.parse(["--log-dir", str(tmp_path), "--nproc-per-node", value, SCRIPT])
    assert config.nproc == expected


def _torchrun_env_dests() -> list[str]:
    """The options torchrun also reads from ``PET_<DEST>``."""
    return sorted(action.dest for action in get_args_parser()._actions
                  if type(action).__name__ in ("env", "check_env"))


def test_rankguard_reads_the_environment_variables_torchrun_reads() -> None:
    assert sorted(torchrun_flags.TORCHRUN_ENV) == _torchrun_env_dests()


@pytest.mark.parametrize("dest", _torchrun_env_dests())
def test_a_pet_variable_gives_its_option_as_in_torchrun(dest: str, tmp_path: Path,
                                                        monkeypatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    value = _value(dest, tmp_path)
    monkeypatch.setenv(f"PET_{dest.upper()}", "1" if value is None else value)
    read = getattr(get_args_parser().parse_args(_target(dest)), dest)  # torchrun reads it too
    assert (read is True if value is None else
            (",".join(read) if isinstance(read, list) else str(read)) == value), read
    log_dir = [] if dest == "log_dir" else ["--log-dir", str(tmp_path / "logs")]
    config = cli.parse([*log_dir, *_target(dest)])
    assert TABLE[dest][1](config), (dest, config)


def test_the_command_line_wins_over_a_pet_variable(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PET_NPROC_PER_NODE", "3")
    assert cli.parse(["--log-dir", str(tmp_path), SCRIPT]).nproc == 3
    assert cli.parse(["--log-dir", str(tmp_path), "--nproc_per_node", "2", SCRIPT]).nproc == 2


def test_a_flag_without_effect_is_said_once_and_others_say_nothing(tmp_path: Path) -> None:
    config = cli.parse(["--log-dir", str(tmp_path), "--monitor-interval", "1",
                        "--monitor_interval", "2", "--role", "x", SCRIPT])
    assert config.notes == ("--monitor-interval has no effect here: rankguard sees rank exits "
                            "and output as events, with no polling interval, and judges hangs "
                            "by --hang-timeout",)
    assert cli.parse(["--log-dir", str(tmp_path), SCRIPT]).notes == ()


def test_run_path_takes_precedence_over_no_python_and_says_so(tmp_path: Path) -> None:
    config = cli.parse(["--log-dir", str(tmp_path), "--no-python", "--run-path", SCRIPT])
    assert not config.no_python
    assert config.notes == ("--no-python has no effect with --run-path, which takes precedence "
                            "(as in torchrun): the script runs in the rank's Python "
                            "interpreter",)


A, O, E, N = Std.ALL, Std.OUT, Std.ERR, Std.NONE


@pytest.mark.parametrize("case, streams, shown", [
    ("by default every stream of every local rank is shown",
     TerminalStreams(), [A, A, A]),
    ("--redirects 3 keeps every stream off the terminal",
     TerminalStreams(redirects=StreamChoice(A)), [N, N, N]),
    ("--redirects 1 keeps stdout off, stderr still shows",
     TerminalStreams(redirects=StreamChoice(O)), [E, E, E]),
    ("a redirect per local rank touches only the ranks it names",
     TerminalStreams(redirects=StreamChoice(ranks=((1, A), (2, E)))), [A, N, O]),
    ("a teed stream shows even though it is redirected",
     TerminalStreams(redirects=StreamChoice(A), tee=StreamChoice(ranks=((0, O),))), [O, N, N]),
    ("--tee alone changes nothing on the terminal: those streams showed already",
     TerminalStreams(tee=StreamChoice(E)), [A, A, A]),
    ("--local-ranks-filter shows only the ranks it names",
     TerminalStreams(local_ranks=frozenset({0, 2})), [A, N, A]),
    ("the filter also hides a teed stream of another rank (torchrun's rule)",
     TerminalStreams(tee=StreamChoice(A), local_ranks=frozenset({1})), [N, A, N]),
    ("the filter and a redirect together: a shown rank keeps only what is not redirected",
     TerminalStreams(redirects=StreamChoice(O), local_ranks=frozenset({0})), [E, N, N]),
])
def test_what_the_terminal_shows_of_each_local_rank(case: str, streams: TerminalStreams,
                                                     shown: list[Std]) -> None:
    assert [streams.shown(rank) for rank in range(3)] == shown, case
