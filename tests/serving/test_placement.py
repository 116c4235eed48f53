"""Where a pool's replicas run (``serving.placement``), as tables: each slot's devices and
backend from the options, the options refused with the fix, the environment a rank gets,
``--devices`` read, and which slot a new replica takes. No processes, no GPU."""

from __future__ import annotations

from typing import Any

import pytest

from rankguard.errors import UsageError
from rankguard.serving.placement import (BACKEND_ENV, CLI_NAMES, DEVICE_ENV, HOSTID_ENV,
                                         Backend, ReplicaPlacement, free_slot, parse_devices,
                                         place)

# (devices, gpus_per_replica, world_size, replicas, spares, visible) -> each slot's devices
PLACED = {
    "no device option: every rank of every slot on the CPU": (
        (None, None, 2, 1, 1, None), [("cpu", "cpu"), ("cpu", "cpu")]),
    "no device option ignores the visible devices": (
        (None, None, 1, 2, 0, 8), [("cpu",), ("cpu",)]),
    "a flat list places rank r of every replica on devices[r]": (
        ([0, 1], None, 2, 1, 1, 2), [("cuda:0", "cuda:1"), ("cuda:0", "cuda:1")]),
    "a flat list may put every rank on one device": (
        ([0, 0], None, 2, 1, 0, 1), [("cuda:0", "cuda:0")]),
    "one list per replica, spares included, places each slot": (
        ([[0, 1], [2, 3]], None, 2, 1, 1, 4), [("cuda:0", "cuda:1"), ("cuda:2", "cuda:3")]),
    "tuples are taken as lists": (
        ((1,), None, 1, 1, 0, 2), [("cuda:1",)]),
    "gpus_per_replica gives each slot devices of its own, in order": (
        (None, 2, 2, 1, 1, 4), [("cuda:0", "cuda:1"), ("cuda:2", "cuda:3")]),
    "gpus_per_replica below world_size puts neighbouring ranks on one device": (
        (None, 2, 4, 1, 0, 2), [("cuda:0", "cuda:0", "cuda:1", "cuda:1")]),
    "one gpu per replica puts all its ranks on it": (
        (None, 1, 2, 2, 1, 3), [("cuda:0", "cuda:0"), ("cuda:1", "cuda:1"),
                                ("cuda:2", "cuda:2")]),
}


@pytest.mark.parametrize("case", PLACED.values(), ids=PLACED.keys())
def test_place(case: tuple[tuple[Any, ...], list[tuple[str, ...]]]) -> None:
    given, expected = case
    placed = place(*given)
    assert [slot.devices for slot in placed] == expected
    on_gpu = given[0] is not None or given[1] is not None
    assert {slot.backend for slot in placed} == {Backend.NCCL if on_gpu else Backend.GLOO}


# (devices, gpus_per_replica, world_size, replicas, spares, visible) -> what the error says
REFUSED = {
    "both options given": (
        ([0, 1], 2, 2, 1, 0, 2), "Pool(devices) and Pool(gpus_per_replica): both were given"),
    "a device list of the wrong length": (
        ([0, 1, 2], None, 2, 1, 0, 4), "Pool(devices): 3 device(s) [0, 1, 2] for 2 rank(s)"),
    "an empty device list": (([], None, 2, 1, 0, 4), "expected a list of CUDA device indexes"),
    "a string instead of a list": (("0,1", None, 2, 1, 0, 4),
                                   "Pool(devices): expected a list of CUDA device indexes"),
    "a negative device index": (([0, -1], None, 2, 1, 0, 4),
                                "Pool(devices): expected a CUDA device index (a whole number "
                                ">= 0), got -1"),
    "a device index that is not an int": (([0, 1.0], None, 2, 1, 0, 4), "got 1.0"),
    "a bool as a device index": (([0, True], None, 2, 1, 0, 4), "got True"),
    "a device index out of range of the visible devices": (
        ([0, 2], None, 2, 1, 0, 2), "Pool(devices): device 2 is out of range: 2 CUDA "
        "device(s) are visible (0 to 1)"),
    "a device asked for where none is visible says so, with no count to stay below": (
        ([0], None, 1, 1, 0, 0), "Pool(devices): device 0 was asked for, and no CUDA device is "
        "visible (leave out Pool(devices) to run on the CPU (gloo), or run where "
        "CUDA_VISIBLE_DEVICES names a device)"),
    # the value's shape is checked whole before any index meets the visible devices
    "a list of the wrong length is named before a device that is not visible": (
        ([[0, 1], [0, 1, 2]], None, 2, 1, 1, 0), "Pool(devices): 3 device(s) [0, 1, 2] for 2 "
        "rank(s) per replica"),
    "a list where an index should be is named before a device that is not visible": (
        ([[0, [1]]], None, 2, 1, 0, 0), "Pool(devices): expected a CUDA device index (a whole "
        "number >= 0), got [1]"),
    "a bad index is named before a smaller device that is out of range": (
        ([5, -1], None, 2, 1, 0, 2), "got -1"),
    "fewer device lists than replicas and spares": (
        ([[0, 1], [2, 3]], None, 2, 2, 1, 8), "Pool(devices): 2 device lists for 3 replicas "
        "(2 serving and 1 spare(s))"),
    "a per-replica list of the wrong length": (
        ([[0, 1], [2]], None, 2, 1, 1, 4), "1 device(s) [2] for 2 rank(s) per replica"),
    "indexes and lists mixed": (([0, [1]], None, 1, 1, 1, 4), "mixes device indexes and lists"),
    "gpus_per_replica that is not a whole number": (
        (None, "2", 2, 1, 0, 4), "Pool(gpus_per_replica): expected a count of CUDA devices"),
    "gpus_per_replica of zero": ((None, 0, 2, 1, 0, 4), "got 0"),
    "gpus_per_replica above the ranks per replica": (
        (None, 3, 2, 1, 0, 8), "3 devices for 2 rank(s) per replica"),
    "more devices needed than visible": (
        (None, 2, 2, 1, 1, 3), "2 per replica x 2 replicas (1 serving and 1 spare(s)) is 4 "
        "CUDA devices, and 3 CUDA device(s) are visible (0 to 2) (give fewer spares or "
        "replicas, or share devices on purpose with Pool(devices))"),
}


