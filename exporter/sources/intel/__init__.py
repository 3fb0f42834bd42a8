"""Intel: the i915/xe sysfs backend and the opt-in Level Zero Sysman backend (ctypes).
"""
