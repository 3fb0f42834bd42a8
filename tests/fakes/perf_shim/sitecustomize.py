"""For subprocess tests: the daemon's perf_event_open answered by tests/fakes/fake_perf.py.

Python imports ``sitecustomize`` at start-up from PYTHONPATH. When FAKE_PERF_JSON names
a fake_perf configuration, the one syscall boundary (exporter.sources.kernel.perf.LIBC) is a
FakePerf built from it, before any backend is made; everything else is the code a user
runs. Without the variable this does nothing.
"""

import os

if os.environ.get("FAKE_PERF_JSON"):
    import exporter.sources.kernel.perf
    from tests.fakes.fake_perf import FakePerf

    exporter.sources.kernel.perf.LIBC = FakePerf.from_json(os.environ["FAKE_PERF_JSON"])
