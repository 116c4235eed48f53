"""rankguard status's table, from plain views: what each rank's line says."""

from rankguard.observe.status import RankView, StatusView, render


def _line(view: RankView) -> str:
    return render(StatusView("r1", 0, False, 0, None, (view,))).splitlines()[2]


def test_a_rank_that_has_entered_nothing_yet_is_computing_after_nothing():
    line = _line(RankView(0, 42, "computing", "running", "", -1, "world", None))
    assert "computing " in line and "none" not in line and "#-1" not in line, line


def test_a_rank_after_its_last_collective_names_it():
    line = _line(RankView(0, 42, "computing", "running", "all_reduce", 7, "world", 1.0))
    assert "computing, after all_reduce #7" in line, line


def test_an_operation_whose_kind_is_not_known_yet_is_a_collective_with_its_number():
    line = _line(RankView(1, 42, "waiting", "running", "", 11, "world", 3.0))
    assert "waiting in collective #11 (world)" in line, line
    line = _line(RankView(1, 42, "computing", "running", "", 10, "world", 3.0))
    assert "computing, after collective #10" in line, line


def test_a_run_with_no_attempt_started_says_so_not_attempt_none():
    head = render(StatusView("r1", None, False, 0, None, ())).splitlines()[0]
    assert head == "run r1  no attempt started  restarts 0", head
