"""Per-process DRM usage from /proc/<pid>/fdinfo (amdgpu, i915, xe).
"""
