"""State from a peer, not from disk: the ranks of a group agree on the step to resume at, and
the ranks that do not have that step's state receive it from one that does, over the group.

The first building block of recovery inside the job (a replacement rank joins a new generation
empty-handed; see ``generations``): every rank calls :func:`share` with the step its state is
at (``NO_STATE``: it has none), a callable that gives its state and one that loads a state.

1. **agree**: one ``all_gather`` of every rank's step. The step to resume at is the highest; the
   **source** is the lowest rank at it. A rank at another step is a **receiver**.
2. **send**: the source serializes its state once (``torch.save``, to memory) and sends it to
   each receiver, its length first (point-to-point ``send``/``recv`` on the group: the ranks that
   already hold the state move no byte). A receiver loads what it received.

The exchange runs on the group's own backend. On an NCCL group (which carries no CPU tensor)
the steps and the serialized state travel as CUDA tensors on the rank's current device: the
bytes cross from GPU to GPU over NCCL (NVLink, InfiniBand), not through a second, slower
transport, and the state's tensors are loaded back onto the devices they were saved from. The
serialized copy costs one host staging of the state on the source and on each receiver.

Every collective is bounded by ``timeout`` (``rankguard.deadline``): a peer that dies or
freezes during the exchange raises a ``rankguard.CollectiveError`` on every rank waiting for it,
within the timeout, naming it; nothing waits for torch's own timeout.
"""

from __future__ import annotations

import io
import pickle
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..deadline import check_seconds
from ..errors import UsageError, first_line
from .deadline_scope import deadline
from .state import current

NO_STATE = -1  # the step of a rank that holds no state (a replacement)


@dataclass(frozen=True)
class Shared:
    """What :func:`share` did on this rank.

    Attributes:
        step: the step every rank resumes at.
        source: the rank whose state the receivers loaded.
        receivers: the ranks that received it.
        nbytes: the serialized state's size (0 when no rank received it).
        took: seconds the whole exchange took on this rank.
    """

    step: int
    source: int
    receivers: tuple[int, ...]
    nbytes: int
    took: float


def share(step: int, get_state: Callable[[], Any], load_state: Callable[[Any], None], *,
          timeout: float = 30.0, group: Any = None) -> Shared:
    """Agree on the step to resume at and give its state to the ranks that lack it.

    Every rank of ``group`` (default: the default group) must call it. ``get_state()`` is
    called on the source only; ``load_state(state)`` on each receiver only.

    Args:
        step: the step this rank's state is at, or ``NO_STATE``.
        timeout: seconds the exchange may take on any rank.

    Raises:
        UsageError: ``step`` is not a whole number >= ``NO_STATE``, no rank holds any state, or
            ``timeout`` is not a positive number of seconds.
        rankguard.CollectiveError: a peer failed or did not answer within ``timeout``.
    """
    import torch
    import torch.distributed as dist

    if isinstance(step, bool) or not isinstance(step, int) or step < NO_STATE:
        raise UsageError("rankguard share(step)", f"expected a whole number >= {NO_STATE}, "
                         f"got {step!r}")
    seconds = check_seconds("rankguard share(timeout)", timeout, text=False)
    started = time.monotonic()
    with deadline(seconds):
        size = dist.get_world_size(group)
        on = _device(group)
        mine = torch.tensor([step], dtype=torch.int64, device=on)
        steps = [torch.zeros(1, dtype=torch.int64, device=on) for _ in range(size)]
        dist.all_gather(steps, mine, group=group)
        known = [int(t.item()) for t in steps]
        target = max(known)
        if target == NO_STATE:
            raise UsageError("rankguard share()", "no rank holds any state to share",
                             "start from a checkpoint (or from scratch) instead")
        source = known.index(target)
        receivers = tuple(r for r, s in enumerate(known) if s != target)
        rank = dist.get_rank(group)
        nbytes = 0
        if receivers and rank == source:
            payload = _serialize(get_state()).to(on)
            nbytes = payload.numel()
            length = torch.tensor([nbytes], dtype=torch.int64, device=on)
            for receiver in receivers:
                dist.send(length, _global(receiver, group), group=group)
                dist.send(payload, _global(receiver, group), group=group)
        elif rank in receivers:
            length = torch.zeros(1, dtype=torch.int64, device=on)
            dist.recv(length, _global(source, group), group=group)
            nbytes = int(length.item())
            payload = torch.empty(nbytes, dtype=torch.uint8, device=on)
            dist.recv(payload, _global(source, group), group=group)
            load_state(_deserialize(payload.cpu()))
    current().awaiting_state = False
    return Shared(target, source, receivers, nbytes, time.monotonic() - started)


