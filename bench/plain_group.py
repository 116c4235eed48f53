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


def plain_gloo_group(store: dist.Store, rank: int = 0,
                     world: int = 1) -> tuple[dist.ProcessGroup, dist.ProcessGroupGloo]:
    """The group and its gloo backend, on ``store`` under the prefix ``plain``."""
    gloo = dist.ProcessGroupGloo(dist.PrefixStore("plain", store), rank, world,
                                 datetime.timedelta(seconds=60))
    plain = dist.ProcessGroup(dist.PrefixStore("plain", store), rank, world)
    plain._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    plain._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, gloo)
    return plain, gloo
