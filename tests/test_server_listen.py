"""Where the daemon listens (issue 27, item 11): ``:port`` is dual-stack like Go's
servers (node_exporter's ``:9100``), ``0.0.0.0:port`` stays IPv4 only."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest

from exporter.serve.server import bind_sockets
from tests.daemon import free_port, running
from tests.test_server import no_gpu_args


def _has_ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


needs_ipv6 = pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 on this host")


def _connects(family: socket.AddressFamily, host: str, port: int) -> bool:
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        try:
            s.connect((host, port))
        except OSError:
            return False
        return True


@pytest.mark.slow
@needs_ipv6
def test_a_port_without_a_host_listens_on_ipv6_and_ipv4(tmp_path: Path) -> None:
    """27.11: ``:9445`` bound 0.0.0.0 only: [::1]:9445 and IPv6-only clusters could
    not reach it."""
    port = free_port()
    with running([*no_gpu_args(tmp_path), "--web.listen-address", f":{port}"],
                 tmp_path) as d:
        v6 = httpx.get(f"http://[::1]:{port}/-/healthy", timeout=5)
        v4 = httpx.get(f"http://127.0.0.1:{port}/-/healthy", timeout=5)
        assert d.get("/-/healthy").status_code == 200  # the tests' own 127.0.0.1 address
    assert (v6.status_code, v4.status_code) == (200, 200)


@needs_ipv6
def test_explicit_addresses_keep_their_family() -> None:
    (any4,) = bind_sockets(("0.0.0.0:0",))
    (loop6,) = bind_sockets(("[::1]:0",))
    (any6,) = bind_sockets(("[::]:0",))
    try:
        p4, p6, pany = (s.getsockname()[1] for s in (any4, loop6, any6))
        assert _connects(socket.AF_INET, "127.0.0.1", p4)
        assert not _connects(socket.AF_INET6, "::1", p4)  # 0.0.0.0: IPv4 only
        assert _connects(socket.AF_INET6, "::1", p6)
        assert _connects(socket.AF_INET, "127.0.0.1", pany)  # [::]: both, like ":port"
        assert _connects(socket.AF_INET6, "::1", pany)
    finally:
        for s in (any4, loop6, any6):
            s.close()
