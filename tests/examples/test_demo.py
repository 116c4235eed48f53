"""The README's demos: an injected hang, a verdict, a restart that resumes from the checkpoint;
the in-place recovery, whose printed checksum README quotes."""

import re
import shlex

import pytest

from ..conftest import ROOT


@pytest.mark.slow
def test_demo_recovers_from_a_hang_and_resumes_from_its_checkpoint(run_rankguard, tmp_path):
    run = run_rankguard(["--nproc-per-node", "2", "--max-restarts", "1", "--hang-timeout", "2",
                         "--inject", "hang:rank=1,at=op40", "examples/train.py", "--steps", "50",
                         "--ckpt-dir", str(tmp_path / "ckpt")], timeout=120)
    assert run.code == 0, run.stderr[-3000:]
    hang = run.event("hang_detected")
    assert hang["blamed"] == [1] and hang["op"] == "all_reduce"
    assert "[rank0]:resumed from step 30" in run.stdout
    assert "done: 50 steps on 2 ranks" in run.stdout
    assert run.outcomes(1) == {0: "ok", 1: "ok"}
    assert "fault to first step of the restarted attempt" in run.stderr
    # where each rank was, grouped: the blamed rank in the injected hang, its peer elsewhere
    assert "      rank 1: perform (rankguard/inject/perform.py:" in run.stderr, run.stderr
    assert "examples/train.py:" in run.stderr.split("      rank 0: ")[1].splitlines()[0]


def _readme_in_place_block() -> str:
    """The README's code block of the in-place recovery demo (the one that runs
    examples/train_inplace.py and quotes its checksum)."""
    blocks = (ROOT / "README.md").read_text().split("\n```")[1::2]  # inside the fences
    (block,) = [b for b in blocks if "examples/train_inplace.py" in b and "checksum" in b]
    return block.split("\n", 1)[1]  # without the fence's language


def _readme_runs(block: str) -> list[tuple[list[str], str]]:
    """Each ``$ rankguard run ...`` command of ``block`` (continued with ``\\``), as the
    launcher's arguments, with the checksum README quotes from its output."""
    runs = []
    for command, output in re.findall(r"^\$ (.*?(?:\\\n.*?)*)\n(.*?)(?=^\$ |\Z)", block,
                                      re.S | re.M):
        words = shlex.split(command.replace("\\\n", " "), comments=True)
        assert words[:2] == ["rankguard", "run"], command
        (quoted,) = re.findall(r"checksum ([0-9a-f]{16})", output)
        runs.append((words[2:], quoted))
    return runs


@pytest.mark.slow
@pytest.mark.deadline(200)
def test_the_readme_in_place_demo_prints_the_checksum_the_readme_quotes(run_rankguard):
    """README's commands run as written and print the same checksum with and without the fault,
    as README's two quoted runs do. The figure itself depends on the CPU's float kernels (the
    same torch and CPU capability printed two figures on two kinds of Xeon), so it is printed
    here, not compared with README's."""
    block = _readme_in_place_block()
    runs = _readme_runs(block)
    assert len(runs) == 2 and any("--inject" in args for args, _ in runs), block
    assert runs[0][1] == runs[1][1], runs  # README quotes one figure for both runs
    printed = []
    for args, _ in runs:
        run = run_rankguard(args, timeout=90)
        assert run.code == 0, run.stderr[-3000:]
        (checksum,) = re.findall(r"\[rank0\]:done: .* checksum ([0-9a-f]{16})", run.stdout)
        printed.append(checksum)
    print(f"checksums here: {printed} (README quotes {runs[0][1]})")
    assert printed[0] == printed[1], printed  # the fault costs no bit