"""What a rank makes of a ``POST /run`` body (``serving.request_body``): the request, or the
same refusal on every rank, never an exception (which would be a rank's fault)."""

from __future__ import annotations

from typing import Any

import pytest

from rankguard.serving.request_body import Refused, parse, serve


def picky(request: dict[str, Any]) -> dict[str, Any]:
    if "n" not in request:
        raise ValueError("'n' is missing")
    if request["n"] == "bug":
        raise KeyError("oops")
    if request["n"] == "forgot":
        return None  # type: ignore[return-value]  (a validate that forgets to return)
    if request["n"] == "answered":
        return True  # type: ignore[return-value]  (a validate that says "it is valid")
    return {**request, "checked": True}


def echo(state: Any, request: dict[str, Any]) -> Any:
    return state, request


REFUSED = {  # body -> (status, kind, a part of the detail)
    b'{"x": ': (400, "BadRequest", "not valid JSON"),
    b"\xff\xfe": (400, "BadRequest", "not UTF-8 (invalid start byte at byte 0)"),
    '{"n": 1}'.encode("utf-16"): (400, "BadRequest", "send JSON encoded as UTF-8"),
    '{"n": 1}'.encode("utf-32-le"): (400, "BadRequest", "not valid JSON"),  # UTF-8 NULs
    '\ufeff{"n": 1}'.encode(): (400, "BadRequest", "not valid JSON"),  # a byte order mark
    b"[" * 100_000 + b"]" * 100_000: (400, "BadRequest", "nested too deeply"),
    b'{"n": ' + b"9" * 5000 + b"}": (400, "BadRequest", "not valid JSON"),
    b'{"n": NaN}': (422, "InvalidRequest", "NaN"),
    b'{"n": -Infinity}': (422, "InvalidRequest", "-Infinity"),
    b'{"n": 1e400}': (422, "InvalidRequest", "1e400"),
    b"[1, 2]": (422, "InvalidRequest", "must be a JSON object, got list"),
    b"{}": (422, "InvalidRequest", "'n' is missing"),
    b'{"n": "bug"}': (500, "ValidateFailed", "validate raised KeyError"),
    b'{"n": "forgot"}': (500, "ValidateFailed", "validate returned None"),
    b'{"n": "answered"}': (500, "ValidateFailed", "validate returned True"),
}


@pytest.mark.parametrize("body", REFUSED, ids=lambda body: repr(body[:20]))
def test_a_body_that_is_not_a_valid_request_is_refused_with_its_status_not_raised(
        body: bytes) -> None:
    refused = serve("state", body, echo, picky)
    status, kind, detail = REFUSED[body]
    assert isinstance(refused, Refused), refused
    assert (refused.status, refused.kind) == (status, kind)
    assert detail in refused.detail
    assert refused.error_type == ("KeyError" if "raised" in detail else None)


def test_a_valid_body_reaches_handle_as_validate_returned_it() -> None:
    assert serve("state", b'{"n": 1.5}', echo, picky) == ("state", {"n": 1.5, "checked": True})
    assert serve("state", b'{"deep": ' + b"[" * 900 + b"]" * 900 + b"}", echo, None)[0] == "state"
    assert parse(b'{"n": [1, 2]}') == {"n": [1, 2]}