def _device(group: Any) -> Any:
    """Where the exchange's tensors go: the current CUDA device on a group whose only backend
    is NCCL, else the CPU."""
    import torch
    import torch.distributed as dist

    if str(dist.get_backend(group)) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _global(rank: int, group: Any) -> int:
    """``rank`` of ``group`` as a rank of the default group (what send and recv take)."""
    import torch.distributed as dist

    return rank if group is None else dist.get_global_rank(group, rank)


def check_sendable(state: Any) -> None:
    """Check now that ``state`` could be sent to a peer (what :func:`share` would refuse at
    the first recovery), without copying its dense tensors' data: it is saved as
    :func:`share` saves it, except that each dense tensor or parameter, wherever it sits (in
    a container, in an object, in another tensor's attributes), is saved as a meta tensor of
    its shape that keeps its type and Python attributes. Other tensors (sparse, quantized,
    nested, subclasses such as DTensor) are saved as they are.

    Raises:
        UsageError: as :func:`_serialize`.
    """
    _saved(state, _ShapesOnly)


class _ShapesPickler(pickle.Pickler):
    """Pickles a dense tensor or parameter as a meta copy: the same type, dtype, shape and
    Python attributes, and no data (torch.save writes no storage for a meta tensor)."""

    def reducer_override(self, obj: Any) -> Any:
        import torch

        if type(obj) not in (torch.Tensor, torch.nn.Parameter) or obj.layout != torch.strided \
                or obj.is_meta or obj.is_quantized or obj.is_nested:
            return NotImplemented
        copy = obj.detach().to("meta")
        if type(obj) is torch.nn.Parameter:
            copy = torch.nn.Parameter(copy, requires_grad=obj.requires_grad)
        copy.__dict__.update(obj.__dict__)
        return copy.__reduce_ex__(pickle.DEFAULT_PROTOCOL)


class _ShapesOnly:
    """The ``pickle_module`` that :func:`check_sendable` gives ``torch.save``."""

    Pickler = _ShapesPickler


def _serialize(state: Any) -> Any:
    """``state`` as bytes, by ``torch.save``, checked to be what the receiver's
    ``torch.load(weights_only=True)`` accepts (loaded here onto the meta device: no tensor's
    data is copied), so that nothing is sent that a peer cannot load.

    Raises:
        UsageError: it holds what ``torch.save`` cannot save (a lambda, a lock, an open file),
            or what a weights-only load refuses (any other object than tensors, numbers,
            strings, and lists, tuples and dicts of them).
    """
    import torch

    return torch.frombuffer(bytearray(_saved(state).getvalue()), dtype=torch.uint8)


def _saved(state: Any, pickle_module: Any = pickle) -> io.BytesIO:
    """``state`` saved by ``torch.save`` (with ``pickle_module``) into memory and loaded back
    as a peer would, onto the meta device. Raises UsageError as :func:`_serialize`."""
    import torch

    buffer = io.BytesIO()
    try:
        torch.save(state, buffer, pickle_module=pickle_module)
        torch.load(io.BytesIO(buffer.getbuffer()), weights_only=True, map_location="meta")
    except Exception as error:  # noqa: BLE001 (pickle raises many kinds)
        raise UsageError("get_state()", f"the state cannot be sent to a peer "
                         f"({type(error).__name__}: {_reason(error)})", "return tensors, "
                         "numbers, strings, and lists and dicts of them") from error
    return buffer


def _reason(error: Exception) -> str:
    """The line of ``error`` that names what is wrong (torch's weights-only refusal is a
    paragraph of advice around one line: ``WeightsUnpickler error: Unsupported global...``)."""
    text, marker = str(error), "WeightsUnpickler error: "
    if marker not in text:
        return first_line(error)
    return text.split(marker, 1)[1].split(". ", 1)[0]


def _deserialize(payload: Any) -> Any:
    import torch

    return torch.load(io.BytesIO(payload.numpy().tobytes()), weights_only=True)
