"""Rank-runtime scenarios, run as real rank processes: ``runtime_scenarios.py SCENARIO``.

Works the same under plain processes (env:// variables set by the test), stock torchrun and
``rankguard run``. Talks to the test through the folder ``$SCENARIO_DIR``: ``ready_<rank>``
holds the pid once the rank reached the point the test waits for, ``result_<rank>.json`` what
it observed. ``$SCENARIO_GRACE`` is the SIGTERM budget given to ``rankguard.init``.
"""
import json
import os
import signal
import sys
import time
from pathlib import Path

import rankguard

OUT = Path(os.environ["SCENARIO_DIR"])
RANK = int(os.environ.get("RANK", "0"))


def mark(name: str) -> None:
    tmp = OUT / f".{name}_{RANK}"
    tmp.write_text(str(os.getpid()))
    tmp.rename(OUT / f"{name}_{RANK}")


def report(**fields: object) -> None:
    tmp = OUT / f".result_{RANK}.json"
    tmp.write_text(json.dumps(fields))
    tmp.rename(OUT / f"result_{RANK}.json")


def freeze() -> None:
    mark("ready")
    os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(60)


def group():
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(4)
    dist.all_reduce(t)
    return torch, dist


def error_fields(error: rankguard.RankguardError, started: float) -> dict:
    return {"type": type(error).__name__, "op": getattr(error, "op", None),
            "seq": getattr(error, "seq", None), "missing": getattr(error, "missing", None),
            "waited": getattr(error, "waited", None), "message": str(error),
            "elapsed": time.monotonic() - started}


def sigterm_idle() -> None:
    mark("ready")
    time.sleep(60)


def sigterm_cpu() -> None:
    import torch

    a = torch.rand(256, 256)
    mark("ready")
    end = time.monotonic() + 60
    while time.monotonic() < end:
        a = (a @ a).clamp(-1, 1)


def sigterm_in_collective() -> None:
    torch, dist = group()
    if RANK == 1:
        freeze()
    mark("ready")
    dist.all_reduce(torch.ones(4))  # rank 1 never arrives
    report(returned=True)


def shutdown_peer(fault: str) -> None:
    torch, dist = group()
    if RANK == 2:
        if fault == "frozen":
            freeze()
        os._exit(3)
    started = time.monotonic()
    result = rankguard.shutdown(timeout=float(os.environ.get("SCENARIO_TIMEOUT", "2")))
    report(clean=result.clean, missing=result.missing, detail=result.detail,
           elapsed=time.monotonic() - started, initialized=dist.is_initialized())


LATE = [int(r) for r in os.environ.get("SCENARIO_LATE", "2").split(",")]


def stay_until_reported(ranks: list[int], timeout: float = 30.0) -> None:
    """Keep this process (under plain processes rank 0's hosts the store) until ``ranks``
    reported, for at most ``timeout``."""
    end = time.monotonic() + timeout
    while any(not (OUT / f"result_{r}.json").exists() for r in ranks) and time.monotonic() < end:
        time.sleep(0.05)


def shutdown_late() -> None:
    """The ranks of ``$SCENARIO_LATE`` (default: 2) come to shutdown() 3 s after the others,
    whose timeout is 1.5 s."""
    torch, dist = group()
    if RANK in LATE:
        time.sleep(3)
    started = time.monotonic()
    result = rankguard.shutdown(timeout=1.5)
    report(clean=result.clean, missing=result.missing, detail=result.detail,
           elapsed=time.monotonic() - started, initialized=dist.is_initialized())
    if RANK == 0:
        stay_until_reported(LATE)


def shutdown_all() -> None:
    group()
    started = time.monotonic()
    result = rankguard.shutdown(timeout=10)
    import torch.distributed as dist

    report(clean=result.clean, missing=result.missing, elapsed=time.monotonic() - started,
           initialized=dist.is_initialized())


