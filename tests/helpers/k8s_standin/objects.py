"""What every part of the stand-in writes into API objects: the one node's
name and IP, timestamps, Status objects, and the errors answered with one."""
from __future__ import annotations

import datetime

NODE = "standin-node"
POD_IP = "127.0.0.1"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_object(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message
