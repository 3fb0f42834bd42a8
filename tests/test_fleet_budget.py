"""``top --prometheus`` under replies that stay under the byte cap but expand when decoded:
the reply budget (exporter.client.fleet.promapi.ReplyBudget) bounds the bytes in flight,
the values of a reply before it is decoded and what the answers kept hold, and says so
in the answer. bench/fleet_memory.py measures the peak RSS of the whole view."""

from __future__ import annotations

import gc
import gzip
import threading
import tracemalloc
import zlib

import pytest

from exporter.client.fetch import json_values
from exporter.client.fleet.promapi import (
    DEFAULT_MAX_VALUES,
    PrometheusAPI,
    ReplyBudget,
    _Failed,
    _Reading,
    parse_reply,
)
from tests.test_fleet_client import OK, Reply, answering, serving

HEAD = b'{"status":"success","data":{"resultType":"%s","result":['


def _dicts(mib: float) -> bytes:
    return HEAD % b"vector" + b",".join([b"{}"] * int(mib * (1 << 20) / 3)) + b"]}}"


def _points(n: int) -> bytes:
    values = b",".join(b'[%d,"1"]' % (1700000000 + i) for i in range(n))
    return HEAD % b"matrix" + b'{"metric":{"instance":"n"},"values":[' + values + b"]}]}}"


def _peak(call: object) -> tuple[object, float]:
    """(what ``call()`` returns, the peak MiB Python allocated meanwhile)."""
    tracemalloc.start()
    try:
        out = call()  # type: ignore[operator]
        return out, tracemalloc.get_traced_memory()[1] / (1 << 20)
    finally:
        tracemalloc.stop()


def test_a_reply_of_many_small_values_is_refused_before_it_is_decoded() -> None:
    """16 MiB of ``{}`` items took ``top`` to 1.0 GB RSS (48 MiB: 2.6 GB)."""
    body = _dicts(8)
    answer, peak = _peak(lambda: parse_reply("up", body))
    assert "JSON values, over the 400,000 one reply may hold" in (answer.error or "")
    assert peak < 1  # nothing decoded


