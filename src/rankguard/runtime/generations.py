"""Generations: after a fault, the surviving ranks form a new process group without restarting.

A process group that saw a fault is retired, never reused. ``rankguard.regroup()`` forms the next
**generation** from the ranks that are still healthy, on a fresh namespace of the same store
(``rankguard/gen<N>/``), so no key of an earlier generation can meet a later one:

1. **membership**: the first survivor to get here proposes the members, the current ranks minus
   the ones known to have failed (the ``missing`` ranks of the last collective error, and the
   peers that do not answer a probe; or the ``exclude`` argument); the store's compare-and-set
   makes that proposal the one every survivor adopts. A rank left out of it learns so and gets
   :class:`rankguard.GroupRetired`.
2. **join**: every member marks its arrival under its own key; all must be in within the
   timeout, or the ones that are not are named (:class:`rankguard.CollectiveTimeout`). The
   outcome (formed, or failed for want of whom) is decided once in the store; a generation
   that failed is never formed later (a rank that comes to it takes the next number), so no
   rank connects to a member that gave up on it.
3. **new group**: the old groups are discarded (their backends are never destructed, see
   ``runtime.groups``) and the default group is created again, ranks numbered in the order of
   their old ranks. ``RANK`` and ``WORLD_SIZE`` in the environment follow.

With ``keep_size=True`` every survivor keeps its rank and each failed rank's place stays vacant
for a replacement process, which joins in step 2 beside the survivors (see ``vacancies``): the
generation forms once every place is filled, or not at all. A place is vacant only for a rank
that did not answer: one that the last error names as behind (it answered) is alive, and is
kept.

The proposal and the arrivals are sealed with the run's secret (``rankguard.sealed``): a
membership or an arrival that another process wrote into the store is never adopted (a forged
proposal found in place is replaced by compare-and-set).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, TypeVar

from ..deadline import Deadline, check_seconds
from ..errors import CollectiveTimeout, GroupRetired, PeerFailed, UsageError, first_line, shown
from ..margins import (ANSWER_WINDOW_S, CONNECT_CAP_S, CONNECT_FLOOR_S, NCCL_ABORT_S,
                       REGROUP_S, second_ask_window)
from . import async_deadline, backend_connect, barrier, generation_keys, groups, nccl_abort
from . import vacancies
from .bounded import NO_ANSWER
from .probe import Asker, clone_client
from .state import WORLD, current
from ..store.store_calls import StoreStalled, within

STORE_ALLOWANCE_S = 0.5  # a barrier's last reads, after the deadline, of who arrived
T = TypeVar("T")


@dataclass(frozen=True)
class Generation:
    """The process group a rank belongs to after ``regroup()``.

    Attributes:
        number: the generation (0 is the group the job started with).
        rank: this rank's number in it.
        world_size: how many ranks it has.
        previous_rank: this rank's number in the previous generation.
        members: the previous-generation ranks that form it, in new-rank order; None for a place
            a replacement filled (``keep_size``).
        took: seconds ``regroup()`` took.
    """

    number: int
    rank: int
    world_size: int
    previous_rank: int
    members: list[int | None]
    took: float

    @property
    def replaced(self) -> list[int]:
        """The places (ranks) that a replacement process filled."""
        return [place for place, member in enumerate(self.members) if member is None]


def root_store() -> Any:
    """The store of generation 0, under which every generation keeps its keys (the default
    group must exist)."""
    from torch.distributed import distributed_c10d as c10d

    state = current()
    return state.lineage_root if state.lineage_root is not None else c10d._get_default_store()


def store_client(limit: Deadline) -> Any:
    """This process's own connection to :func:`root_store`, made once (each new connection
    costs a reverse DNS lookup in torch that can stall 5 s, see ``probe.Responder``), its
    operations bounded by ``limit`` (at least ``barrier.STORE_OP_MIN_S``)."""
    state = current()
    state.lineage_root = root_store()
    timeout = timedelta(seconds=limit.wait_time(at_least=barrier.STORE_OP_MIN_S))
    if state.lineage_client is None:
        state.lineage_client = clone_client(state.lineage_root, timeout) or state.lineage_root
    state.lineage_client.set_timeout(timeout)
    return state.lineage_client


def with_store_client(limit: Deadline, what: str, calls: Callable[[Any], T]) -> T:
    """``calls(client)`` on this process's :func:`store_client`, bounded by ``limit`` plus
    ``STORE_ALLOWANCE_S`` (for reads of who arrived once ``limit`` passed) whatever state the
    store is in (see ``store_calls``).

    Raises:
        StoreStalled: the store did not answer in time; the connection is dropped (the next
            call makes a new one).
        RuntimeError: torch's, when the store failed (its server is gone).
    """
    try:
        return within(limit.later(STORE_ALLOWANCE_S), what,
                      lambda: calls(store_client(limit)))
    except StoreStalled:
        current().lineage_client = None  # stuck in a call: never used again
        raise


def next_number() -> int:
    """The number the next ``regroup()`` will give its generation."""
    return current().generation + 1


def regroup(*, timeout: float = REGROUP_S, exclude: Iterable[int] | None = None,
            keep_size: bool = False) -> Generation:
    """Form the next generation of the default process group from the surviving ranks.

    Every surviving rank calls it (typically after catching a ``rankguard.CollectiveError``).
    The new group has the old one's backend (gloo, or NCCL: its communicator aborted by the
    error is destroyed). Returns within ``timeout`` (plus half a second for the last reads of
    who joined); the backend's connect of the members takes what is left of it, at least
    ``margins.CONNECT_FLOOR_S`` (5 s) and at most ``margins.CONNECT_CAP_S`` (10 s: every
    member arrived), plus half a second for gloo's own error (a connect
    still going then is abandoned on a thread of its own, see ``backend_connect``).

    Args:
        timeout: seconds to wait for every member to join.
        exclude: ranks (current numbering) to leave out; default: the ranks that the last
            collective error of this rank named as missing, and the peers that answer neither
            a probe within half a second nor a second one within half of what is left of
            ``timeout`` (at least 2 s, at most 5 s).
        keep_size: keep every rank's number and the group's size: the failed ranks' places
            are filled by replacement processes (started with ``RANKGUARD_REPLACING=1`` and the
            ``RANK`` of the place; ``rankguard run --recovery in-place`` starts them), which
            must join within ``timeout`` too.

    Raises:
        UsageError: no process group exists (nor a generation that formed but did not
            connect: the next one is formed from it), ``timeout`` is not a positive number,
            ``exclude`` is not a list of ranks of the current group, or ``keep_size`` is not
            a bool.
        GroupRetired: this rank was left out of the new generation by its peers.
        CollectiveTimeout: a member (or a replacement) did not join within ``timeout``, no
            authentic membership could be agreed in the store within it (another process kept
            writing a forged one), or the store's server did not answer (stopped or frozen:
            under ``mp.spawn`` it lives in rank 0).
        PeerFailed: the store's server is gone (under ``mp.spawn``, rank 0 exited), keeping
            the size the launcher said that a vacant place will not be filled (``rankguard run
            --recovery in-place`` refused to replace the failed rank: the message says why),
            or a member that joined did not connect (it died or froze just after it joined;
            the rank then has no default group, and one that gloo connects later is given up).
    """
    limit = Deadline.after(check_seconds("rankguard.regroup(timeout)", timeout, text=False))
    if not isinstance(keep_size, bool):
        raise UsageError("rankguard.regroup(keep_size)", f"expected True or False, got "
                         f"{shown(keep_size)}")
    return form_next(limit, None if exclude is None else _ranks_to_exclude(exclude), keep_size)


def _ranks_to_exclude(exclude: object) -> set[int]:
    """``regroup(exclude=...)`` as a set of ranks of the current group.

    Raises:
        UsageError: not an iterable of ints, or a rank outside the current group.
    """
    import torch.distributed as dist

    what = "rankguard.regroup(exclude)"
    if isinstance(exclude, (str, bytes)) or not isinstance(exclude, Iterable):
        raise UsageError(what, f"expected a list of ranks, got {shown(exclude)}",
                         "give ranks of the current group, e.g. exclude=[3]")
    ranks = list(exclude)
    size = dist.get_world_size() if dist.is_initialized() else None
    for rank in ranks:
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise UsageError(what, f"expected ranks (ints), got {shown(rank)} in "
                             f"{shown(exclude)}", "give ranks of the current group, e.g. "
                             "exclude=[3]")
        if size is not None and not 0 <= rank < size:
            raise UsageError(what, f"rank {rank} is not in the current group (ranks 0 to "
                             f"{size - 1})", "give the ranks as the current generation "
                             "numbers them (regroup() renumbers the survivors)")
    return set(ranks)


def form_next(limit: Deadline, exclude: Iterable[int] | None = None,
              keep_size: bool = False) -> Generation:
    """:func:`regroup`, by ``limit`` (the backend's connect by ``limit`` or within
    ``margins.CONNECT_FLOOR_S``, whichever is later)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    state = current()
    if dist.is_initialized():
        backend = str(dist.get_backend())  # the new generation's is the old one's (gloo, nccl)
        rank, size = dist.get_rank(), dist.get_world_size()
    elif state.unconnected is not None:  # the last generation formed, but did not connect
        backend, rank, size = state.unconnected
        if backend_connect.still_connecting():
            raise PeerFailed(f"did not form: generation {state.generation}'s connect, given up "
                             "on, still runs in gloo (a member published its address and never "
                             "dialed in)", op="regroup", seq=next_number(), group=WORLD,
                             rank=rank, missing=[], waited=0.0)
    else:
        raise UsageError("rankguard.regroup()", "there is no process group to regroup",
                         "call it after init_process_group, when a collective has failed")
    started = time.monotonic()
    number = next_number()
    pg_timeout = state.pg_timeout or c10d.default_pg_timeout
    if exclude is not None:
        failed = set(exclude)
    else:
        # the peers not named failed (by the supervisor's notice, or gloo) are asked, twice
        # before one is left out: ranks that failed at once are all found (a notice names one),
        # and a live but slow one is not taken for failed (keeping the size, it would be a
        # place nobody fills; else a rank that cannot come back)
        known = _known_failed(keep_size)
        failed = known | silent(current().asker, rank, size, known, limit)
    proposal: list[int | None] = [None if r in failed else r for r in range(size)] \
        if keep_size else sorted(set(range(size)) - failed)
    try:
        number, members, joined = with_store_client(
            limit, "regroup's store calls",
            lambda client: _agree_and_join(client, number, proposal, rank, limit))
    except RuntimeError as error:  # the store died (torch's error) or stalled (StoreStalled)
        groups.retire_all(f"generation {number} did not form")
        kind = CollectiveTimeout if isinstance(error, StoreStalled) else PeerFailed
        raise kind(f"did not form: the job's store is unreachable ({first_line(error)})",
                   op="regroup",
                   seq=number, group=WORLD, rank=rank, missing=[],
                   waited=time.monotonic() - started) from error
    if members is None:
        groups.retire_all(f"generation {number} did not form")
        raise CollectiveTimeout("did not form: no authentic membership could be agreed in the "
                                "store (another process keeps writing to it)", op="regroup",
                                seq=number, group=WORLD, rank=rank, missing=[],
                                waited=time.monotonic() - started)
    if joined is None:
        groups.retire_all(f"left out of generation {number}")
        current().left_out = (f"this rank was left out of generation {number} by its peers "
                              f"(members: {members}): nobody meets it")
        raise GroupRetired(WORLD, f"this rank was left out of generation {number} "
                                  f"(members: {members})")
    if not joined.complete:
        # the peers of the group this rank leaves must not wait for it in a collective
        groups.abandon_world(f"rank {rank} gave up forming generation {number}")
        groups.retire_all(f"generation {number} did not form")
        refused = vacancies.refusal() if None in members else None
        others, late = generation_keys.others_missing(joined.missing, members.index(rank))
        kind, why = (PeerFailed, refused) if refused is not None else \
            (CollectiveTimeout, "this rank arrived after the other members had given up on it"
             if late else "members failed to join")
        raise kind(f"did not form: {why}", op="regroup", seq=number, group=WORLD, rank=rank,
                   missing=[_previous(members, i) for i in others],
                   waited=time.monotonic() - started)
    async_deadline.wait_for_abort(limit.wait_time())  # an NCCL deadline's abort: not under it
    # an NCCL communicator of the old generation that no fault aborted (this rank raised, its
    # peer waited) would hold its GPU buffers for good: the old groups are never destructed
    nccl_abort.abort(nccl_abort.not_aborted(nccl_abort.nccl_groups()),
                     min(NCCL_ABORT_S, limit.wait_time()))
    groups.retire_all(f"replaced by generation {number}")
    groups.discard_all()
    state.completions.flush()
    if state.ledger is not None:
        state.ledger.world().reset()  # collectives are numbered per generation
        state.ledger.clear_notice()  # it was about the generation that ended
    new_rank = members.index(rank)
    state.generation = number
    _connect(backend, vacancies.group_store(number, state.lineage_root), new_rank, members,
             pg_timeout, limit, started)
    state.last_failure = None
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(new_rank), str(len(members))
    return Generation(number, new_rank, len(members), rank, members, time.monotonic() - started)