@pytest.mark.parametrize("case", REFUSED.values(), ids=REFUSED.keys())
def test_place_refuses(case: tuple[tuple[Any, ...], str]) -> None:
    given, message = case
    with pytest.raises(UsageError) as caught:
        place(*given)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_the_cli_names_its_flags_in_the_errors() -> None:
    with pytest.raises(UsageError, match=r"^--gpus-per-replica: 1 per replica x 2 replicas .* "
                       r"with --devices\)$"):
        place(None, 1, 1, 1, 1, 1, CLI_NAMES)


def test_the_cli_spells_its_examples_as_the_flag_takes_them() -> None:
    # a CLI user writes --devices 0,1 or 0,1/2,3, not Python lists
    with pytest.raises(UsageError) as caught:
        place(parse_devices("0,1,2"), None, 2, 1, 0, 4, CLI_NAMES)
    assert str(caught.value).endswith("(give one CUDA device index per rank, e.g. 0,1, or one "
                                      "such list per replica, spares included, e.g. 0,1/2,3)")
    with pytest.raises(UsageError) as caught:
        place([0, 1, 2], None, 2, 1, 0, 4)
    assert "e.g. [0, 1], " in str(caught.value) and "e.g. [[0, 1], [2, 3]])" in str(caught.value)


# (placement, rank) -> the rank's environment
RANK_ENV = {
    "a CPU rank runs gloo on the cpu": (
        (ReplicaPlacement(2), 1), {DEVICE_ENV: "cpu", BACKEND_ENV: "gloo"}),
    "a rank alone on its device gets no host id": (
        (ReplicaPlacement(2, (0, 1)), 1), {DEVICE_ENV: "cuda:1", BACKEND_ENV: "nccl"}),
    "ranks that share a device are each a host of their own": (
        (ReplicaPlacement(2, (0, 0)), 1), {DEVICE_ENV: "cuda:0", BACKEND_ENV: "nccl",
                                           HOSTID_ENV: "host1"}),
    "when two ranks share, every rank of the replica gets a host id": (
        (ReplicaPlacement(3, (0, 0, 1)), 2), {DEVICE_ENV: "cuda:1", BACKEND_ENV: "nccl",
                                              HOSTID_ENV: "host2"}),
}


@pytest.mark.parametrize("case", RANK_ENV.values(), ids=RANK_ENV.keys())
def test_rank_env(case: tuple[tuple[ReplicaPlacement, int], dict[str, str]]) -> None:
    (placement, rank), env = case
    assert placement.rank_env(rank) == env


# --devices text -> what place() is given
PARSED = {
    "indexes separated by commas: one per rank, every replica": ("0,1", [0, 1]),
    "one index": ("3", [3]),
    "spaces around an index are allowed": ("0, 1", [0, 1]),
    "lists separated by slashes: one per replica": ("0,1/2,3", [[0, 1], [2, 3]]),
    "a negative index is read, for place() to refuse": ("-1", [-1]),
}


@pytest.mark.parametrize("case", PARSED.values(), ids=PARSED.keys())
def test_parse_devices(case: tuple[str, list[Any]]) -> None:
    text, devices = case
    assert parse_devices(text) == devices


@pytest.mark.parametrize("text", ["a,b", "0,,1", "", "0;1", "cuda:0", "1.5", "--1", "٣"])
def test_parse_devices_refuses_what_is_not_indexes(text: str) -> None:
    with pytest.raises(UsageError, match=r"^--devices: .* is not a CUDA device index"):
        parse_devices(text)


# (slots held, slots) -> the slot a new replica takes
SLOTS = {
    "the first replica takes slot 0": ((set(), 2), 0),
    "a replacement takes the lowest free slot": (({0, 2}, 3), 1),
    "no slot when every slot is held": (({0, 1}, 2), None),
}


@pytest.mark.parametrize("case", SLOTS.values(), ids=SLOTS.keys())
def test_free_slot(case: tuple[tuple[set[int], int], int | None]) -> None:
    (taken, slots), slot = case
    assert free_slot(taken, slots) == slot
