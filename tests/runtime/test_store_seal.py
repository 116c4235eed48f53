"""Another process that reaches a job's store cannot make its ranks act: notices, probes,
answers, regroup memberships and shutdown arrivals it writes are ignored; the same messages
sealed with the run's secret are honoured (which proves the forgeries were aimed right).

The outsider is this test process: a plain TCPStore client of the ranks' store, which finds
where rankguard's keys live the way any client can (``list_keys``).
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from rankguard.store import sealed
from rankguard.runtime import probe

from .ranks import Ranks

SECRET = "6f" * 32  # the secret a host hands its ranks, in the tests that play the host


_DEFAULT_PG = "0//cpu//"  # in gloo's rendezvous keys of the default group (group 0, cpu)


def prefixes(client: Any) -> tuple[str, str]:
    """Where rankguard's keys live in a store, found from the keys of the default group's gloo
    rendezvous as any client can list them: (the default store's prefix, where generations and
    shutdown keys live; its backend store's prefix, where the probe queues live)."""
    keys = [k for k in client.list_keys() if _DEFAULT_PG in k]
    assert keys, f"no gloo rendezvous key of the default group in {client.list_keys()}"
    at = keys[0].index(_DEFAULT_PG)
    return keys[0][:at + len("0//")], keys[0][:at + len(_DEFAULT_PG)]


class Outsider:
    """A client of the ranks' store that is not one of the ranks."""

    def __init__(self, ranks: Ranks) -> None:
        from torch.distributed import TCPStore

        addr, port = json.loads(ranks.text("store_0"))
        self.ranks = ranks
        self.client = TCPStore(addr, port, is_master=False, timeout=timedelta(seconds=10))

    def probe_prefix(self) -> str:
        return prefixes(self.client)[1]

    def root_prefix(self) -> str:
        return prefixes(self.client)[0]

    def done(self, what: str = "written") -> None:
        (self.ranks.folder / what).write_text("")


def _message(fields: dict[str, Any], queue: str, secret: str | None) -> str:
    """A probe message as a rank would read it: plain JSON, or sealed with ``secret``."""
    text = json.dumps(fields)
    return sealed.seal(queue, text) if secret else text


@pytest.mark.parametrize("launcher", ["plain", pytest.param("torchrun", marks=pytest.mark.slow),
                                      pytest.param("rankguard", marks=pytest.mark.slow)])
def test_forged_notice_probe_and_stop_are_ignored_and_the_next_collective_succeeds(
        tmp_path: Path, launcher: str) -> None:
    # plain: no host, the ranks agree on a secret over gloo; torchrun: the same under torchrun;
    # rankguard: the launcher's secret
    with Ranks("outsider_writes", 2, tmp_path, launcher=launcher,
               env={"SCENARIO_DROPS": "3"}) as ranks:
        ranks.pid(0)
        ranks.pid(1)
        outsider = Outsider(ranks)
        prefix = outsider.probe_prefix()
        for rank in (0, 1):
            queue = f"rankguard/probe/g0/{rank}"
            for fields in ({"id": f"forged-{rank}", "group": "world", "notice": None},
                           {"id": f"forged-n{rank}", "group": "world",
                            "notice": {"by": 1 - rank, "reason": "forged by an outsider"}},
                           {"stop": True}):
                outsider.client.queue_push(prefix + queue, _message(fields, queue, None))
        outsider.done()
        results = [ranks.result(0), ranks.result(1)]
        answered = [outsider.client.check([f"{prefix}rankguard/answer/forged-{r}/{r}"])
                    for r in (0, 1)]
        outsider.done("checked")
    for result in results:
        assert result["retired"] is None, result  # the forged notice did not retire the group
        assert result["ok"] and result["value"] == 2.0, result
        assert result["serving"], result  # the forged stop did not stop the responder
        assert result["dropped"] >= 3, result
    assert answered == [False, False]  # the forged probe got no answer


@pytest.mark.slow  # out of the quick run (its 5 minutes)
def test_a_notice_sealed_with_the_runs_secret_is_honoured(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(sealed.ENV, SECRET)  # this test is the host: ranks inherit its secret
    with Ranks("outsider_writes", 2, tmp_path, env={"SCENARIO_DROPS": "1"}) as ranks:
        ranks.pid(0)
        ranks.pid(1)
        outsider = Outsider(ranks)
        prefix = outsider.probe_prefix()
        queue = "rankguard/probe/g0/1"
        notice = {"by": 0, "reason": "sealed by the host"}
        outsider.client.queue_push(prefix + queue, _message(
            {"id": "host-1", "group": "world", "notice": notice}, queue, SECRET))
        outsider.done()
        result = ranks.result(1)
        answer_key = "rankguard/answer/host-1/1"
        answer = sealed.unseal(answer_key, outsider.client.get(prefix + answer_key))
        outsider.done("checked")
    assert result["retired"] == "sealed by the host", result
    assert not result["ok"] and result["type"] == "GroupRetired", result
    assert answer is not None and json.loads(answer)["op"] == "all_reduce"


@pytest.mark.parametrize("secret", [None, pytest.param(SECRET, marks=pytest.mark.slow)],
                         ids=["forged", "sealed"])  # sealed: out of the quick run (5 minutes)
def test_a_membership_written_by_an_outsider_is_not_adopted_by_regroup(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, secret: str | None) -> None:
    if secret:
        monkeypatch.setenv(sealed.ENV, secret)
    with Ranks("outsider_regroup", 2, tmp_path) as ranks:
        ranks.pid(0)
        ranks.pid(1)
        outsider = Outsider(ranks)
        key = "rankguard/gen1/members"
        value = sealed.seal(key, "[0]") if secret else "[0]"
        outsider.client.set(outsider.root_prefix() + key, value)
        outsider.done()
        results = [ranks.result(0), ranks.result(1)]
    if secret:  # sanity: the key was the right one, and a sealed membership is adopted
        assert results[0]["ok"] and results[0]["members"] == [0], results
        assert not results[1]["ok"] and results[1]["type"] == "GroupRetired", results
        return
    for result in results:
        assert result["ok"] and result["members"] == [0, 1] and result["value"] == 2.0, result
    assert sum(result["dropped"] for result in results) >= 1, results  # read, then replaced


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_an_arrival_written_by_an_outsider_does_not_complete_the_shutdown_barrier(
        tmp_path: Path) -> None:
    with Ranks("outsider_shutdown", 2, tmp_path) as ranks:
        ranks.pid(0)
        ranks.pid(1)
        outsider = Outsider(ranks)
        root = outsider.root_prefix()
        for call in ("0", "g0/0"):  # the barrier's keys, named as a client sees them
            outsider.client.set(f"{root}rankguard/shutdown/{call}/1", "1")
            outsider.client.add(f"{root}rankguard/shutdown/{call}/count", 1)
        outsider.done()
        result = ranks.result(0)
    assert not result["clean"] and result["missing"] == [1], result
    assert result["dropped"] >= 1, result


def test_a_forged_answer_is_not_taken_for_the_peers(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.distributed import TCPStore

    monkeypatch.setenv(sealed.ENV, SECRET)
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    outsider = TCPStore("127.0.0.1", server.port, is_master=False)
    asker = probe.Asker(server)
    # request ids are the asker's pid and a counter: an outsider can write answers ahead
    forged = json.dumps({"entered": 99, "done": 99, "op": "all_reduce", "world": True,
                         "retired": None})
    for n in range(1, 200):
        outsider.set(f"rankguard/answer/{os.getpid()}-{n}/1", forged)
    assert asker.ask("world", [1], window=0.2) == {1: None}  # rank 1 never answered
