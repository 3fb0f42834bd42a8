"""Tests that need real hardware (an NVIDIA GPU with NVML); skipped elsewhere."""
