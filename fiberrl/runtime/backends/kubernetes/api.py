"""Responses of the official client: the message of an API error, and
reading responses (as JSON, to their end, closed, line by line)."""
from __future__ import annotations

import json


def api_message(exc) -> str:
    """The message of the Status an API error carries."""
    try:
        return json.loads(exc.body)["message"]
    except Exception:
        return f"{exc.status} {exc.reason}"


def read_json(response) -> dict:
    """The JSON body of a response read whole, its connection released."""
    try:
        return json.loads(response.data)
    finally:
        response.release_conn()


def consume(response) -> None:
    """Read a response to its end, so its connection can carry the next request."""
    try:
        _ = response.data
    finally:
        response.release_conn()


def close_streamed(response) -> None:
    """Done with a streamed response, read to its end or not."""
    try:
        response.close()
        response.release_conn()
    except Exception:
        pass


def streamed_lines(response):
    """The newline-delimited lines of a streamed response."""
    buffer = b""
    for chunk in response.stream(amt=None, decode_content=False):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            yield line.decode("utf-8", "replace")
    if buffer:
        yield buffer.decode("utf-8", "replace")