def _connect(backend: str, store: Any, new_rank: int, members: list[int | None],
             pg_timeout: timedelta, limit: Deadline, started: float) -> None:
    """Create the new default group: the backend connects its members within what is left of
    ``limit`` (at least ``margins.CONNECT_FLOOR_S``), not within the group's timeout (gloo's
    is 30 min: a member that died after its arrival would hold every other one that long),
    and not within gloo's own multiple of it either (see ``backend_connect``); then the group
    takes ``pg_timeout`` for its collectives.

    Raises:
        PeerFailed: the members did not connect (one died or froze after it arrived).
    """
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    connect = connect_bound(limit, pg_timeout)
    began = time.monotonic()
    try:
        backend_connect.within(
            Deadline.after(connect), f"generation {current().generation}'s connect", backend,
            lambda: dist.init_process_group(backend, store=store, rank=new_rank,
                                            world_size=len(members),
                                            timeout=timedelta(seconds=connect)))
    except RuntimeError as error:  # torch's (DistStoreError is one): a peer never connected
        groups.retire_all(f"generation {current().generation} did not connect")
        current().unconnected = (backend, new_rank, len(members))
        # the next regroup asks the members by this generation's numbers; so do they
        probe_as(new_rank, len(members))
        raise not_connected(error, connect, began, "regroup", new_rank, started) from error
    current().unconnected = None
    c10d._set_pg_timeout(pg_timeout)


