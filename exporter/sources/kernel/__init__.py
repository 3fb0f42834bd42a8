"""Pure parsers named after the kernel interface they read: hwmon, DRM fdinfo, amdgpu
(text attributes and the binary gpu_metrics), i915/xe. No I/O beyond what a reader is handed.
"""