def store_host_leaves_first(shutdown: bool) -> None:
    """A job that ends well: rank 0 (the store's host, as under ``mp.spawn``) exits first,
    after ``rankguard.shutdown()`` or without it; rank 1 exits once rank 0 is gone."""
    group()
    if shutdown:
        rankguard.shutdown(timeout=10)
    report(pid=os.getpid())
    if RANK == 1:
        import psutil

        wait_for_file("result_0.json")
        try:
            psutil.Process(json.loads((OUT / "result_0.json").read_text())["pid"]).wait(30)
        except psutil.NoSuchProcess:
            pass
        time.sleep(0.5)  # the store's server closed: a client blocked on it fails now


def deadline_peer_frozen(op: str) -> None:
    """Rank 1 freezes; rank 0 runs ``op`` (``all_reduce`` or ``barrier``) in a 1 s deadline."""
    torch, dist = group()
    if RANK == 1:
        freeze()
    started = time.monotonic()
    try:
        with rankguard.deadline(1.0):
            if op == "barrier":
                dist.barrier()  # torch passes its options by keyword
            else:
                dist.all_reduce(torch.ones(4))
    except rankguard.CollectiveError as error:
        fields = error_fields(error, started)
        try:
            dist.all_reduce(torch.ones(4))
        except rankguard.GroupRetired as retired:
            fields["after"] = type(retired).__name__
        report(**fields)


def send_recv_slow() -> None:
    """A point-to-point transfer that takes longer than a bounded wait's slice (the sender
    starts 0.5 s late, and sends 16 MB) arrives whole; then a recv from a sender that freezes
    ends at its deadline, naming it. Rank 0, which hosts the store, receives."""
    torch, dist = group()
    payload = torch.empty(4 * 1024 * 1024)
    if RANK == 1:
        time.sleep(0.5)
        with rankguard.deadline(30.0):
            dist.send(payload.fill_(3.0), 0)
        freeze()
    started = time.monotonic()
    with rankguard.deadline(30.0):
        dist.recv(payload, 1)
    fields = {"received": float(payload.sum().item()), "took": time.monotonic() - started}
    started = time.monotonic()
    try:
        with rankguard.deadline(1.0):
            dist.recv(payload, 1)
    except rankguard.CollectiveError as error:
        fields.update(error_fields(error, started))
    report(**fields)


def shutdown_after_left_out() -> None:
    """Rank 2 sleeps past the others' 2 s deadline; they regroup without it, and its own
    regroup leaves it out. Then every rank shuts down (4 s): the report of each."""
    torch, dist = group()
    fields: dict = {}
    try:
        if RANK == 2:
            time.sleep(5)
        with rankguard.deadline(2.0):
            dist.all_reduce(torch.ones(4))
    except (rankguard.CollectiveError, rankguard.GroupRetired) as error:
        fields["fault"] = type(error).__name__
        try:
            fields["members"] = rankguard.regroup(timeout=5).world_size
        except (rankguard.CollectiveError, rankguard.GroupRetired) as regroup_error:
            fields["regroup"] = type(regroup_error).__name__
            fields["regroup_said"] = str(regroup_error)
    started = time.monotonic()
    done = rankguard.shutdown(timeout=4)
    report(**fields, clean=done.clean, missing=done.missing, detail=done.detail,
           took=time.monotonic() - started)
    if RANK != 2:
        stay_until_reported([2])


def regroup_after_kill() -> None:
    torch, dist = group()
    started = time.monotonic()
    try:
        for step in range(1000):
            if RANK == 3 and step == 5:
                os.kill(os.getpid(), signal.SIGKILL)
            t = torch.ones(4)
            dist.all_reduce(t)
            started = time.monotonic()
    except (rankguard.CollectiveError, rankguard.GroupRetired) as error:
        fields = error_fields(error, started)
        generation = rankguard.regroup(timeout=10)
        t = torch.ones(4)
        dist.all_reduce(t)
        report(**fields, generation=generation.number, rank=generation.rank,
               world_size=generation.world_size, took=generation.took, value=t[0].item(),
               env_rank=os.environ["RANK"], env_world=os.environ["WORLD_SIZE"])
        rankguard.shutdown(timeout=5)


