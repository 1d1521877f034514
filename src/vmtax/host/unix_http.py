"""HTTP over a UNIX socket: the APIs of daemons and VMMs that serve one there (LXD,
Firecracker, Cloud Hypervisor). One request per connection, JSON in and out."""

from __future__ import annotations

import http.client
import json
import os
import socket
from typing import Any


class UnixConnection(http.client.HTTPConnection):
    """An HTTP connection to the server listening on the UNIX socket at path."""

    def __init__(self, path: str | os.PathLike[str], timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = str(path)

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class ApiError(Exception):
    """The API answered with an error status; the message is its own, or the status."""


def request(path: str, method: str, url: str, body: Any = None,
            timeout: float = 5.0) -> Any:
    """The decoded JSON answer to one request (None for an empty one); ApiError for a
    status of 300 or more, OSError when nothing answers on path."""
    conn = UnixConnection(path, timeout)
    try:
        payload = None if body is None else json.dumps(body)
        headers = {"Accept": "application/json"}
        if payload is not None:
            headers["Content-Type"] = "application/json"
        conn.request(method, url, body=payload, headers=headers)
        answer = conn.getresponse()
        text = answer.read().decode(errors="replace")
    except http.client.HTTPException as exc:
        raise OSError(f"bad HTTP answer on {path}: {exc}") from None
    finally:
        conn.close()
    data: Any = None
    if text.strip():
        try:
            data = json.loads(text)
        except ValueError:
            data = text.strip()
    if answer.status >= 300:
        said = data.get("fault_message") if isinstance(data, dict) else data
        raise ApiError(f"{method} {url}: {answer.status} {said or answer.reason}")
    return data
