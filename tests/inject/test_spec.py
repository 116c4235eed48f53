"""The --inject grammar: what parses, and the message for what does not."""

import pytest

from rankguard.errors import UsageError
from rankguard.inject.spec import decode, encode, parse


def test_spec_with_op_moment_parses_kind_rank_and_op():
    spec = parse("hang:rank=2,at=op30")
    assert (spec.kind, spec.rank, spec.at, spec.op, spec.attempt) == ("hang", 2, "op", 30, 0)


def test_spec_with_step_moment_parses_the_step():
    spec = parse("kill:rank=1,at=step0")
    assert (spec.kind, spec.rank, spec.at, spec.op) == ("kill", 1, "step", 0)
    assert parse("raise:rank=0,at=step12").op == 12


def test_spec_with_argument_time_and_any_attempt_parses():
    spec = parse("slow:2.5:rank=0,at=1.5s,attempt=any")
    assert (spec.arg, spec.at, spec.seconds, spec.attempt) == (2.5, "time", 1.5, None)
    assert spec.applies_to(0, 7) and not spec.applies_to(1, 0)


def test_crash_code_and_init_moment_parse():
    spec = parse("crash:7:rank=1,at=init")
    assert (spec.arg, spec.at) == (7, "init")


def test_encode_decode_round_trip():
    specs = [parse("kill:rank=1,at=op3"), parse("gil:rank=0,at=start")]
    assert decode(encode(specs)) == specs


@pytest.mark.parametrize("text, fragment", [
    ("explode:rank=1,at=op3", "unknown kind 'explode'"),
    ("hang:rank=1", "both rank= and at= are required"),
    ("hang:rank=x,at=op3", "not a rank number"),
    ("hang:rank=1,at=later", "not start, init, opN"),
    ("hang:rank=1,at=op0", "counted from op1"),
    ("slow:rank=1,at=op3", "needs SECONDS"),
    ("kill:3:rank=1,at=op3", "takes no argument"),
    ("crash:300:rank=1,at=op3", "exit code '300' is above 255"),
    ("crash:0:rank=1,at=op3", "exit code '0' is below 1"),
    ("crash:nan:rank=1,at=op3", "exit code 'nan' is not a finite number"),
    ("crash:inf:rank=1,at=op3", "exit code 'inf' is not a finite number"),
    ("crash:2.0:rank=1,at=op3", "exit code '2.0' is not an integer"),
    ("slow:nan:rank=1,at=op3", "seconds 'nan' is not a finite number"),
    ("slow:-1:rank=1,at=op3", "seconds '-1' is below 0"),
    ("gil:1e300:rank=1,at=op3", "seconds '1e300' is above 1000000000"),
    ("slow:1_0:rank=1,at=op3", "seconds '1_0' is not a number"),
    ("hang:rank=1,at=1e3s", "is not start, init, opN, stepN or a time"),
    ("hang:rank=1,at=99999999999.5s", "time '99999999999.5' is above"),
    ("hang:rank=١,at=op3", "rank='١' is not a rank number"),
    ("hang:rank=1,at=op٣", "is not start, init, opN"),
    ("hang:rank=1,at=step-1", "is not start, init, opN, stepN"),
    ("hang:rank=1,at=step", "is not start, init, opN, stepN"),
    ("hang:rank=1,at=op3,attempt=²", "attempt='²' is not a number or 'any'"),
    ("hang:rank=1,at=op3,at=op4", "option at= is given twice"),
    ("hang:rank=" + "9" * 5000 + ",at=op3", "is far too long"),
    ("hang:rank=1,at=op3,when=now", "is not rank=, at= or attempt="),
    ("hang:rank=1,at=op3,attempt=two", "not a number or 'any'"),
])
def test_bad_spec_is_rejected_with_a_message_naming_the_problem(text, fragment):
    with pytest.raises(UsageError) as info:
        parse(text)
    assert fragment in str(info.value)
    assert str(info.value).startswith("--inject:")


def test_a_caller_that_performs_the_fault_at_its_own_moment_refuses_at():
    # the serving example's request fault: an at= there would be silently not kept to
    assert parse("kill:rank=1", what="fault", moment="now").rank == 1
    with pytest.raises(UsageError) as caught:
        parse("kill:rank=1,at=op1", what="fault", moment="now")
    assert str(caught.value) == ("fault: at=op1 is not taken here (the caller performs the fault "
                                 "now) in 'kill:rank=1,at=op1' (write KIND[:ARG]:rank=R, e.g. "
                                 "stop:rank=1)")


@pytest.mark.parametrize("attempt", ["0", "1", "any"])
def test_a_caller_that_performs_the_fault_at_its_own_moment_refuses_attempt(attempt):
    # a serve request has no attempts: attempt= there would be silently ignored
    text = f"kill:rank=1,attempt={attempt}"
    with pytest.raises(UsageError) as caught:
        parse(text, what="fault", moment="now")
    assert str(caught.value) == (f"fault: attempt={attempt} is not taken here (the caller "
                                 f"performs the fault now) in {text!r} (write KIND[:ARG]:rank=R, "
                                 f"e.g. stop:rank=1)")
