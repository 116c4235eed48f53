"""A plain gloo group served by hand, the baseline of the pool benches: N processes with a plain
gloo process group (no rankguard), and a leader that sends each request through a
multiprocessing Pipe to every rank and reads rank 0's answer, within a deadline."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import time
from typing import Any

import pool_bench_functions as fns


def plain_rank(rank: int, world: int, port: int, conn: Any) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    state = fns.setup(rank, world)
    conn.send("ready")
    while True:
        message = conn.recv()
        if message is None:
            return
        fn, args = message
        result = fn(state, *args)
        conn.send(result if rank == 0 else None)


class PlainFailed(Exception):
    """A request on a plain group did not get its answer (a rank died, or the deadline)."""


class PlainGroup:
    """N ranks of a plain gloo group; ``run`` one request at a time."""

    def __init__(self, world: int, start_timeout: float = 120.0) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        ctx = mp.get_context("spawn")
        self.conns, self.procs = [], []
        for rank in range(world):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=plain_rank, args=(rank, world, port, theirs), daemon=True)
            proc.start()
            self.conns.append(mine)
            self.procs.append(proc)
        for conn in self.conns:
            if not conn.poll(start_timeout) or conn.recv() != "ready":
                self.kill()
                raise RuntimeError("a plain rank did not start")

    def run(self, fn: Any, *args: Any, timeout: float = 60.0) -> Any:
        """Rank 0's result; raises PlainFailed when a rank's pipe broke or did not answer by
        ``timeout``: the group is then broken (a hand-written server has no verdict)."""
        until = time.monotonic() + timeout
        try:
            for conn in self.conns:
                conn.send((fn, args))
            results = []
            for conn in self.conns:
                if not conn.poll(max(0.0, until - time.monotonic())):
                    raise PlainFailed(f"no answer within {timeout:g} s")
                results.append(conn.recv())
        except (EOFError, OSError) as error:
            raise PlainFailed(f"a rank is gone ({type(error).__name__})") from None
        return results[0]

    def kill(self) -> None:
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
        for proc in self.procs:
            proc.join(5)

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(None)
            except OSError:
                pass
        for proc in self.procs:
            proc.join(10)
        self.kill()