def probe_as(rank: int, size: int) -> bool:
    """Answer the peers' probes, and ask them, as ``rank`` of the current generation (of
    ``size`` ranks) from now on; False when this process has no responder serving (none made
    yet: a replacement that has not connected; or it ended)."""
    state = current()
    if state.responder is None or not state.responder.serving or state.asker is None:
        return False
    state.responder.follow(rank, state.generation, size)
    state.asker.generation = state.generation
    return True


def not_connected(error: RuntimeError, connect_s: float, began: float, op: str, rank: int,
                  started: float) -> PeerFailed:
    """The error of a rank whose new generation did not connect within ``connect_s`` (torch's
    ``error``, or ``backend_connect``'s): a member died or froze after it joined. Says how long
    the connect, begun at ``began`` (monotonic), really took."""
    took = time.monotonic() - began
    return PeerFailed(f"did not form: its members did not connect within {connect_s:.3g} s "
                      f"(gave up after {took:.3g} s: {first_line(error)})", op=op,
                      seq=current().generation, group=WORLD, rank=rank, missing=[],
                      waited=time.monotonic() - started)


def connect_bound(limit: Deadline, pg_timeout: timedelta) -> float:
    """Seconds a new generation's backend may take to connect its members: what is left of
    ``limit``, at least ``margins.CONNECT_FLOOR_S``, at most ``margins.CONNECT_CAP_S`` and the
    group's timeout."""
    return min(pg_timeout.total_seconds(),
               max(min(limit.remaining(), CONNECT_CAP_S), CONNECT_FLOOR_S))


