"""A deadlock inside the job over a socket of the user's own: rank 1 listens and never accepts
nor sends, rank 0 connects to it and waits for a byte; then both would meet at a barrier."""
import socket

import torch.distributed as dist

dist.init_process_group("gloo")
store = dist.distributed_c10d._get_default_store()
if dist.get_rank() == 1:
    listener = socket.create_server(("127.0.0.1", 0))
    store.set("peerport", str(listener.getsockname()[1]))
    dist.barrier()
else:
    peer = socket.create_connection(("127.0.0.1", int(store.get("peerport"))))
    peer.recv(1)
    dist.barrier()
