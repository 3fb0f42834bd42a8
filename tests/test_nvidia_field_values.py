"""nvmlDeviceGetFieldValues never lets the driver past the caller's array.

Driver 580.159.04 on NVLinked H200s reads the entry one past ``count`` when a batch ends
in an NVLink throughput field, and writes its timestamp when that entry holds an NVLink
throughput id; nvidia-ml-py's wrapper hands it an exactly sized array, so that entry is
another heap object (the daemon died with SIGSEGV within seconds). FakeNVML models the
driver at the ctypes boundary and records every look past the caller's buffer in
``overruns``: these tests fail on the wrapper and pass on ``fields.field_values``.
"""

from __future__ import annotations

import ctypes
from collections import Counter

import pytest

from exporter.core.config import Config
from exporter.sources.nvidia.backend import NvidiaBackend
from exporter.sources.nvidia.calls import Caller
from exporter.sources.nvidia.fields import SPARE_ENTRIES, FieldReader, field_values
from exporter.sources.nvidia.nvlink import THROUGHPUT_EVERY
from tests.fakes.fake_nvml import FakeGPU, FakeNvLink, FakeNVML
from tests.fakes.nvml_real import N

TX, RX = N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
RECOVERY = N.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
# The daemon's slow batch on the machine that crashed: recovery action, then TX/RX per link.
CRASHING_BATCH = [(RECOVERY, 0)] + [(f, link) for link in range(18) for f in (TX, RX)]


def two_nvlinked_h200s() -> FakeNVML:
    gpus = [FakeGPU(index=i, name="NVIDIA H200", recovery_action=0,
                    nvlinks=[FakeNvLink(remote="gpu", tx_step_kib=1 << 20, rx_step_kib=1 << 20)
                             for _ in range(18)])
            for i in range(2)]
    fake = FakeNVML(gpus)
    fake.nvmlInit()
    return fake


@pytest.mark.overrun_expected
def test_the_fake_driver_looks_past_nvidia_ml_pys_exact_array() -> None:
    """The model itself: what crashed the daemon is seen by the fake."""
    fake = two_nvlinked_h200s()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    fake.nvmlDeviceGetFieldValues(h, CRASHING_BATCH)
    assert fake.overruns == [("nvmlDeviceGetFieldValues", 37, 37)]
    # The same fields with the recovery action last: the driver stays inside (as measured).
    fake.nvmlDeviceGetFieldValues(h, CRASHING_BATCH[1:] + CRASHING_BATCH[:1])
    assert len(fake.overruns) == 1


def test_field_values_gives_the_driver_zeroed_entries_of_its_own() -> None:
    fake = two_nvlinked_h200s()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    values = field_values(fake, h, CRASHING_BATCH)
    assert fake.overruns == []
    assert len(values) == len(CRASHING_BATCH)
    assert [(v.fieldId, v.scopeId) for v in values] == CRASHING_BATCH
    assert all(v.nvmlReturn == N.NVML_SUCCESS for v in values)
    assert SPARE_ENTRIES >= 1


def test_a_spare_entry_holding_an_nvlink_id_is_written_as_the_driver_does() -> None:
    """The fake writes the timestamp past ``count`` like the driver, when the memory is
    the caller's and holds an NVLink throughput id; field_values' spares hold id 0."""
    fake = two_nvlinked_h200s()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    arr = (N.c_nvmlFieldValue_t * 3)()
    arr[0].fieldId, arr[1].fieldId, arr[2].fieldId = RECOVERY, TX, TX
    assert fake._c_field_values(h, ctypes.c_int32(2), ctypes.byref(arr)) == N.NVML_SUCCESS
    assert arr[2].timestamp != 0 and fake.overruns == []


def test_the_wrong_struct_at_the_boundary_is_refused() -> None:
    fake = two_nvlinked_h200s()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    wrong = (ctypes.c_uint32 * 8)()
    with pytest.raises(TypeError):
        fake._c_field_values(h, ctypes.c_int32(8), ctypes.byref(wrong))


def test_the_backend_reads_nvlink_throughput_without_an_overrun() -> None:
    """The whole NVIDIA path on two NVLinked GPUs, slow cycles with throughput due: the
    batch ends in NVLink throughput fields (the crashing shape) and the driver never
    leaves the exporter's array."""
    fake = two_nvlinked_h200s()
    b = NvidiaBackend(Config(procfs="/nonexistent"), nvml=fake)
    b.open()
    rates = []
    for _ in range(2 * THROUGHPUT_EVERY + 1):
        cycle = b.sample(slow=True)
        rates.append([d.nvlink_throughput_bytes_per_second for d in cycle.devices])
    assert fake.overruns == []
    # the crashing shape, after the cycle's 2 fast fields: it ends in NVLink throughput fields
    assert max(fake.field_batches) == 2 + len(CRASHING_BATCH)
    assert any(r and all(d for d in r) for r in rates)  # both GPUs got throughput values
    assert all(v > 0 for d in rates[-1] for v in d.values())


def test_the_reader_keeps_its_dropped_fields_and_error_rules() -> None:
    fake = two_nvlinked_h200s()
    fake.gpus[0].nvlinks = fake.gpus[0].nvlinks[:2]
    h = fake.nvmlDeviceGetHandleByIndex(0)
    reader = FieldReader(Caller(fake, h, 0))
    errors: Counter[str] = Counter()
    out = reader.read(errors, [(RECOVERY, 0), (TX, 0), (TX, 5)])  # link 5 does not exist
    assert set(out) == {(RECOVERY, 0), (TX, 0)} and (TX, 5) in reader.dropped
    assert errors == Counter() and fake.overruns == []
