"""gRPC over a unix socket: the one place grpcio is imported and its errors are named.

grpcio and protobuf are imported only when a kubernetes client is created, so a
daemon with the kubernetes backend off never loads them (they cost several MB of
resident memory). Every failed call becomes ``RpcFailed`` with a short reason for
logs and ``/snapshot``: ``socket ... not found``, ``unavailable: ...``,
``timed out after 1s``, ``unimplemented``. The reason is a stable class of the error
(``not a gRPC server``, ``connection refused``...), never grpc's raw text: that embeds
whatever a broken peer sent (``got frame type 177``), and the collector logs a
"backend down" line each time the reason changes.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from typing import Any

CALL_TIMEOUT = 1.0  # seconds; both servers answer from memory in milliseconds
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # a node with thousands of containers; grpc's default is 4 MiB


# grpc's error text (core's connectivity and HTTP/2 parser messages) -> a stable class; first match.
_CLASSES = (
    ("http1.x server", "an HTTP/1 server, not gRPC"),
    ("Failed parsing HTTP/2", "not a gRPC server (bad HTTP/2 frames)"),
    ("Connection refused", "connection refused"),
    ("Connection reset", "connection closed by the peer"),
    ("Socket closed", "connection closed by the peer"),
    ("Broken pipe", "connection closed by the peer"),
    ("Permission denied", "permission denied"),
    ("No such file", "socket not found"),
)


def classify(details: str, path: str) -> str:
    """A reason that stays the same while the failure does: a known class, else grpc's
    text without the socket path and with every number masked."""
    for needle, reason in _CLASSES:
        if needle in details:
            return reason
    return re.sub(r"\d+", "N", details.replace(path, "")).strip(" :")[:160]


class RpcFailed(Exception):
    """A call did not complete. ``code`` is the gRPC status name (``UNAVAILABLE``, ...)."""

    def __init__(self, reason: str, code: str = "") -> None:
        super().__init__(reason)
        self.code = code


def is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def import_grpc() -> Any:
    """The grpc module; RpcFailed with an install hint where it is missing."""
    try:
        import grpc
    except ImportError as e:  # pragma: no cover - both are runtime dependencies
        raise RpcFailed(f"grpcio/protobuf not importable ({e}): pip install grpcio protobuf") from e
    return grpc


class UnixChannel:
    """One gRPC channel to a unix socket, and typed unary calls on it."""

    def __init__(self, path: str, timeout: float = CALL_TIMEOUT) -> None:
        self.path = path
        self.timeout = timeout
        self._grpc = import_grpc()
        self.channel = self._grpc.insecure_channel(
            f"unix://{os.path.abspath(path)}",
            options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                     ("grpc.enable_http_proxy", 0)])

    def call(self, method: Callable[..., Any], request: Any) -> Any:
        """``method`` (a generated stub's bound method) on ``request``; raises RpcFailed."""
        if not is_socket(self.path):
            raise RpcFailed(f"socket {self.path} not found", "UNAVAILABLE")
        try:
            return method(request, timeout=self.timeout)
        except self._grpc.RpcError as e:
            raise self._failure(e) from None

    def _failure(self, e: Any) -> RpcFailed:
        code = e.code() if callable(getattr(e, "code", None)) else None
        name = getattr(code, "name", "UNKNOWN")
        if name == "DEADLINE_EXCEEDED":
            return RpcFailed(f"{self.path}: timed out after {self.timeout:g}s", name)
        details = e.details() if callable(getattr(e, "details", None)) else ""
        reason = classify(details if isinstance(details, str) else "", self.path)
        return RpcFailed(f"{self.path}: {name.lower()}: {reason}".rstrip(": "), name)

    def close(self) -> None:
        self.channel.close()