def fill_vacancy(base_store: Any, place: int, limit: Deadline) -> tuple[Any, int, Deadline]:
    """For a replacement's ``init_process_group`` (``vacancies.replacing()``): join the newest
    generation with ``place`` vacant in the store ``base_store`` (the one the survivors' first
    default group was created on, as ``init_process_group`` made or took it); returns the
    store to create the default group on, the group's size, and when its members stop waiting
    (the bound of the connect, see :func:`connect_bound`). This process then belongs to that
    generation.

    Raises:
        UsageError: this process has no secret to prove its arrival with.
        CollectiveTimeout: no generation with ``place`` vacant formed with it by ``limit``,
            or the store did not answer.
        RuntimeError: torch's, when the store failed.
    """
    from torch.distributed import PrefixStore

    state = current()
    # the stores of the survivors' first default group: torch's group helper wraps the base
    # in the group's name ("0" for the first group: the lineage's root), and the backend's in
    # the device's ("cpu": the probes')
    state.lineage_root = PrefixStore("0/", base_store)
    state.probe_store = PrefixStore("cpu/", state.lineage_root)
    started = time.monotonic()
    try:
        record = with_store_client(limit, "joining a generation",
                                   lambda client: vacancies.join(client, place, limit))
    except StoreStalled as error:
        raise CollectiveTimeout(f"could not fill place {place}: the job's store does not answer",
                                op="join", seq=0, group=WORLD, rank=place, missing=[],
                                waited=time.monotonic() - started) from error
    state.generation = record.generation
    return (vacancies.group_store(record.generation, state.lineage_root), record.size,
            Deadline.after(record.until - time.time()))


