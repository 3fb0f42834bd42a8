"""``top --prometheus``'s peak memory when the server's replies are hostile.

    python bench/fleet_memory.py [--repo PATH] [--kinds NAME ...] [--timeout 120]

A local server answers every query (instant and range) with one reply kind; a fresh
child process, with the fleet view's modules loaded (rich included), runs what the view
runs for one screen: ``load_fleet`` (its ~13 queries, four in flight), then ``load_node``
and ``load_history`` for a node. The child's peak RSS (``ru_maxrss``) is printed per kind,
with what the loads said. Every hostile body stays under the 64 MiB a reply was allowed
before the reply budget (exporter.client.fleet.promapi.ReplyBudget):

- ``baseline``: an empty vector (the modules and threads alone);
- ``nodes-4k``: a real answer, one series per node for a fleet of 4,000 nodes;
- ``dicts-15M`` / ``dicts-16M`` / ``dicts-48M``: a vector of 15 / 16 / 48 MiB of ``{}``
  items (the first within the reply budget's bytes, not its values);
- ``nested-390k``: just under the values one reply may hold, as nested one-key objects;
- ``points-3M`` / ``points-130k``: a range answer of one series with three million /
  130,000 points (the second within every cap, for every query);
- ``label-60M`` / ``label-15M``: one series whose label value is 60 / 15 MiB long;
- ``gzip-bomb``: 512 MiB of spaces gzipped to about 0.5 MiB.

``--repo`` runs another checkout's client (the code before a change) against the same
replies, so the figures compare. Loopback only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
HEAD = b'{"status":"success","data":{"resultType":"%s","result":['
TAIL = b"]}}"


def _vector(items: bytes) -> bytes:
    return HEAD % b"vector" + items + TAIL


def baseline() -> bytes:
    return _vector(b"")


def fleet(nodes: int = 4_000) -> bytes:
    """What a fleet load's queries answer (one series per node, ``by (instance)``)."""
    return _vector(b",".join(b'{"metric":{"instance":"node-%d:9400"},"value":[1700000000.5,'
                             b'"0.75"]}' % i for i in range(nodes)))


def dicts(mib: int) -> Callable[[], bytes]:
    return lambda: _vector(b",".join([b"{}"] * ((mib << 20) // 3)))


def nested(n: int = 130_000) -> bytes:
    """Just under the values a reply may hold, in the costliest shape (one-key objects)."""
    return _vector(b",".join([b'{"a":{"b":{}}}'] * (n // 2)))


def points(n: int = 3_000_000) -> bytes:
    values = b",".join(b'[%d,"1"]' % (1700000000 + i) for i in range(n))
    return HEAD % b"matrix" + b'{"metric":{"instance":"n"},"values":[' + values + b"]}" + TAIL


def long_label(mib: int = 60) -> bytes:
    return _vector(b'{"metric":{"instance":"' + b"x" * (mib << 20) +
                   b'"},"value":[1700000000,"1"]}')


def gzip_bomb(mib: int = 512) -> bytes:
    deflate = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = b" " * (1 << 20)
    return b"".join([*(deflate.compress(block) for _ in range(mib)), deflate.flush()])


KINDS: dict[str, tuple[Callable[[], bytes], dict[str, str]]] = {
    "baseline": (baseline, {}),
    "nodes-4k": (fleet, {}),
    "dicts-16M": (dicts(16), {}),
    "dicts-48M": (dicts(48), {}),
    "dicts-15M": (dicts(15), {}),
    "nested-390k": (nested, {}),
    "points-3M": (points, {}),
    "points-130k": (lambda: points(130_000), {}),
    "label-60M": (long_label, {}),
    "label-15M": (lambda: long_label(15), {}),
    "gzip-bomb": (gzip_bomb, {"Content-Encoding": "gzip"}),
}

CHILD = """
import json, sys
import exporter.client.fleet.command, exporter.client.fleet.screen  # the view, rich with it
from exporter.client.fleet.nodes import load_fleet, load_history, load_node
from exporter.client.fleet.promapi import PrometheusAPI

api = PrometheusAPI(sys.argv[1], timeout=float(sys.argv[2]))
fleet = load_fleet(api)
node = load_node(api, "node-1")
history = load_history(api, "node-1")
said = sorted({e.split(": ", 1)[-1][:90] for e in (*fleet.errors, *node.errors)}
              | ({history.error[:90]} if history.error else set()))
# VmHWM, not ru_maxrss: that one starts from the parent's size at fork (the bench's bodies)
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
print(json.dumps({"peak_mib": hwm / 1024,
                  "nodes": len(fleet.nodes), "said": said}))
"""


def serve(body: bytes, headers: dict[str, str]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _answer(self) -> None:
            if self.command == "POST":
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            try:
                self.wfile.write(body)
            except OSError:
                pass  # the client gave up, as it should

        do_GET = do_POST = _answer  # noqa: N815

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def measure(repo: Path, kind: str, timeout: float) -> dict[str, object]:
    make, headers = KINDS[kind]
    server = serve(make(), headers)
    try:
        env = {**os.environ, "PYTHONPATH": str(repo), "PYTHONDONTWRITEBYTECODE": "1"}
        done = subprocess.run(
            [sys.executable, "-c", CHILD, f"http://127.0.0.1:{server.server_address[1]}",
             str(timeout)], cwd=repo, env=env, capture_output=True, text=True,
            timeout=timeout * 20)
    finally:
        server.shutdown()
        server.server_close()
    if done.returncode != 0:
        return {"peak_mib": None, "said": [done.stderr.strip().splitlines()[-1][:120]]}
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repo", type=Path, default=HERE)
    parser.add_argument("--kinds", nargs="*", default=list(KINDS), choices=list(KINDS))
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    print(f"{'reply':<12} {'peak RSS':>9}  what the view says")
    for kind in args.kinds:
        result = measure(args.repo.resolve(), kind, args.timeout)
        peak = result["peak_mib"]
        shown = "failed" if peak is None else f"{peak:7.1f} MiB"
        said = "; ".join(str(s) for s in result.get("said", []) or []) or "(no error)"  # type: ignore[union-attr]
        print(f"{kind:<12} {shown:>9}  {said[:150]}", flush=True)


if __name__ == "__main__":
    main()
