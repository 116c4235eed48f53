"""``rankguard flight-recorder`` and ``rankguard status`` given a real ``rankguard.Pool``'s
journal: one line saying it is a pool's and what the command works on, exit 2 (not "the run
started no attempt", nor a table of "attempt None")."""

from __future__ import annotations

from pathlib import Path

import pytest

from .test_commands import command


@pytest.fixture(scope="module")
def pool_journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import rankguard
    from tests.serving import rank_functions as rf

    folder = tmp_path_factory.mktemp("pool")
    log = folder / "pool.jsonl"
    with rankguard.Pool(1, rf.load, spares=0, timeout=30.0, journal=str(log),
                        log_dir=str(folder / "logs")) as pool:
        assert pool.run(rf.forward, 2.0) == rf.expected(2.0, 1)
    return log


@pytest.mark.deadline(120)
@pytest.mark.parametrize("name, args, works_on", [
    ("flight-recorder", [], "rankguard flight-recorder works on the runs of rankguard run"),
    ("status", [], "rankguard status shows the ranks of a run of rankguard run"),
    ("status", ["--json"], "rankguard status shows the ranks of a run of rankguard run"),
])
def test_a_pools_journal_is_named_as_such_with_exit_2(pool_journal: Path, name: str,
                                                      args: list[str], works_on: str) -> None:
    result = command(name, *args, str(pool_journal))
    assert result.returncode == 2 and result.stdout == "", result
    assert result.stderr.startswith(f"rankguard {name}: error: RUN: {pool_journal} is the "
                                    "journal of a rankguard.Pool (pool "), result.stderr
    assert works_on in result.stderr and "attempt None" not in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
