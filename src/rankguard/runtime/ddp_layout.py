"""The bucket layout of a ``DistributedDataParallel`` module, kept across a rebuild.

DDP groups its parameters' gradients into buckets, each reduced by one all-reduce. It starts
from an initial layout (the parameters in definition order) and, at the forward after its first
backward, lays them out again in the order their gradients became ready. gloo's ring all-reduce
adds up each element in an order that depends on its place in the bucket, so the same sums in
another layout differ in the last bits. A DDP built again after a recovery must therefore start
from the layout the old one had rebuilt, for the run to stay bit for bit the fault-free one; and
when the fault cut short the step whose forward would have laid them out again (the second a
DDP runs), from the layout that forward would have made: :class:`ReadyOrder` records the order
of the first backward, :func:`predicted` computes that layout from it as DDP's reducer does.

This leans on DDP's internals of torch 2.11 to 2.13 (its reducer's buckets, its bucket size
limits and its bucket assignment call); ``tests/runtime/test_ddp_layout.py`` checks the
prediction against DDP's own layout, and ``tests/runtime/test_peer_state.py`` compares a
recovered run with a fault-free one bit for bit: both fail if a torch release changes them.
"""

from __future__ import annotations

from typing import Any

from . import nccl_checked

Layout = list[list[int]]


def bucketed(ddp: Any) -> list[Any]:
    """The parameters ``ddp`` puts in buckets, in its order (what a layout's indices point
    into): those that require a gradient and that it was not told to ignore, each once."""
    ignored = getattr(ddp, "parameters_to_ignore", ()) or ()
    return [param for name, param in ddp.module.named_parameters()
            if param.requires_grad and name not in ignored]


def rebuilt(ddp: Any) -> Layout | None:
    """The layout ``ddp``'s reducer uses once it has laid its buckets out again (at the forward
    after its first backward), as indices into :func:`bucketed` per bucket in the reducer's
    order; None before that."""
    if not getattr(ddp, "_has_rebuilt_buckets", False):
        return None
    index = {id(param): i for i, param in enumerate(bucketed(ddp))}
    return [[index[id(param)] for param in bucket.parameters()]
            for bucket in ddp.reducer._get_zeros_like_grad_buckets()]


def predicted(ddp: Any, order: list[int]) -> Layout | None:
    """The layout ``ddp`` lays its buckets out as at its next forward, if its first backward's
    gradients became ready in ``order`` (indices into :func:`bucketed`); None when it will not
    lay them out again (``find_unused_parameters`` or ``static_graph``: DDP keeps its first
    layout, or builds it otherwise), or ``order`` does not hold every parameter once."""
    import torch.distributed as dist

    params = bucketed(ddp)
    if getattr(ddp, "find_unused_parameters", False) or getattr(ddp, "static_graph", False) \
            or sorted(order) != list(range(len(params))):
        return None
    cap = ddp.bucket_bytes_cap
    limits = list(ddp.bucket_bytes_cap_list) or [
        dist._DEFAULT_FIRST_BUCKET_BYTES if ddp.bucket_bytes_cap_default else cap, cap]
    buckets, _ = dist._compute_bucket_assignment_by_size(
        [params[i] for i in order], limits, [False] * len(order), order)
    return [list(bucket) for bucket in buckets]


class ReadyOrder:
    """The order in which the gradients of a module's bucketed parameters become ready in a
    backward (each parameter's first time: the micro-batches of a step add nothing), recorded
    by a hook on each until :meth:`close`. Costs one Python call per parameter and backward."""

    def __init__(self, ddp: Any) -> None:
        self._seen: dict[int, None] = {}
        self._handles = [param.register_post_accumulate_grad_hook(self._ready(i))
                         for i, param in enumerate(bucketed(ddp))]

    def _ready(self, index: int) -> Any:
        def hook(_param: Any) -> None:
            self._seen.setdefault(index, None)
        return hook

    @property
    def order(self) -> list[int]:
        return list(self._seen)

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def build(module: Any, options: dict[str, Any], layout: Layout | None) -> Any:
    """``DistributedDataParallel(module, **options)`` whose buckets start laid out as
    ``layout`` (None: DDP's initial layout), averaging its gradients with
    :func:`releasable_mean`."""
    ddp = _construct(module, options, layout)
    ddp.register_comm_hook(None, releasable_mean)
    return ddp


def releasable_mean(process_group, bucket):  # type: ignore[no-untyped-def]
    """A DDP communication hook that does what DDP does by default (divide the bucket by the
    group's size, all-reduce it), on a future that a peer's fault fails at once: DDP's own
    all-reduce waits in C++, where no notice reaches it, and a rank whose ring neighbours are
    alive would wait there for the backend's timeout.

    It calls the group's ``allreduce`` itself, as DDP's reducer does, rather than
    ``dist.all_reduce`` (whose argument checks cost about 20 us a bucket), and its future
    completes with the bucket through one Python callback (see ``bounded._relayed``). On an
    NCCL group the future completes only once the all-reduce ended well on the GPU
    (``nccl_checked``): one whose peer died leaves the bucket unreduced, without an error.

    Not annotated: DDP checks a hook's annotations against its own types, and this module's
    are strings (``from __future__ import annotations``)."""
    import torch
    import torch.distributed as dist

    group = process_group if process_group is not None else dist.group.WORLD
    tensor = bucket.buffer()
    tensor.div_(group.size())
    work = group.allreduce([tensor], dist.AllreduceOptions())
    releasable = getattr(work, "releasable_future", None)  # not in bounded mode: plain
    if releasable is not None:
        return releasable(tensor)
    nccl = _nccl_backend(group, tensor)
    if nccl is not None and not torch.cuda.is_current_stream_capturing():  # a capture: no wait
        return nccl_checked.checked_future(work, nccl, tensor, dist.get_rank())
    return work.get_future().then(lambda done: done.value()[0])


def _nccl_backend(group: Any, tensor: Any) -> Any:
    """The NCCL backend of ``group`` that all-reduces ``tensor``, or None (gloo's, a CPU
    tensor, a torch without NCCL)."""
    import torch.distributed as dist

    nccl = getattr(dist, "ProcessGroupNCCL", None)
    if nccl is None or not tensor.is_cuda:
        return None
    try:
        backend = group._get_backend(tensor.device)
    except RuntimeError:  # no backend for that device
        return None
    return backend if isinstance(backend, nccl) else None


def _construct(module: Any, options: dict[str, Any], layout: Layout | None) -> Any:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    if layout is None:
        return DistributedDataParallel(module, **options)
    original = dist._compute_bucket_assignment_by_size

    def assign(tensors: Any, limits: Any, *args: Any, **kwargs: Any) -> Any:
        # DDP reverses the buckets it is given (to approximate the backward's order)
        return [list(bucket) for bucket in reversed(layout)], [limits[-1]] * len(layout)

    dist._compute_bucket_assignment_by_size = assign
    try:
        return DistributedDataParallel(module, **options)
    finally:
        dist._compute_bucket_assignment_by_size = original
