"""AMD: the amdgpu sysfs backend, PCI id names, rates, and the optional amdsmi backend."""

# The `source` of every value the amdgpu sysfs backend reads (backend.py, card.py).
SYSFS_SOURCE = "sysfs"