def _known_failed(keep_size: bool) -> set[int]:
    """The ranks that the last collective error names as not arrived. Keeping the size, only
    those that did not answer its probe: one that answered is alive (behind, or slow), and a
    place marked vacant would wait for a replacement nobody starts while that rank is left out
    (the launcher stops a failed rank before it posts the notice, so a failed one does not
    answer). The others are asked again (:func:`silent`)."""
    failure = current().last_failure
    if failure is None:
        return set()
    if not keep_size:
        return set(failure.missing)
    return {rank for rank in failure.missing if failure.peers.get(rank) == NO_ANSWER}


def silent(asker: Asker | None, rank: int, size: int, known: set[int], limit: Deadline
           ) -> set[int]:
    """The peers, other than the ``known`` failed ones, that do not answer ``asker``'s probe
    (dead, frozen, or holding the GIL): they cannot join. A peer the probe could not reach (the
    store stalled) has not answered either; with no ``asker`` (a store without queues) none is
    taken for silent. Needed because a rank that learnt of the fault from a peer's notice
    (GroupRetired) knows nothing of who failed, and its proposal may be the one adopted.
    Returns at once when every peer asked answers; waits the probe's answer window, and
    ``margins.second_ask_window`` more for those that missed it, otherwise, each cut to what is
    left of ``limit`` (a peer that cannot answer by then cannot join)."""
    asked = [r for r in range(size) if r != rank and r not in known]
    if asker is None or not asked:
        return set()
    # taken for one that answered, a dead rank the probe could not reach was kept as a member,
    # and its peers waited for it out their timeout
    answers = asker.ask(WORLD, asked, window=limit.wait_time(ANSWER_WINDOW_S))
    late = [peer for peer in asked if answers.get(peer) is None]
    if not late or limit.passed():
        return set(late)
    answers = asker.ask(WORLD, late, window=second_ask_window(limit))
    return {peer for peer in late if answers.get(peer) is None}


