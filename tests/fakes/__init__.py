"""Fakes with behaviour at the vendor-library boundary (``fake_nvml`` speaks pynvml)."""