def regroup_short_timeout_peer_frozen() -> None:
    """Two ranks; rank 1 is stopped (SIGSTOP) after the first all_reduce; rank 0 (the store's
    host) then calls ``regroup(timeout=1)``, whose probes find rank 1 silent."""
    torch, dist = group()
    if RANK == 1:
        freeze()
        return
    time.sleep(0.2)  # rank 1 stops itself
    started = time.monotonic()
    try:
        generation = rankguard.regroup(timeout=1)
        report(type=None, members=generation.members, elapsed=time.monotonic() - started)
    except rankguard.RankguardError as error:
        report(**error_fields(error, started))


def regroup_after_a_solo_failure() -> None:
    """Both ranks form generation 1; rank 0 alone tries generation 2, gives up and exits; then
    rank 1 regroups: generation 2's arrival of rank 0 must not make it connect to rank 0."""
    torch, dist = group()
    rankguard.regroup(timeout=10)
    if RANK == 0:
        started = time.monotonic()
        try:
            rankguard.regroup(timeout=3)
            report(type=None)
        except rankguard.CollectiveTimeout as error:
            report(**error_fields(error, started))
        os._exit(0)
    wait_for_file("result_0.json")
    time.sleep(0.5)  # rank 0 exits (os._exit at once after its report)
    started = time.monotonic()
    try:
        # its probes of the dead rank take 2.5 s idle; a loaded machine may need several times it
        generation = rankguard.regroup(timeout=15)
        report(type=None, members=generation.members, number=generation.number,
               elapsed=time.monotonic() - started)
    except rankguard.RankguardError as error:
        report(**error_fields(error, started))
    os._exit(0)


def step_loop_peer_hangs() -> None:
    """A StepLoop (no launcher to replace ranks) whose rank 1 hangs at step 3: rank 0's
    collective times out, its regroup waits for rank 1, and the loop must then end."""
    torch, dist = group()
    model = torch.nn.Linear(4, 1)
    loop = rankguard.StepLoop(lambda: {"model": model.state_dict()}, model.load_state_dict,
                              regroup_timeout=float(os.environ["SCENARIO_REGROUP_TIMEOUT"]))
    started = time.monotonic()

    def step(n: int) -> None:
        nonlocal started
        if RANK == 1 and n == 3:
            time.sleep(120)  # hung (the test kills it)
        started = time.monotonic()
        t = torch.ones(4)
        dist.all_reduce(t)

    try:
        loop.run(step, 6)
        report(type=None)
    except rankguard.RankguardError as error:
        report(**error_fields(error, started), recoveries=len(loop.recoveries))
    os._exit(0)


def ddp_peer_dies(at_step: int) -> None:
    """Rank 1 exits before step ``at_step``; rank 0 reports the error its backward raised."""
    torch, dist = group()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    started = time.monotonic()
    try:
        for step in range(1000):
            if RANK == 1 and step == at_step:
                os._exit(1)
            optimizer.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            optimizer.step()
            started = time.monotonic()
    except rankguard.CollectiveError as error:
        report(**error_fields(error, started), cause=type(error.__cause__).__name__)


def ddp_layouts() -> None:
    """For a model with a frozen parameter, in DDP's default buckets and in buckets of 0.1 MB:
    DDP's initial layout, the one ``ddp_layout.predicted`` gives from the first backward's
    order, the one DDP lays out at its second forward, and that of a DDP built with the
    predicted one (``ddp_layout.build``)."""
    torch, dist = group()
    from rankguard.runtime import ddp_layout

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 300), torch.nn.ReLU(),
                                torch.nn.Linear(300, 200), torch.nn.ReLU(),
                                torch.nn.Linear(200, 1))
    model[0].bias.requires_grad_(False)

    def buckets(ddp) -> list:
        index = {id(param): i for i, param in enumerate(ddp_layout.bucketed(ddp))}
        return [[index[id(param)] for param in bucket.parameters()]
                for bucket in ddp.reducer._get_zeros_like_grad_buckets()]

    found = {}
    for cap in (None, 0.1):
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap)
        ready = ddp_layout.ReadyOrder(ddp)
        initial = buckets(ddp)
        ddp(torch.randn(4, 32)).sum().backward()
        predicted = ddp_layout.predicted(ddp, ready.order)
        ready.close()
        ddp(torch.randn(4, 32)).sum().backward()
        rebuilt = ddp_layout.rebuilt(ddp)
        built = buckets(ddp_layout.build(model, {"bucket_cap_mb": cap}, predicted))
        found[str(cap)] = {"initial": initial, "predicted": predicted, "rebuilt": rebuilt,
                           "built": built}
    report(**found)