def _agree_and_join(client: Any, number: int, proposal: list[int | None], rank: int,
                    limit: Deadline
                    ) -> tuple[int, list[int | None] | None, barrier.Meeting | None]:
    """The generation formed (``number``, or the first later one that did not fail), its
    agreed members (None: none agreed by ``limit``) and, if this rank is one of them, who
    joined by ``limit`` (None: left out). Vacant places are published for replacements before
    this rank waits for them.

    A generation that failed is never formed later: its members and arrivals in the store are
    of ranks that gave up on it (and may since have exited), so a rank that comes to it after
    its outcome was decided goes on to the next number. The outcome is decided once, by
    compare-and-set: the first member to find every arrival, or to give up waiting, writes it,
    and every member acts on the one written."""
    while generation_keys.failed_for(client, number) is not None:
        number += 1
    members = _agree(client, f"{generation_keys.prefix(number)}members", proposal, limit)
    if members is None or rank not in members:
        return number, members, None
    vacant = tuple(place for place, member in enumerate(members) if member is None)
    if vacant:
        vacancies.publish(client, vacancies.Vacancies(
            number, len(members), vacant, time.time() + limit.remaining()), limit)
    # a launcher that refused to fill a vacant place says so in the ledger, and one that stopped
    # a member since (to replace it too) posts a notice naming it: no use waiting
    joined = barrier.meet(client, generation_keys.join_barrier(number), members.index(rank),
                          len(members), limit,
                          stop=(lambda: vacancies.refusal() is not None
                                or names_a_member(groups.supervisor_notice(), members, rank))
                          if vacant else None)
    missing = generation_keys.decide(client, number, None if joined.complete else joined.missing,
                                     limit.later(STORE_ALLOWANCE_S))
    if missing is None:  # formed: this rank's late reads aside, every member arrived
        return number, members, barrier.Meeting(joined.size, {r: "" for r in range(joined.size)})
    return number, members, barrier.Meeting(
        joined.size, {r: "" for r in range(joined.size) if r not in missing})


def names_a_member(notice: tuple[str, int] | None, members: list[int | None], rank: int
                   ) -> bool:
    """Whether the launcher's ``notice`` (``LedgerWriter.notice``) names a member of the
    generation being formed other than ``rank``: it stopped that rank after the members were
    agreed (found hung or dead while a replacement joined) and replaces it in the next
    generation, so the others need not wait for it. The notice of the fault that began the
    regroup names a rank whose place is vacant (None): not a member."""
    return notice is not None and notice[1] != rank and notice[1] in members


def _previous(members: list[int | None], place: int) -> int:
    """The previous-generation rank at ``place``; a vacant place keeps its number."""
    member = members[place]
    return place if member is None else member


def _agree(client: Any, key: str, proposal: list[int | None], limit: Deadline
           ) -> list[int | None] | None:
    """The membership in ``key``: the first authentic proposal written there (``proposal`` if
    it is this one); None if none could be agreed by ``limit``. A forged value found there is
    replaced by compare-and-set; each try is one round trip to the store."""
    text = generation_keys.first_authentic(client, key, json.dumps(proposal), limit)
    if text is None:
        return None
    return [None if member is None else int(member) for member in json.loads(text)]
