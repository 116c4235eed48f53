"""Requests that are not valid HTTP/1.1, answered as JSON like every other error of
``rankguard serve``.

uvicorn answers a malformed request line, header or chunked body with a plain-text 400
("Invalid HTTP request received."). Where the malformed bytes came after the server had
answered the request they belong to (a 404 or 405 answered before its body was read, then a
bad chunk), its 400 could not be sent at all: h11 refused it, and asyncio logged a traceback
("Fatal error: protocol.data_received() call failed") for every such connection, a log any
client could fill. :func:`protocol` answers ``{"error": {"type": "BadRequest", "detail"}}``
and closes the connection, or, when the request was already answered, only closes it.

A request with ``Connection: Upgrade`` (this server has no WebSocket route: it is served as
plain HTTP) made uvicorn log two warnings, one advising to install a WebSocket library: one
keep-alive connection had 6000 lines logged a second. :class:`QuietUpgrades` drops them.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import h11

BODY = json.dumps({"error": {"type": "BadRequest", "detail": (
    "the request is not valid HTTP/1.1 (its request line, a header, or its chunked body); the "
    "connection is closed")}}).encode()
HEADERS = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(BODY)),
           (b"connection", b"close")]


def protocol(h11_protocol: type) -> type:
    """A subclass of uvicorn's ``H11Protocol`` (``h11_protocol``) whose answer to a request
    that is not valid HTTP/1.1 is JSON (see the module); it never raises."""

    class JsonBadRequest(h11_protocol):  # type: ignore[misc,valid-type]
        def send_400_response(self, msg: str) -> None:
            conn: Any = self.conn
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):  # nothing answered yet
                for event in (h11.Response(status_code=400, headers=HEADERS,
                                           reason=b"Bad Request"),
                              h11.Data(data=BODY), h11.EndOfMessage()):
                    self.transport.write(conn.send(event))
            self.transport.close()

    return JsonBadRequest


_UPGRADE_WARNINGS = ("Unsupported upgrade request.", "No supported WebSocket library detected.")


class QuietUpgrades(logging.Filter):
    """For uvicorn's ``uvicorn.error`` logger: drops the warnings any client can cause per
    request by sending an Upgrade header (see the module)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(_UPGRADE_WARNINGS)