def wait_for_file(name: str, timeout: float = 30.0) -> None:
    """Wait (bounded) for the test to create ``name`` in the folder."""
    end = time.monotonic() + timeout
    while not (OUT / name).exists():
        if time.monotonic() > end:
            raise SystemExit(f"rank {RANK}: the test never wrote {name}")
        time.sleep(0.01)


def values_dropped() -> int:
    try:
        from rankguard.store import sealed
    except ImportError:  # a rankguard that seals nothing
        return 0
    return sealed.dropped()


def world_retired():
    from rankguard.runtime import internal

    return internal.world_retired()


def store_address() -> None:
    """Tell the test where the job's store is, so it can write into it as an outsider."""
    tmp = OUT / f".store_{RANK}"
    tmp.write_text(json.dumps([os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])]))
    tmp.rename(OUT / f"store_{RANK}")


def outsider_writes() -> None:
    """The group forms; the test (an outsider to the run) writes probes, notices or a stop into
    the ranks' store; each rank waits until it dealt with them (its world group retired, or
    ``SCENARIO_DROPS`` values dropped), then runs a bounded collective, reports, and waits for
    the test to be done with the store before it shuts down."""
    torch, dist = group()
    from rankguard.runtime import state

    store_address()
    mark("ready")
    wait_for_file("written")
    drops = int(os.environ.get("SCENARIO_DROPS", "1"))
    end = time.monotonic() + 10
    while world_retired() is None and values_dropped() < drops and time.monotonic() < end:
        time.sleep(0.01)
    time.sleep(0.2)  # anything else the outsider wrote has been popped by now
    fields = {"retired": world_retired(), "dropped": values_dropped(),
              "serving": state.current().responder.serving}
    started = time.monotonic()
    try:
        with rankguard.deadline(5):
            t = torch.ones(4)
            dist.all_reduce(t)
        fields.update(ok=True, value=t[0].item())
    except (rankguard.CollectiveError, rankguard.GroupRetired) as error:
        fields.update(ok=False, **error_fields(error, started))
    report(**fields)
    wait_for_file("checked")  # rank 0 hosts the store the test still reads
    rankguard.shutdown(timeout=5)


def regroup_again_and_reduce(first: dict, started: float) -> None:
    """After a regroup that failed (``first``: its report): regroup keeping the size, all-reduce
    ones in the new generation, and report both."""
    import torch
    import torch.distributed as dist

    try:
        generation = rankguard.regroup(timeout=60, keep_size=True)
        total = torch.ones(4)
        dist.all_reduce(total)
        report(first=first, type=None, number=generation.number, replaced=generation.replaced,
               sum=total[0].item())
    except rankguard.RankguardError as error:
        report(first=first, **error_fields(error, started))


def regroup_peer_dies_before_connecting(again: bool = False) -> None:
    """Rank 1 joins generation 1 with the product's own calls (its arrival at the join
    barrier), then dies before it connects; rank 0 regroups (timeout 2 s) and must fail within
    its connect bound, not gloo's 30 min group timeout. ``again``: rank 0 then regroups once
    more keeping the size, the test starts rank 1's replacement, and both all-reduce in the
    generation they form."""
    from rankguard.deadline import Deadline
    from rankguard.runtime import generations

    started = time.monotonic()
    if RANK == 1 and os.environ.get("RANKGUARD_REPLACING") == "1":
        torch, dist = group()  # its first group, named "0" by torch
        report(type=None, elapsed=time.monotonic() - started)
        return
    torch, dist = group()
    if RANK == 1:
        limit = Deadline.after(20)
        generations.with_store_client(limit, "joining", lambda client: generations
                                      ._agree_and_join(client, 1, [0, 1], 1, limit))
        os._exit(0)
    started = time.monotonic()
    try:
        rankguard.regroup(timeout=2, exclude=())
        report(type=None, elapsed=time.monotonic() - started)
        return
    except rankguard.RankguardError as error:
        first = {**error_fields(error, started), "initialized": dist.is_initialized()}
    if not again:
        report(**first)
        return
    regroup_again_and_reduce(first, started)
    wait_for_file("result_1.json", timeout=60)  # the store (this process's) outlives the others


