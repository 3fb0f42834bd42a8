"""One collector per render, bound to (snapshot, options): no shared mutable collector, so
renders need no lock, and a reload's new selection reaches the next render only."""

from __future__ import annotations

import threading

from prometheus_client import exposition as text_format

from exporter.core.config import Config
from exporter.output.render import Renderer, RenderOptions
from exporter.output.render.selection import Selection
from exporter.pipeline.hub import Hub
from exporter.pipeline.state import Snapshot
from tests.daemon import parse_samples
from tests.test_collector import Scripted


def _snapshot(bus: str) -> Snapshot:
    return Hub(Config(), [Scripted("amd", [bus])]).collect_once()


def _buses(text: str) -> set[str]:
    return {dict(labels)["pci_bus_id"] for (name, labels) in parse_samples(text)
            if name == "gpu_info"}


def test_a_render_keeps_the_options_it_was_bound_to_and_the_next_one_takes_the_new() -> None:
    """select() swapped the options of the one shared collector: a render already handed
    out (a scrape in flight) rendered under the selection of a reload that came after."""
    snapshot = _snapshot("0000:03:00.0")
    renderer = Renderer()
    held = renderer.render_now(snapshot)  # a scrape's exposition, not rendered yet
    before = renderer.options
    renderer.select(Selection(exclude="gpu_power_watts"))
    assert held.options is before and renderer.options is not before
    assert before.selection.everything  # the old options are not changed in place
    assert "gpu_power_watts" in held.body("text").decode()
    body, served = renderer.body("text")
    assert served is snapshot
    assert "gpu_power_watts" not in body.decode() and "gpu_up{" in body.decode()
    renderer.stop()


def test_renders_of_two_snapshots_interleaved_each_show_their_own() -> None:
    """Each render builds its own collector: one collection can be half done while another
    snapshot is rendered, on another thread, and neither sees the other's devices."""
    first, second = _snapshot("0000:03:00.0"), _snapshot("0000:04:00.0")
    renderer = Renderer()
    options = RenderOptions()
    collecting = renderer.registry(first, options).collect()
    head = next(collecting)  # the first family of the first snapshot, the rest pending
    other: list[bytes] = []
    thread = threading.Thread(target=lambda: other.append(
        text_format.generate_latest(renderer.registry(second, options))))
    thread.start()
    thread.join(10)
    rest = list(collecting)
    assert head.name == "gpu_info" and [s.labels["pci_bus_id"] for s in head.samples] == \
        ["0000:03:00.0"]
    assert all(s.labels.get("pci_bus_id", "0000:03:00.0") == "0000:03:00.0"
               for m in rest for s in m.samples)
    assert _buses(other[0].decode()) == {"0000:04:00.0"}
    renderer.stop()


def test_a_render_after_a_selection_change_serves_the_same_bytes_as_a_fresh_renderer() -> None:
    """Byte for byte what a renderer built with the new selection serves (the process
    collectors excluded: their values move between two renders)."""
    snapshot = _snapshot("0000:03:00.0")
    quiet = "process_.*|python_.*|gpu_exporter_backend_cpu_seconds_total"
    renderer = Renderer(options=RenderOptions(selection=Selection(exclude=quiet)))
    renderer.render_now(snapshot)
    renderer.body("text")
    selection = Selection(exclude=f"{quiet}|gpu_power_watts")
    renderer.select(selection)
    fresh = Renderer(options=RenderOptions(selection=selection))
    fresh.render_now(snapshot)
    for variant in ("text", "openmetrics"):
        assert renderer.body(variant)[0] == fresh.body(variant)[0]
    assert b"gpu_power_watts" not in renderer.body("text")[0]
    renderer.stop()
    fresh.stop()
