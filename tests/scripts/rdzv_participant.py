"""A node that dies as its round forms: ``rdzv_participant.py ENDPOINT RUN_ID MIN MAX``.

Joins the job's torch c10d rendezvous (the store at ENDPOINT, as a client) the way an agent
does, prints ``JOINED`` once torch's round formed with it, and exits at once with code 0: it
never takes part in rankguard's agreement on the round's ranks, as an agent SIGKILLed (or
SIGTERMed, or frozen) right after torch's rendezvous returned."""
import os
import sys
from datetime import timedelta

from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

endpoint, run_id, low, high = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
host, port = endpoint.rsplit(":", 1)
store = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=60))
params = RendezvousParameters("c10d", endpoint, run_id, low, high, "127.0.0.1",
                              join_timeout="60", keep_alive_interval="1",
                              keep_alive_max_attempt="3")
handler = create_handler(store, C10dRendezvousBackend(store, run_id), params)
info = handler.next_rendezvous()
print(f"JOINED node {info.rank} of {info.world_size}", flush=True)
os._exit(0)
