"""Requests through the official client: the message of an API error,
creates retried over transient failures, and reading responses (to their
end, closed, line by line)."""
from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .connection import _Connection

CREATE_ATTEMPTS = 4


def api_message(exc) -> str:
    """The message of the Status an API error carries."""
    try:
        return json.loads(exc.body)["message"]
    except Exception:
        return f"{exc.status} {exc.reason}"


def _create(connection: _Connection, call, *args) -> None:
    """A create request, retried over transient failures (a lost connection,
    429, 5xx); a retry answered 409 found the object an earlier try made."""
    import urllib3
    ApiException = connection.client_module.ApiException
    for attempt in range(CREATE_ATTEMPTS):
        last = attempt == CREATE_ATTEMPTS - 1
        try:
            _consume(call(*args, _preload_content=False))
            return
        except ApiException as exc:
            if exc.status == 409 and attempt > 0:
                return
            if exc.status not in (429, 500, 502, 503, 504) or last:
                raise
        except (OSError, urllib3.exceptions.HTTPError) as exc:
            if last:
                raise RuntimeError(f"the kubernetes API server at {connection.host} is unreachable: {exc!r}") from None
        time.sleep(0.5 * 2 ** attempt)


def _consume(response) -> None:
    """Read a response to its end, so its connection can carry the next request."""
    try:
        _ = response.data
    finally:
        response.release_conn()


def _close(response) -> None:
    """Done with a streamed response, read to its end or not."""
    try:
        response.close()
        response.release_conn()
    except Exception:
        pass


def _lines(response):
    """The newline-delimited lines of a streamed response."""
    buffer = b""
    for chunk in response.stream(amt=None, decode_content=False):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            yield line.decode("utf-8", "replace")
    if buffer:
        yield buffer.decode("utf-8", "replace")