def watched_store(store, on_read):
    """``store`` for a backend's connect, calling ``on_read(written, value)`` on each read the
    backend makes: ``written`` the values it wrote so far, ``value`` what a ``get`` read (None
    for a ``wait`` or ``check``, called before them). A fault sent from ``on_read`` lands
    before the backend acts on what it read."""
    import torch.distributed as dist

    class Watched(dist.Store):
        def __init__(self) -> None:
            super().__init__()
            self.written: list[bytes] = []

        def set(self, key: str, value: bytes) -> None:
            store.set(key, value)
            self.written.append(bytes(value))

        def get(self, key: str) -> bytes:
            value = store.get(key)
            on_read(self.written, bytes(value))
            return value

        def wait(self, keys: list, *timeout: object) -> None:
            on_read(self.written, None)
            store.wait(keys, *timeout)

        def check(self, keys: list) -> bool:
            on_read(self.written, None)
            return store.check(keys)

        def add(self, key: str, amount: int) -> int:
            return store.add(key, amount)

    return Watched()


def gloo_port(published: bytes) -> int | None:
    """The port in a gloo address published for 127.0.0.1 (a ``sockaddr_in``: family 2, the
    port, the address), as gloo's arithmetic sees it (this machine's byte order); None where
    ``published`` holds none."""
    import re

    found = re.search(rb"\x02\x00(..)\x7f\x00\x00\x01", published, re.S)
    return int.from_bytes(found.group(1), sys.byteorder) if found else None


def watch_connect(on_read) -> None:
    """The next generation's backend connects through ``watched_store(..., on_read)``."""
    from rankguard.runtime import vacancies

    group_store = vacancies.group_store
    vacancies.group_store = lambda number, root: watched_store(group_store(number, root), on_read)


def fault_if_it_dials_every_peer(size: int, fault: int):
    """An ``on_read`` for :func:`watched_store`: once gloo read the address of every one of the
    ``size`` members (it reads them all before it dials), the rank gloo makes dial every peer
    (the one whose port, as gloo compares them, is the greatest) marks ``published`` and sends
    itself ``fault``, before it dials. Each rank writes what it found in ``gloo_ports_<rank>``."""
    peers: set[int] = set()
    decided = False

    def on_read(written: list, value: bytes | None) -> None:
        nonlocal decided
        own = next((port for port in map(gloo_port, written) if port is not None), None)
        peer = gloo_port(value) if value is not None else None
        if decided or own is None or peer is None or peer == own:
            return
        peers.add(peer)
        if len(peers) < size - 1:
            return
        decided = True
        dials = own > max(peers)  # gloo's rule, pair by pair: the greater port dials
        (OUT / f"gloo_ports_{RANK}").write_text(
            f"rank {RANK}: gloo port {own} (as gloo compares them), its peers' {sorted(peers)}: "
            f"{'dials every peer' if dials else 'is dialed by some'}\n")
        if dials:
            mark("published")
            os.kill(os.getpid(), fault)

    return on_read


def regroup_dialer_dies_after_publishing_its_address() -> None:
    """Three ranks, their store hosted outside them (as a launcher hosts it), regroup (timeout
    5 s). The rank gloo makes dial both others dies (SIGKILL) once it read their addresses,
    before it dials: each survivor waits for it to dial in, a wait gloo bounds only at five
    times the group's timeout (25 s for 5 s). The survivors report how their regroup ended."""
    torch, dist = group()
    watch_connect(fault_if_it_dials_every_peer(3, signal.SIGKILL))
    started = time.monotonic()
    try:
        generation = rankguard.regroup(timeout=5, exclude=())
        report(type=None, members=generation.members, elapsed=time.monotonic() - started)
    except rankguard.RankguardError as error:
        report(**error_fields(error, started), initialized=dist.is_initialized())


