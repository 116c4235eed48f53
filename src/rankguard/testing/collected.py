"""Whether the ranks of a suite every rank runs collected the same tests: the pure part.

Under a launcher every rank collects the suite by itself, and the plugin pairs each rank's
tests with its peers' by their order: a rank whose selection differs (another ``-k``, a test
generated from a rank-dependent parameter, a random order) would pair its test A's collectives
with a peer's test B's. Before the first test, each rank brings a :class:`Collected` (a short
fingerprint of its test ids in their order, and its collection errors) to a store barrier
(``session.EveryRank``); when they do not :func:`agree`, the ranks exchange their lists and
every rank stops with the same words (:func:`difference`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

FIX = ("run every rank with the same selection (the same files, -k, -m and --lf, no per-rank "
       "deselection, parameters or random order)")


def ranks_text(ranks: Sequence[int]) -> str:
    """``rank 1`` or ``ranks 1, 2``."""
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def digest(nodeids: Sequence[str]) -> str:
    """A short fingerprint of test ids in their order: ranks that agree on it can meet at a
    test by its position. The ids are written as a JSON list: an id may hold a newline
    (pytest's id escaping can be turned off), so no separator joins them unambiguously."""
    return hashlib.sha256(json.dumps(list(nodeids)).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Collected:
    """What a rank brings to the comparison: the fingerprint of its test ids (``digest``),
    how many there are, and how many errors its collection had (a rank with errors stops)."""

    digest: str
    count: int
    errors: int

    @classmethod
    def of(cls, nodeids: Sequence[str], errors: int) -> Collected:
        return cls(digest(nodeids), len(nodeids), errors)

    def dumps(self) -> str:
        return json.dumps([self.digest, self.count, self.errors])

    @classmethod
    def loads(cls, text: str) -> Collected:
        """Raises ValueError (a JSONDecodeError or TypeError's) for text :meth:`dumps` did not
        write."""
        try:
            found, count, errors = json.loads(text)
            return cls(str(found), int(count), int(errors))
        except (TypeError, ValueError) as error:
            raise ValueError(f"not a collection fingerprint: {text[:80]!r}") from error


def agree(brought: Mapping[int, Collected]) -> bool:
    """Whether every rank collected the same tests in the same order, with as many errors."""
    return len({(c.digest, c.errors) for c in brought.values()}) <= 1


def difference(tests: Mapping[int, Sequence[str]], errors: Mapping[int, int]) -> str:
    """How the ranks' collections differ, in the words every rank stops with: each set of ranks
    that collected alike against the one of the lowest rank (its count, and the first index
    where their lists differ, with what each has there; and the collection errors, where
    they differ)."""
    kinds: dict[tuple[tuple[str, ...], int], list[int]] = {}
    for rank in sorted(tests):
        kinds.setdefault((tuple(tests[rank]), errors.get(rank, 0)), []).append(rank)
    (reference, reference_errors), *_ = kinds
    first = kinds[(reference, reference_errors)]
    parts = []
    for (other, other_errors), ranks in kinds.items():
        if ranks is first:
            continue
        if other != reference:
            index = next((i for i, (a, b) in enumerate(zip(reference, other)) if a != b),
                         min(len(reference), len(other)))
            parts.append(f"{ranks_text(ranks)} collected {_tests(len(other))}, "
                         f"{ranks_text(first)} {len(reference)}: first difference at index "
                         f"{index}: {ranks_text(first)} {'has' if len(first) == 1 else 'have'} "
                         f"{_at(reference, index)}, {ranks_text(ranks)} {_at(other, index)}")
        if other_errors != reference_errors:
            parts.append(f"{ranks_text(ranks)} had {_errors(other_errors)} during collection, "
                         f"{ranks_text(first)} {_errors(reference_errors)}")
    return "; ".join(parts) + f"; {FIX}"


def _errors(count: int) -> str:
    return "no errors" if count == 0 else f"{count} error{'s' if count > 1 else ''}"


def _tests(count: int) -> str:
    return f"{count} test{'s' if count != 1 else ''}"


def _at(tests: Sequence[str], index: int) -> str:
    return tests[index] if index < len(tests) else "no test there (its list ends)"
