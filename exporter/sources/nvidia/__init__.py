"""NVIDIA through NVML (nvidia-ml-py): the backend, its guarded calls and the readers per
feature (device, processes, GPM, NVLink, MIG, health, XID events).
"""
