"""``--devices`` and ``--gpus-per-replica`` for the pool benches: the same options as
``rankguard serve``, passed to ``rankguard.Pool`` so that a bench runs its ranks on GPUs; and
the NCCL settings under which ranks share a GPU, as the GPU set runs them."""

from __future__ import annotations

import argparse
from typing import Any

from rankguard.serving.placement import parse_devices

# ranks sharing one GPU (each a host of its own for NCCL, through the NCCL_HOSTID the pool or
# the job sets): NCCL's socket transport on loopback only, the settings the GPU set was measured
# and proven with (tests/gpu/nccl_ranks.py); left to NCCL, it may pick InfiniBand or another
# interface for these "hosts"
SHARED_GPU_NCCL = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_IB_DISABLE": "1",
                   "NCCL_NVLS_ENABLE": "0", "NCCL_COLLNET_ENABLE": "0",
                   "NCCL_SOCKET_IFNAME": "lo"}


def add_device_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--devices", default=None,
                        help="CUDA devices of each rank, as rankguard serve takes them (0,1, or "
                        "0,1/2,3 per replica); one index is every rank's (they share it)")
    parser.add_argument("--gpus-per-replica", type=int, default=None,
                        help="instead of --devices: CUDA devices of its own per replica")


def pool_devices(args: argparse.Namespace) -> dict[str, Any]:
    """``Pool``'s ``devices`` or ``gpus_per_replica`` from the options (none: the CPU); one
    device index alone is every rank's."""
    if args.gpus_per_replica is not None:
        return {"gpus_per_replica": args.gpus_per_replica}
    if args.devices is None:
        return {}
    devices = parse_devices(args.devices, "--devices")
    if len(devices) == 1 and isinstance(devices[0], int):
        devices = devices * args.world
    return {"devices": devices}


def pool_env(args: argparse.Namespace) -> dict[str, str]:
    """The environment a pool's ranks get from the options: ``SHARED_GPU_NCCL`` where ranks of
    a replica share a GPU (one index for every rank, or one named twice), else nothing."""
    devices = pool_devices(args).get("devices")
    if not devices:
        return {}
    replicas = devices if isinstance(devices[0], list) else [devices]
    shared = any(len(set(ranks)) < len(ranks) for ranks in replicas)
    return dict(SHARED_GPU_NCCL) if shared else {}