def test_a_range_answer_of_millions_of_points_is_refused() -> None:
    """The series cap bounded series, not points: one series of millions of points took
    it to 870 MB."""
    answer = parse_reply("up", _points(DEFAULT_MAX_VALUES // 3 + 1000))
    assert not answer.ok and "JSON values" in (answer.error or "")
    within = parse_reply("up", _points(1000))
    assert within.ok and len(within.ranges[0].points) == 1000


def test_the_count_bounds_the_values_from_above() -> None:
    import json

    def count(doc: object) -> int:
        if isinstance(doc, dict):
            return 1 + sum(1 + count(v) for v in doc.values())
        if isinstance(doc, list):
            return 1 + sum(count(v) for v in doc)
        return 1

    for body in (OK, _points(50), b'{"a":[1,{"b":"c,d:[{"}],"e":{}}', b"[]", b"1"):
        assert json_values(body) >= count(json.loads(body)), body


def test_the_bytes_in_flight_are_one_budget() -> None:
    budget = ReplyBudget(max_bytes=1000)
    a, b = _Reading(budget), _Reading(budget)
    a.take(600)
    with pytest.raises(_Failed, match="the replies in flight hold more than"):
        b.take(600)
    with pytest.raises(_Failed, match="reply larger than"):
        a.take(600)
    a.close()
    b.take(600)  # given back: room again
    assert budget.bytes == 600
    b.close()
    assert budget.bytes == 0


def test_a_gzip_bomb_is_inflated_no_further_than_the_budget() -> None:
    """A gzip bomb reached 452 MiB."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    bomb = b"".join([*(deflate.compress(b" " * (1 << 20)) for _ in range(64)),
                     deflate.flush()])
    reply = Reply(body=bomb, headers={"Content-Encoding": "gzip"})
    with serving(lambda handler, form: reply) as s:
        api = PrometheusAPI(s.url, timeout=10, max_bytes=4 << 20)
        answer, peak = _peak(lambda: api.query("up"))
    assert "reply larger than 4 MiB" in (answer.error or "")
    assert peak < 12, peak
    assert api.budget.bytes == 0


def test_a_gzip_reply_within_the_budget_is_read() -> None:
    reply = Reply(body=gzip.compress(OK), headers={"Content-Encoding": "gzip"})
    with serving(lambda handler, form: reply) as s:
        assert PrometheusAPI(s.url).query("up").ok


def test_what_the_answers_kept_hold_is_bounded_and_given_back() -> None:
    body = HEAD % b"vector" + b",".join(
        b'{"metric":{"instance":"node-%d"},"value":[1,"1"]}' % i for i in range(2000)) + \
        b"]}}"
    with serving(answering(body)) as s:
        api = PrometheusAPI(s.url, budget=ReplyBudget(max_held=3 << 20))
        kept = [api.query("up") for _ in range(3)]
        assert [a.ok for a in kept] == [True, True, False]
        assert "the answers kept would hold more than 3 MiB" in (kept[2].error or "")
        assert api.budget.held == sum(a.held for a in kept[:2]) > 2 << 20
        del kept
        gc.collect()
        assert api.budget.held == 0  # dropped answers give their share back
        assert api.query("up").ok


def test_four_queries_at_once_share_the_budget() -> None:
    """Four queries in flight, each reply 40 % of the budget: the fleet view's PARALLEL."""
    body = HEAD % b"vector" + b" " * 400_000 + b"]}}"
    gate = threading.Barrier(4, timeout=5)

    def script(handler: object, form: dict[str, str]) -> Reply:
        gate.wait()  # all four in flight before any body is sent
        return Reply(body=body)

    with serving(script) as s:
        api = PrometheusAPI(s.url, timeout=10, max_bytes=1 << 20)
        seen: list[int] = []
        take = api.budget.take_bytes

        def counted(n: int) -> bool:
            ok = take(n)
            seen.append(api.budget.bytes)
            return ok

        api.budget.take_bytes = counted  # type: ignore[method-assign]
        answers: list[object] = []
        threads = [threading.Thread(target=lambda: answers.append(api.query("up")))
                   for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(15)
    errors = [a.error for a in answers if a.error]  # type: ignore[attr-defined]
    assert len(answers) == 4 and api.budget.bytes == 0
    assert all("in flight" in e or "larger than" in e for e in errors)
    assert max(seen) <= 1 << 20  # never more in flight than the budget


def test_history_keeps_no_more_points_than_it_asked_for() -> None:
    from exporter.client.fleet.nodes import load_history

    with serving(answering(_points(5000))) as s:
        history = load_history(PrometheusAPI(s.url), points=120)
    assert history.error is None and [len(p) for p in history.series.values()] == [120]


def test_top_of_one_daemon_refuses_a_reply_of_too_many_values() -> None:
    """The one-daemon view reads /api/v1/history the same way: 15 MiB of ``{}`` (under its
    16 MiB) would be 5 million dicts."""
    from exporter.client.top.command import _poller
    from exporter.client.top.model import Model, describe
    from tests import hostile

    posted: list[tuple[str, object]] = []

    class Once:
        stopped = False

        def post(self, kind: str, payload: object) -> None:
            posted.append((kind, payload))
            self.stopped = True

        def wait(self, seconds: float) -> None:
            pass

    with hostile.serving(hostile.reply(b"[" + b"{}," * (5 << 20) + b"{}]")) as server:
        _, peak = _peak(lambda: _poller(server.url, None, False, Model(),
                                        Once()))  # type: ignore[arg-type]
    (kind, error), = posted
    assert kind == "error" and isinstance(error, BaseException)
    assert "JSON values, over the 1,000,000" in describe(error)
    assert peak < 40  # the reply's bytes, never its decoded dicts
