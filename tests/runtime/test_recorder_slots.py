"""Which slot each recorder's group publishes to: the gloo half of a mixed group
(``cpu:gloo,cuda:nccl``) gets a slot of its own beside its NCCL half's (a table of the pure
decision), and a real gloo recorder's group is published to that slot by the sampler, or not at
all where rankguard wraps gloo and the group is not mixed (the NCCL half itself needs a GPU:
``tests/gpu/test_nccl_library_groups.py``)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rankguard.runtime.fr_progress import Recorder
from rankguard.runtime.recorder_slots import SlotChoice, slot_for

ROOT = __file__.rsplit("/tests/", 1)[0]

CHOICES = {
    "NCCL's default group: the world slot":
        (Recorder.NCCL, "0", "default_pg", False, False, SlotChoice(True, "world")),
    "NCCL's half of a mixed default group: still the world slot":
        (Recorder.NCCL, "0", "default_pg", False, True, SlotChoice(True, "world")),
    "gloo's half of a mixed default group: a slot of its own beside the world's":
        (Recorder.CPU, "0", "default_pg", False, True, SlotChoice(False, "world/gloo")),
    "gloo's half of a mixed sub-group: named after the group":
        (Recorder.CPU, "3", "undefined", False, True, SlotChoice(False, "3/gloo")),
    "the same with RANKGUARD_GLOO=recorder":
        (Recorder.CPU, "3", "undefined", True, True, SlotChoice(False, "3/gloo")),
    "a gloo group rankguard wraps: not published from the recorder (its wrapper's slot is)":
        (Recorder.CPU, "0", "default_pg", False, False, None),
    "a gloo group with RANKGUARD_GLOO=recorder: the world slot":
        (Recorder.CPU, "0", "default_pg", True, False, SlotChoice(True, "world")),
    "a gloo sub-group with RANKGUARD_GLOO=recorder: its own slot":
        (Recorder.CPU, "5", "undefined", True, False, SlotChoice(False, "5")),
    "an NCCL sub-group: its own slot":
        (Recorder.NCCL, "5", "undefined", False, False, SlotChoice(False, "5")),
}


@pytest.mark.parametrize("recorder, name, desc, gloo_watched, mixed, expected",
                         list(CHOICES.values()), ids=list(CHOICES))
def test_each_recorders_group_goes_to_its_slot(recorder, name, desc, gloo_watched, mixed,
                                               expected):
    assert slot_for(recorder, name, desc, gloo_watched=gloo_watched, mixed=mixed) == expected


# One rank, a real gloo group and its recorder, three all_reduces; the sampler told the group is
# mixed (or not) publishes it to the world/gloo slot (or nowhere): the ledger is read back (once
# torch's count shows the third completion: up to 30 s). ``again``: then the group is destroyed
# and a new default group does two all_reduces: its gloo half takes over the slot.
SCRIPT = """
import json, os, sys, time
import torch, torch.distributed as dist
from rankguard.records.ledger import LedgerReader, LedgerWriter, create, group_key
from rankguard.runtime.async_groups import MIN_TICK_S, AsyncGroupSampler, torch_members
from rankguard.runtime.fr_progress import FlightRecorderReader, Recorder, torch_groups

path, mode = sys.argv[1], sys.argv[2]
create(path, 1)
reader = FlightRecorderReader(Recorder.CPU)
mixed = lambda: {torch_groups()[dist.group.WORLD]} if mode != "wrapped" else set()
sampler = AsyncGroupSampler(LedgerWriter(path), [reader], MIN_TICK_S, False, torch_members,
                            gloo_watched=False, mixed=mixed)
for count in (3, 2) if mode == "again" else (3,):
    # a store in a file of its own: no socket to stall on a loaded machine (one did for 30 s)
    dist.init_process_group("gloo", init_method=f"file://{path}.store{count}", rank=0,
                            world_size=1)
    for _ in range(count):
        dist.all_reduce(torch.ones(1))
    deadline = time.monotonic() + 30  # torch counts a gloo completion a moment after the wait
    while (all(c.completed != count for c in reader.read().groups.values())
           and time.monotonic() < deadline):
        time.sleep(0.05)
    sampler.sample()
    dist.destroy_process_group()
groups = LedgerReader(path).read().groups
print(json.dumps([[g.key == group_key("world/gloo"), g.is_world, g.asynchronous, g.on_host,
                   g.done, g.size] for g in groups if g.asynchronous]))
"""


@pytest.mark.parametrize("mode, published", [
    ("mixed", [[True, False, True, True, 3, 1]]),
    pytest.param("wrapped", [], marks=pytest.mark.slow),  # out of the quick run (5 minutes)
    # one slot, the new group's (before: a second slot of the same name beside the old one's)
    pytest.param("again", [[True, False, True, True, 2, 1]], marks=pytest.mark.slow)])
def test_the_sampler_publishes_a_real_gloo_recorders_group_only_as_a_mixed_groups_half(
        tmp_path, mode, published):
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "ledger"), mode],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == published, done.stdout
