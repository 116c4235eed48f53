"""A plain gloo process group built as torch builds one for "gloo" (the C++ group over a gloo
backend), to compare rankguard's group against in the same process."""
import datetime

import torch
import torch.distributed as dist


def side_by_side() -> tuple[dist.ProcessGroup, dist.ProcessGroup, dist.ProcessGroupGloo]:
    """(rankguard's 1-rank default group, a plain gloo group, the plain group's gloo backend)
    on one HashStore; call once rankguard's instrumentation is installed."""
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    return (dist.group.WORLD, *plain_gloo_group(store))


def plain_gloo_group(store: dist.Store) -> tuple[dist.ProcessGroup, dist.ProcessGroupGloo]:
    """The group and its gloo backend, on ``store`` under the prefix ``plain``."""
    gloo = dist.ProcessGroupGloo(dist.PrefixStore("plain", store), 0, 1,
                                 datetime.timedelta(seconds=30))
    return plain_group_over(gloo, store, 0, 1), gloo


def plain_group_over(gloo: dist.ProcessGroupGloo, store: dist.Store, rank: int,
                     world: int) -> dist.ProcessGroup:
    """The C++ process group torch makes for "gloo", over the backend ``gloo`` (which may be
    the one under rankguard's group: then the two differ only in the path to it)."""
    plain = dist.ProcessGroup(dist.PrefixStore("plain", store), rank, world)
    plain._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    plain._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, gloo)
    return plain
