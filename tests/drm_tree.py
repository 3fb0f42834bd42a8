"""Minimal PCI GPUs in a sysfs tree, the way sysfs shows them (real dirs, relative links).

The layout is the one of the committed fixture machines (tests/fixtures/build_amd.py,
build_intel.py): ``devices/<pci path>/<bus id>/{vendor,device,uevent,driver->}``, one
``drm/<node>/device -> ../..`` per DRM node and ``class/drm/<node>`` links to them.
Used by tests that add, remove or re-bind cards between two collections.
"""

from __future__ import annotations

import os
from pathlib import Path

PCI_VENDOR = {"amdgpu": "0x1002", "i915": "0x8086", "xe": "0x8086", "nvidia": "0x10de"}


def add_pci_card(
    root: Path,
    bus_id: str,
    card: str,
    driver: str = "amdgpu",
    vendor: str | None = None,
    device: str | None = "0x73bf",
    render: str | None = "renderD129",
) -> Path:
    """Add one PCI GPU bound to ``driver`` under the sysfs root ``root``; returns its dir."""
    vendor = vendor or PCI_VENDOR.get(driver, "0x1002")
    dev = root / "devices/pci0000:00/0000:00:02.0" / bus_id
    dev.mkdir(parents=True)
    (dev / "vendor").write_text(vendor + "\n")
    if device is not None:
        (dev / "device").write_text(device + "\n")
    pci_id = f"{vendor[2:]}:73BF".upper()
    (dev / "uevent").write_text(f"DRIVER={driver}\nPCI_ID={pci_id}\nPCI_SLOT_NAME={bus_id}\n")
    drv = root / "bus/pci/drivers" / driver
    drv.mkdir(parents=True, exist_ok=True)
    (dev / "driver").symlink_to(os.path.relpath(drv, dev))
    nodes = [card] + ([render] if render else [])
    for node in nodes:
        node_dir = dev / "drm" / node
        node_dir.mkdir(parents=True)
        (node_dir / "device").symlink_to(os.path.relpath(dev, node_dir))
        link = root / "class/drm" / node
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(node_dir, link.parent))
    return dev


def remove_card(root: Path, card: str) -> None:
    """What a PCI remove / driver unbind leaves: the class/drm links of the card are gone."""
    drm = root / "class/drm"
    device = (drm / card / "device").resolve()
    for link in list(drm.iterdir()):
        if link.is_symlink() and (link / "device").resolve() == device:
            link.unlink()
