"""Sealed values, value by value: what ``unseal`` accepts and what it drops."""

from __future__ import annotations

import pytest

from rankguard.store import sealed

SECRET = "ab" * 32


@pytest.fixture
def with_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(sealed.ENV, SECRET)
    monkeypatch.delenv(sealed.NAMESPACE_ENV, raising=False)


def test_a_sealed_value_opens_only_under_its_own_name(with_secret: None) -> None:
    value = sealed.seal("rankguard/probe/g0/1", '{"id": "1"}')
    assert sealed.unseal("rankguard/probe/g0/1", value) == '{"id": "1"}'
    assert sealed.unseal("rankguard/probe/g1/1", value) is None  # moved to another generation
    assert sealed.unseal("rankguard/probe/g0/1", value.encode()) == '{"id": "1"}'


@pytest.mark.parametrize("forged", ['{"stop": true}', "-.{}", ".{}", "0" * 64 + ".{}",
                                    "\u00e9\u00e9.{}", b"\xff\xfe.{}", ""])
def test_values_without_a_valid_seal_are_dropped_and_counted(with_secret: None,
                                                             forged: str | bytes) -> None:
    before = sealed.dropped()
    assert sealed.unseal("rankguard/probe/g0/1", forged) is None
    assert sealed.dropped() == before + 1


def test_another_secret_or_another_attempt_makes_another_key(
        with_secret: None, monkeypatch: pytest.MonkeyPatch) -> None:
    value = sealed.seal("k", "v")
    monkeypatch.setenv(sealed.NAMESPACE_ENV, "/rankguard/run/attempt1/")
    assert sealed.unseal("k", value) is None
    monkeypatch.setenv(sealed.NAMESPACE_ENV, "")
    monkeypatch.setenv(sealed.ENV, "cd" * 32)
    assert sealed.unseal("k", value) is None
