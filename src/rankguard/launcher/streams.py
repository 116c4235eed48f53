"""Which local ranks' stdout and stderr reach the launcher's terminal: torchrun's ``--redirects``,
``--tee`` and ``--local-ranks-filter``, with torchrun's meaning.

Under torchrun a stream goes to the console unless it is redirected (``-r``) into a log file;
a teed stream (``-t``) goes to its log file and to the console; ``--local-ranks-filter`` keeps
the other local ranks off the console. rankguard always writes every stream into the rank's log
(``LOG_DIR/attemptN/rankR.log``), so only the console part of these flags has an effect here:
:meth:`TerminalStreams.shown` decides it, purely, for one local rank.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from ..errors import UsageError


class Std(enum.IntFlag):
    """A set of a rank's standard streams, numbered as torchrun numbers them."""

    NONE = 0
    OUT = 1
    ERR = 2
    ALL = OUT | ERR


@dataclass(frozen=True)
class StreamChoice:
    """One ``-r``/``-t`` value: the same streams for every local rank (``3``), or some local
    ranks' own (``0:3,1:2``; a local rank not named has none)."""

    every: Std = Std.NONE
    ranks: tuple[tuple[int, Std], ...] | None = None

    def of(self, local_rank: int) -> Std:
        """The streams chosen for ``local_rank``."""
        if self.ranks is None:
            return self.every
        return dict(self.ranks).get(local_rank, Std.NONE)


# torchrun's own forms (torch.distributed.elastic.multiprocessing.api): one digit 0-3, or
# LOCAL_RANK:DIGIT pairs; the local rank is one digit there, any number here
_VALUE = re.compile(r"[0-3]", re.ASCII)
_MAPPING = re.compile(r"[0-9]+:[0-3](?:,[0-9]+:[0-3])*", re.ASCII)


def parse_choice(option: str, text: str) -> StreamChoice:
    """``-r``/``-t`` as torchrun takes it: ``0`` none, ``1`` stdout, ``2`` stderr, ``3`` both,
    for every local rank, or per local rank (``0:3,1:2``).

    Raises:
        UsageError: any other text; names ``option``.
    """
    if _VALUE.fullmatch(text):
        return StreamChoice(Std(int(text)))
    if _MAPPING.fullmatch(text):
        pairs = [item.split(":") for item in text.split(",")]
        return StreamChoice(ranks=tuple((int(rank), Std(int(std))) for rank, std in pairs))
    raise UsageError(option, f"{text!r} is neither 0-3 nor LOCAL_RANK:0-3,...",
                     f"e.g. {option} 3 (stdout and stderr of every local rank: 1 stdout, "
                     f"2 stderr, 0 none) or {option} 0:3,1:2")


def parse_ranks(option: str, text: str) -> frozenset[int]:
    """``--local-ranks-filter 0,1,2`` as a set of local ranks.

    Raises:
        UsageError: not a comma-separated list of local ranks.
    """
    if not re.fullmatch(r"[0-9]+(?:,[0-9]+)*", text, re.ASCII):
        raise UsageError(option, f"{text!r} is not a comma-separated list of local ranks",
                         f"e.g. {option} 0,1")
    return frozenset(int(rank) for rank in text.split(","))


@dataclass(frozen=True)
class TerminalStreams:
    """What the terminal shows of each local rank's output (the logs always have it all)."""

    redirects: StreamChoice = StreamChoice()  # -r: to the log only
    tee: StreamChoice = StreamChoice()  # -t: to the log and the terminal
    local_ranks: frozenset[int] | None = None  # --local-ranks-filter; None: every local rank

    def shown(self, local_rank: int) -> Std:
        """The streams of ``local_rank`` that the terminal shows: those not redirected, or
        teed, when the filter lets the rank through. Pure."""
        if self.local_ranks is not None and local_rank not in self.local_ranks:
            return Std.NONE
        return Std.ALL & ~(self.redirects.of(local_rank) & ~self.tee.of(local_rank))

    def any_shown(self, nproc: int) -> bool:
        """Whether the terminal shows some output of local ranks 0 to ``nproc - 1``."""
        return any(self.shown(rank) for rank in range(nproc))
