"""``--devices`` and ``--gpus-per-replica`` for the pool benches: the same options as
``rankguard serve``, passed to ``rankguard.Pool`` so that a bench runs its ranks on GPUs."""

from __future__ import annotations

import argparse
from typing import Any

from rankguard.serving.placement import parse_devices


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