def regroup_dialer_freezes_after_publishing_its_address() -> None:
    """Two ranks, their store hosted outside them (as a launcher hosts it), regroup (timeout
    3 s). The rank gloo makes dial the other stops itself (SIGSTOP) once it read its peer's
    address, before it dials; the other waits to be dialed and reports how its regroup ended.
    The test then resumes the dialer (SIGCONT, writing ``resumed``): the connect the waiting
    rank gave up on now succeeds, and the group it makes must be given up, never used. The
    waiting rank reports ``late.json``: whether a default group appeared, and what an
    all_reduce on it raised. Both ranks exit once it is written."""
    torch, dist = group()
    watch_connect(fault_if_it_dials_every_peer(2, signal.SIGSTOP))
    started = time.monotonic()
    try:
        generation = rankguard.regroup(timeout=3, exclude=())
        outcome = {"type": None, "members": generation.members,
                   "elapsed": time.monotonic() - started}
    except rankguard.RankguardError as error:
        outcome = {**error_fields(error, started), "initialized": dist.is_initialized()}
    if (OUT / f"published_{RANK}").exists():  # the dialer, resumed
        wait_for_file("late.json", timeout=60)
        return
    report(**outcome)
    wait_for_file("resumed", timeout=60)
    end = time.monotonic() + 20
    while not dist.is_initialized() and time.monotonic() < end:
        time.sleep(0.05)
    late = {"initialized": dist.is_initialized(), "raised": None}
    if dist.is_initialized():
        try:
            dist.all_reduce(torch.ones(4))
        except (rankguard.RankguardError, RuntimeError) as error:
            late["raised"] = type(error).__name__
    tmp = OUT / ".late.json"
    tmp.write_text(json.dumps(late))
    tmp.rename(OUT / "late.json")


def members_die_around_a_replacement() -> None:
    """Four ranks. Rank 1 dies and the test starts its replacement; ranks 0 and 2 regroup
    keeping the size (timeout 20 s); rank 3 joins that generation with the product's own
    calls, then dies before it connects, and the test starts its replacement too. The
    survivors' regroup and the first replacement's connect fail; the survivors regroup again,
    and all four must form the next generation (the first replacement joins it after its
    failed connect) and all-reduce in it."""
    from rankguard.deadline import Deadline
    from rankguard.runtime import generations
    from rankguard.runtime.state import current

    started = time.monotonic()
    if os.environ.get("RANKGUARD_REPLACING") == "1":
        try:
            torch, dist = group()
            report(type=None, number=current().generation, elapsed=time.monotonic() - started)
        except rankguard.RankguardError as error:
            report(**error_fields(error, started))
        return
    torch, dist = group()
    if RANK == 1:
        os._exit(3)
    if RANK == 3:  # its wait, as the survivors', is 20 s (the first to publish sets it)
        limit = Deadline.after(20)
        generations.with_store_client(limit, "joining", lambda client: generations
                                      ._agree_and_join(client, 1, [0, None, 2, 3], 3, limit))
        os._exit(0)
    try:
        rankguard.regroup(timeout=20, exclude=[1], keep_size=True)
        first = {"type": None}
    except rankguard.RankguardError as error:
        first = {**error_fields(error, started), "initialized": dist.is_initialized()}
    regroup_again_and_reduce(first, started)
    if RANK == 0:  # the store (this process's) outlives the others
        for rank in (1, 2, 3):
            wait_for_file(f"result_{rank}.json", timeout=60)


