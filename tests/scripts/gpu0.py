"""For the GPU set's NCCL scripts: join the job's NCCL default group with this rank on GPU 0,
every rank a host of its own through ``NCCL_HOSTID`` (NCCL takes several ranks on one device
only so). Imported by name: a script's own folder is first on its ``sys.path``."""
import os

import torch
import torch.distributed as dist


def join_nccl() -> int:
    """``init_process_group("nccl")`` on GPU 0 (from torchrun's environment); this rank."""
    os.environ.setdefault("NCCL_HOSTID", f"host{os.environ['RANK']}")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl")
    return dist.get_rank()
