"""The bound on request-body bytes ``rankguard serve`` holds at once (pure)."""

from __future__ import annotations

import pytest

from rankguard.serving.inflight_bytes import BodyBytes, InflightBytes


def test_bodies_take_their_bytes_as_they_grow_and_a_body_that_does_not_fit_takes_none() -> None:
    shared = InflightBytes(100)
    first, second = BodyBytes(shared), BodyBytes(shared)
    assert first.cover(30) and first.cover(60) and first.cover(50)  # a size never shrinks it
    assert (first.taken, shared.held) == (60, 60)
    assert second.cover(40) and shared.held == 100
    assert not second.cover(41)  # one byte more than the limit: refused whole
    assert (second.taken, shared.held) == (40, 100)
    first.close()
    first.close()  # once given back, closing again gives nothing
    assert shared.held == 40
    assert second.cover(100) and shared.held == 100  # the limit itself fits
    second.close()
    assert shared.held == 0


def test_fits_says_whether_bytes_would_fit_and_takes_none() -> None:
    shared = InflightBytes(100)
    assert BodyBytes(shared).cover(60)
    assert shared.fits(40) and not shared.fits(41)
    assert shared.held == 60


def test_a_limit_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="must be positive, got 0"):
        InflightBytes(0)