def outsider_regroup() -> None:
    """The group forms; the test writes a membership into the store; then both ranks regroup."""
    torch, dist = group()
    store_address()
    mark("ready")
    wait_for_file("written")
    try:
        generation = rankguard.regroup(timeout=10, exclude=())
    except (rankguard.CollectiveError, rankguard.GroupRetired) as error:
        report(ok=False, type=type(error).__name__, message=str(error),
               dropped=values_dropped())
        return
    t = torch.ones(4)
    dist.all_reduce(t)
    report(ok=True, members=generation.members, world_size=generation.world_size,
           value=t[0].item(), dropped=values_dropped())
    rankguard.shutdown(timeout=5)


def outsider_shutdown() -> None:
    """Rank 1 freezes; the test writes rank 1's arrival at the shutdown barrier; rank 0 shuts
    down and reports who it found missing."""
    torch, dist = group()
    store_address()
    if RANK == 1:
        freeze()
    mark("ready")
    wait_for_file("written")
    result = rankguard.shutdown(timeout=float(os.environ.get("SCENARIO_TIMEOUT", "2")))
    report(clean=result.clean, missing=result.missing, detail=result.detail,
           dropped=values_dropped())


def store_host_fault(fault: str, call: str) -> None:
    """Rank 0 hosts the store (as under mp.spawn); it freezes or exits, and the other ranks make
    ``call`` with a 2 s budget: each must return, and the process then exit, in bounded time."""
    torch, dist = group()
    if RANK == 0:
        if fault == "frozen":
            freeze()
        os._exit(3)
    time.sleep(0.3)  # rank 0 is gone or stopped by now
    timeout = float(os.environ.get("SCENARIO_TIMEOUT", "2"))
    started = time.monotonic()
    try:
        if call == "deadline":
            with rankguard.deadline(timeout):
                dist.all_reduce(torch.ones(4))
            report(type=None, elapsed=time.monotonic() - started)
        elif call == "shutdown":
            result = rankguard.shutdown(timeout=timeout)
            elapsed = time.monotonic() - started
            again = rankguard.shutdown(timeout=timeout)  # a retry is told the same, at once
            report(type=None, clean=result.clean, missing=result.missing, detail=result.detail,
                   elapsed=elapsed, initialized=dist.is_initialized(), again=again.clean,
                   again_detail=again.detail)
        else:
            rankguard.regroup(timeout=timeout)
            report(type=None, elapsed=time.monotonic() - started)
    except rankguard.RankguardError as error:
        report(**error_fields(error, started))


def share_state(fault: str) -> None:
    """Two ranks hold a model and optimizer at step 7, one holds nothing (a replacement: rank
    2); ``rankguard.runtime.peer_state.share`` gives it the state. With ``fault`` ``frozen``, rank
    0 (the store's host) is the replacement and the source, rank 1, freezes before the exchange:
    the others get a bounded error naming it."""
    import random

    from rankguard.runtime import peer_state

    empty = 0 if fault == "frozen" else 2
    torch, dist = group()
    torch.manual_seed(1234 if RANK != empty else 99)
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if RANK != empty:
        for _ in range(7):
            optimizer.zero_grad()
            model(torch.ones(3, 8)).sum().backward()
            optimizer.step()
    step = 7 if RANK != empty else peer_state.NO_STATE
    random.seed(5 if RANK != empty else 6)

    def get_state():
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "rng": torch.get_rng_state(), "step": step}

    def load_state(state):
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])

    if fault == "frozen" and RANK == 1:
        freeze()
    started = time.monotonic()
    try:
        shared = peer_state.share(step, get_state, load_state, timeout=3.0)
    except rankguard.CollectiveError as error:
        report(**error_fields(error, started))
        return
    digest = [round(float(p.double().sum().item()), 12) for p in model.parameters()]
    momentum = [round(float(v["momentum_buffer"].double().sum().item()), 12)
                for v in optimizer.state_dict()["state"].values()]
    report(step=shared.step, source=shared.source, receivers=list(shared.receivers),
           nbytes=shared.nbytes, took=shared.took, params=digest, momentum=momentum,
           rng=int(torch.randint(0, 10 ** 9, (1,)).item()))


