"""A ``POST /run`` body, made into the service's request where it runs: in every rank.

The server sends each rank the body's raw bytes; each rank parses them (JSON, an object, no
NaN or infinity), runs the service's ``validate`` and then its ``handle`` (:func:`serve`). The
server does no work per byte of a body beyond reading it, so that:

- its event loop and its GIL stay free to answer every request by its deadline: parsed in the
  server, 40 clients sending 1 MiB bodies of small lists kept its one GIL busy for seconds at
  a time (a parse took 0.1 to 1 s here, pickling the parsed body for the ranks as long), and
  answers came 2 to 12 s past their 5 s deadline while ``GET /livez`` took 7 s;
- the memory it holds is the raw bytes, which ``--max-inflight-bytes`` bounds (parsed, such
  JSON takes about 20 times its bytes: the server held 1 GB);
- parsing costs rank time, which the pool's deadline bounds and its queue admits: at most one
  body is parsed per replica at a time, and a request that waits too long for a replica is
  answered 503 (busy) at its deadline.

A request the body or ``validate`` refuses is not a rank's fault: every rank reaches the same
:class:`Refused` from the same bytes before any collective, and returns it as its result; the
replica serves again at once, and the server answers it with its status. The price: a refused
request holds a replica for the time its ranks take to parse it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Callable

Handle = Callable[[Any, dict[str, Any]], Any]
Validate = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class Refused:
    """A request refused before ``handle`` ran: answered with HTTP ``status``, error ``kind``
    and ``detail``; ``error_type``: the class name of what ``validate`` raised, for a 500."""

    status: int
    kind: str
    detail: str
    error_type: str | None = None


class _NotFinite(ValueError):
    """A number in the body that JSON cannot carry back (NaN, an infinity)."""


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(text)
    return value


def _not_finite(text: str) -> float:
    raise _NotFinite(text)


def parse(raw: bytes) -> dict[str, Any] | Refused:
    """The request that ``raw`` holds, or why it is refused: 400 not UTF-8 (JSON between
    systems is UTF-8, RFC 8259; Python's json would take UTF-16 and UTF-32 as well), not JSON
    (an integer too long to read) or nested too deeply; 422 NaN or an infinity, or not an
    object."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return Refused(400, "BadRequest", f"the body is not UTF-8 ({error.reason} at byte "
                       f"{error.start}): send JSON encoded as UTF-8")
    try:
        body = json.loads(text, parse_float=_finite, parse_constant=_not_finite)
    except _NotFinite as error:
        return Refused(422, "InvalidRequest", f"the body holds {error}, a number that JSON "
                       "cannot carry (NaN and infinities are not JSON)")
    except ValueError as error:
        return Refused(400, "BadRequest", f"the body is not valid JSON: {error}")
    except RecursionError:
        return Refused(400, "BadRequest", "the body's JSON is nested too deeply")
    if not isinstance(body, dict):
        return Refused(422, "InvalidRequest",
                       f"the body must be a JSON object, got {type(body).__name__}")
    return body


def validated(request: dict[str, Any], validate: Validate | None) -> dict[str, Any] | Refused:
    """``validate(request)``, or why it refused: 422 it raised ValueError or TypeError, 500
    ``ValidateFailed`` another error, or it returned None or a bool, not the request (it forgot
    to return it, or answered "is it valid?"), both bugs of the service's: ``handle`` would
    fail on every rank, a fault of each."""
    if validate is None:
        return request
    try:
        checked = validate(request)
    except (ValueError, TypeError) as error:
        return Refused(422, "InvalidRequest", str(error))
    except Exception as error:  # noqa: BLE001 (a bug of the service's, answered)
        kind = type(error).__name__
        return Refused(500, "ValidateFailed", f"the service's validate raised {kind}: {error} "
                       "(it refuses a request by raising ValueError or TypeError: 422)",
                       error_type=kind)
    if checked is None or isinstance(checked, bool):  # it forgot to return, or said "valid?"
        return Refused(500, "ValidateFailed", f"the service's validate returned {checked!r}: it "
                       "must return the request (and raise ValueError or TypeError to refuse "
                       "it: 422)")
    return checked


def serve(state: Any, raw: bytes, handle: Handle, validate: Validate | None) -> Any:
    """What each rank runs for a request (through ``Pool.run``): ``handle(state, request)``
    for the request ``raw`` holds once ``validate`` accepted it; else the :class:`Refused`."""
    request = parse(raw)
    if not isinstance(request, Refused):
        request = validated(request, validate)
    if isinstance(request, Refused):
        return request
    return handle(state, request)
