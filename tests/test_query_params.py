"""``/api/v1/history``'s query parameters: whatever a client sends, the answer is 200 or
400, never a 500 with a traceback in the log (exporter.serve.untrusted's readers)."""

from __future__ import annotations

import asyncio
import math
import urllib.parse
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from exporter.core.config import Config
from exporter.output.render.exposition import Renderer
from exporter.pipeline.hub import Hub
from exporter.serve.server import build_app
from exporter.serve.untrusted import MAX_PARAM, param_count, param_number
from exporter.serve.view import MAX_ROWS


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.AsyncClient]:
    hub = Hub(Config(), [])
    renderer = Renderer()
    renderer.render_now(hub.collect_once())
    app = build_app(Config(), hub, renderer)
    yield httpx.AsyncClient(transport=httpx.ASGITransport(app=app),  # type: ignore[arg-type]
                            base_url="http://x")


def _status(client: httpx.AsyncClient, query: str) -> int:
    async def get() -> int:
        return (await client.get(f"/api/v1/history?{query}")).status_code
    return asyncio.run(get())


@pytest.mark.parametrize("value", ["²", "١٢", "9" * 5000, "1" * 4301, "0x10", " 1", "1.0",
                                   "+1", "-0", "1e2", "\u0661"])
def test_processes_that_is_not_ascii_digits_is_a_400(client: httpx.AsyncClient,
                                                     value: str) -> None:
    """``processes=²`` passed str.isdigit and raised in int(): a 500 and a traceback."""
    with capture_logs() as logs:
        status = _status(client, "processes=" + urllib.parse.quote(value))
    assert status == 400
    assert not [e for e in logs if e.get("log_level") in ("error", "critical")]


@pytest.mark.parametrize("value", ["9" * 5000, "nan", "inf", "-inf", "1e999", "", "x"])
def test_since_that_is_not_a_finite_time_is_a_400(client: httpx.AsyncClient,
                                                  value: str) -> None:
    assert _status(client, "since=" + urllib.parse.quote(value)) == 400


def test_good_values_are_answered(client: httpx.AsyncClient) -> None:
    for query in ("", "processes=0", f"processes={MAX_ROWS}", "since=1700000000.5",
                  "since=0&processes=3"):
        assert _status(client, query) == 200, query


# ------------------------------------------------------------ the readers, as properties

@given(st.one_of(st.none(), st.text(max_size=40), st.from_regex(r"[0-9]{1,30}",
                                                                fullmatch=True)),
       st.integers(0, 10**6))
def test_param_count_is_in_range_or_none(raw: str | None, high: int) -> None:
    value = param_count(raw, 7, high)
    if raw is None:
        assert value == 7
    elif value is not None:
        assert type(value) is int and 0 <= value <= high and raw.isascii()
        assert value == int(raw)


@given(st.one_of(st.none(), st.text(max_size=2 * MAX_PARAM),
                 st.floats().map(repr), st.integers().map(str)))
def test_param_number_is_finite_or_none(raw: str | None) -> None:
    value = param_number(raw, 0.0)
    assert value is None or (type(value) is float and math.isfinite(value))
    if raw is not None and value is not None:
        assert len(raw) <= MAX_PARAM