def step_loop(fault: str) -> None:
    """A DDP training loop of 12 steps under ``rankguard.StepLoop``, each rank's data drawn from
    its rank and the step. With ``fault`` ``exit``, rank 2 exits at step 5 (the test then starts
    its replacement); ``twice``: rank 1 exits at step 3 and rank 2 at step 8. Every rank reports
    its final parameters, exactly, and its recoveries."""
    import dataclasses

    import torch
    import torch.distributed as dist

    from rankguard.runtime import vacancies

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def get_state():
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}

    def load_state(state):
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])

    loop = rankguard.StepLoop(get_state, load_state, regroup_timeout=60, share_timeout=30)
    ddp = loop.ddp(model)
    dies_at = {"exit": {2: 5}, "twice": {1: 3, 2: 8}}.get(fault, {})

    def step(n: int) -> None:
        if dies_at.get(RANK) == n and not vacancies.replacing():
            os._exit(3)
        data = torch.randn(16, 8, generator=torch.Generator().manual_seed(1000 * n + RANK))
        optimizer.zero_grad()
        ddp(data).pow(2).sum().backward()
        optimizer.step()

    loop.run(step, 12)
    report(params=[p.detach().flatten().tolist() for p in model.parameters()],
           step=loop.step, replacement=vacancies.replacing(),
           recoveries=[dataclasses.asdict(r) for r in loop.recoveries])
    rankguard.shutdown(timeout=10)


SCENARIOS = {
    "sigterm_idle": sigterm_idle,
    "sigterm_cpu": sigterm_cpu,
    "sigterm_in_collective": sigterm_in_collective,
    "shutdown_peer_frozen": lambda: shutdown_peer("frozen"),
    "shutdown_peer_dead": lambda: shutdown_peer("dead"),
    "shutdown_all": shutdown_all,
    "shutdown_late": shutdown_late,
    "deadline_peer_frozen": lambda: deadline_peer_frozen("all_reduce"),
    "deadline_barrier_peer_frozen": lambda: deadline_peer_frozen("barrier"),
    "store_host_leaves_first": lambda: store_host_leaves_first(False),
    "store_host_leaves_first_after_shutdown": lambda: store_host_leaves_first(True),
    "send_recv_slow": send_recv_slow,
    "regroup_after_kill": regroup_after_kill,
    "shutdown_after_left_out": shutdown_after_left_out,
    "step_loop_peer_hangs": step_loop_peer_hangs,
    "regroup_after_a_solo_failure": regroup_after_a_solo_failure,
    "regroup_short_timeout_peer_frozen": regroup_short_timeout_peer_frozen,
    "ddp_peer_dies": lambda: ddp_peer_dies(3),
    "ddp_peer_dies_before_the_first_backward": lambda: ddp_peer_dies(0),
    "ddp_layouts": ddp_layouts,
    "outsider_writes": outsider_writes,
    "regroup_peer_dies_before_connecting": regroup_peer_dies_before_connecting,
    "regroup_again_after_a_peer_died_before_connecting":
        lambda: regroup_peer_dies_before_connecting(again=True),
    "members_die_around_a_replacement": members_die_around_a_replacement,
    "regroup_dialer_dies_after_publishing_its_address":
        regroup_dialer_dies_after_publishing_its_address,
    "regroup_dialer_freezes_after_publishing_its_address":
        regroup_dialer_freezes_after_publishing_its_address,
    "outsider_regroup": outsider_regroup,
    "outsider_shutdown": outsider_shutdown,
    "share_state": lambda: share_state(""),
    **{f"step_loop{suffix}": (lambda fault=fault: step_loop(fault))
       for suffix, fault in (("", ""), ("_exit", "exit"), ("_twice", "twice"))},
    "share_state_source_frozen": lambda: share_state("frozen"),
    **{f"store_host_{fault}_{call}": (lambda fault=fault, call=call: store_host_fault(fault, call))
       for fault in ("frozen", "dead") for call in ("deadline", "shutdown", "regroup")},
}

if __name__ == "__main__":
    rankguard.init(grace=float(os.environ.get("SCENARIO_GRACE", "3")))
    SCENARIOS[sys.argv[1]]()
