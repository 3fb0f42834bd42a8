"""AMD: the amdgpu sysfs backend, PCI id names, rates, and the optional amdsmi backend.
"""
