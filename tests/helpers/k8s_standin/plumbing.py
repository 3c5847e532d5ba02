"""HTTP plumbing under the stand-in's handler: request bodies, JSON answers
(or none, for an injected fault), and chunked streams."""
from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .server import StandIn


def _truthy(value: str | None) -> bool:
    """A boolean query parameter as the API server parses it (Go's strconv.ParseBool)."""
    return value in ("1", "t", "T", "true", "TRUE", "True")


class _Plumbing(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_standin: StandIn

    def log_message(self, format, *args):  # quiet
        pass

    def handle(self):
        try:
            super().handle()
        except (ConnectionResetError, BrokenPipeError):
            pass  # a client closed its connection

    # --- plumbing -----------------------------------------------------------------
    def _body(self):
        length = int(self.headers.get("Content-Length") or 0)
        if not length:
            return None
        raw = self.rfile.read(length)
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

    def _send(self, code: int, obj, content_type: str = "application/json") -> None:
        if getattr(self, "_drop", False):  # an injected fault: done, but no answer
            self.close_connection = True
            return
        data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _start_stream(self, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    def _end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
