"""AMD GPUs through the amdgpu kernel driver's sysfs and hwmon files (no vendor library).

Owns the per-card lifecycle: cards come from the shared DrmDiscovery
(``cards(["amdgpu"])`` each cycle, cached, refreshed by udev events); each keeps its
state (identity, counters across cycles, its exporter.core.fs.AttrReader with open
descriptors) until it goes. A card that vanishes is reported once with ``up=False``,
then dropped; one whose device directory is gone under a link still there is lost
(``gpu_lost``) until it is back. Its static information (name, memory sizes, gfx target)
is read when it appears and again on each slow cycle while a file its driver writes is
missing (``card.static_missing``), STATIC_RETRIES times at most, and at once when it is
back after it was lost: a card found before its driver finished creating its files gets
them in the end, not an empty name for good. What one card's sample holds is
exporter.sources.amd.card's, imported with the first card: a machine without
one (an NVIDIA-only host) never loads the amdgpu parsers.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

import structlog

from exporter.core.config import Config
from exporter.core.fs import AttrReader, driver_version
from exporter.core.labels import ErrorReason
from exporter.core.model import DeviceInfo, DeviceSample, copy_with
from exporter.sources.amd import SYSFS_SOURCE
from exporter.sources.base import KERNEL, BackendUnavailable, Capabilities, Cycle
from exporter.sources.discovery import DrmCard, DrmDiscovery

if TYPE_CHECKING:
    from exporter.sources.amd.ids import AmdgpuIds
    from exporter.sources.amd.pcie_bw import PcieBwReader

log = structlog.get_logger(__name__)
SOURCE = SYSFS_SOURCE
# Slow cycles a card's missing static information is looked for again (a minute at the
# default slow interval: a driver still creating its files takes seconds); a file its
# driver never writes (a kernel without it) then costs nothing more.
STATIC_RETRIES = 6


class _Card:
    """One card's state across cycles: identity, counters, kept-open files."""

    def __init__(self, card: DrmCard, info: DeviceInfo) -> None:
        from exporter.sources.amd import card as card_module
        from exporter.sources.amd.pcie_bw import FILE as PCIE_BW

        self.card_module = card_module  # what reads it: imported once, not every cycle
        self.card = card
        self.info = info
        self.counters = card_module.CardCounters()
        self.reader = AttrReader()
        self.lost = False
        self.missing: list[str] = []  # static information its driver has not written yet
        self.static_retries = STATIC_RETRIES  # slow cycles left to look for it again
        self.device_dir = os.fspath(card.device_dir)
        self.pcie_bw = os.path.exists(os.path.join(self.device_dir, PCIE_BW))


class AmdBackend:
    """amdgpu sysfs backend. One "handle": the shared DrmDiscovery (and its udev monitor)."""

    name = "amd"
    source = SOURCE
    priority = KERNEL
    interval: float | None = None

    def __init__(self, config: Config, discovery: DrmDiscovery) -> None:
        self.config = config
        self.discovery = discovery
        self._cards: dict[str, _Card] = {}  # card name -> state
        self._generation = -1
        self._ids: AmdgpuIds | None = None  # the marketing-name table, with the first card
        self._driver_version: str | None = None  # read with the first card
        self._pcie: PcieBwReader | None = None  # pcie_bw on its own thread (slow tier)
        # open() only reads the cached card list: the collector retries it on its back-off.

    @property
    def capabilities(self) -> Capabilities:
        return self.discovery.capabilities(self.config.interval)  # open() reads its list

    def open(self) -> Sequence[DeviceInfo]:
        # With no card, stay down; the collector's reopen back-off calls us again and
        # discovery (kept current by udev events) then sees a card that arrived.
        self.discovery.start()
        cards, generation = self.discovery.listing(["amdgpu"])
        if not cards:
            root = self.discovery.sysfs.path("class", "drm")
            raise BackendUnavailable(f"no amdgpu card under {root}")
        if self._pcie is None:
            from exporter.sources.amd.pcie_bw import PcieBwReader

            self._pcie = PcieBwReader()
        self._refresh(cards, generation)
        return [self._cards[c.card].info for c in cards]

    def _refresh(self, cards: list[DrmCard], generation: int) -> list[_Card]:
        """New cards get their static info read once; returns the cards that went away.

        A new discovery generation (hotplug) re-lists every card's layout; with none
        since the last look (the usual cycle) there is nothing to do. ``generation`` is
        that of ``cards`` (DrmDiscovery.listing)."""
        if generation == self._generation and self._cards:
            return []
        current = {c.card: c for c in cards}
        gone = [st for name, st in self._cards.items() if current.get(name) != st.card]
        for st in gone:
            st.reader.close()
            if self._pcie is not None:
                self._pcie.forget(st.device_dir)
            del self._cards[st.card.card]
        if generation != self._generation:
            for st in self._cards.values():
                st.reader.reset()
            self._generation = generation
        for name, c in current.items():
            if name not in self._cards:
                st = self._cards[name] = _Card(c, self._device_info(c))
                self._check_static(st)
        return gone

    def _check_static(self, st: _Card) -> None:
        from exporter.sources.amd.card import static_missing

        st.missing = static_missing(st.info, st.reader, st.device_dir, self.config.sysfs)

    def _reread_static(self, st: _Card) -> None:
        """The card's layout listed afresh and its static information read again (the
        slow-tier limits and sizes too, on this very cycle)."""
        before = st.missing
        st.reader.relist()
        st.info = self._device_info(st.card)
        st.counters.slow = None
        self._check_static(st)
        if st.missing != before:
            log.info("amdgpu card static information read again", card=st.card.card,
                     device=st.info.pci_bus_id, found=sorted(set(before) - set(st.missing)),
                     still_missing=st.missing)

    def _device_info(self, card: DrmCard) -> DeviceInfo:
        from exporter.sources.amd.card import device_info, kfd_architectures
        from exporter.sources.amd.ids import AmdgpuIds, lookup_paths

        if self._ids is None:
            self._ids = AmdgpuIds(*lookup_paths(self.config.sysfs, self.config.amdgpu_ids))
        if not self._driver_version:
            self._driver_version = driver_version(self.config.sysfs, self.config.procfs,
                                                  "amdgpu")
        architecture = kfd_architectures(self.config.sysfs).get(card.pci_bus_id, "")
        return device_info(card, self._ids, self._driver_version, architecture)

    def sample(self, slow: bool) -> Cycle:
        errors: Counter[ErrorReason] = Counter()
        gone = self._refresh(*self.discovery.listing(["amdgpu"]))
        if self.discovery.listing_error is not None:
            errors[ErrorReason.DRM_LISTING] += 1  # the last known cards are read meanwhile
        devices = [self._read(st, errors, slow) for st in self._cards.values()]
        if self._pcie is not None:
            if slow:
                self._pcie.request([st.device_dir for st in self._cards.values()
                                    if st.pcie_bw and not st.lost])
            if pcie_errors := self._pcie.take_errors():
                errors.update(pcie_errors)
        # A card that vanished is reported once as down, then its series go away.
        for st in gone:
            if st.info.pci_bus_id not in {d.info.pci_bus_id for d in devices}:
                devices.append(DeviceSample(info=st.info, source=SOURCE, up=False))
        devices.sort(key=lambda d: d.info.pci_bus_id)
        return Cycle(devices=devices, errors={k: n for k, n in errors.items() if n})

    def _read(self, st: _Card, errors: Counter[ErrorReason], slow: bool) -> DeviceSample:
        # The device directory gone under a class/drm link still there (driver unbind,
        # a card fallen off the bus): lost until it is back. Kept descriptors of a
        # removed file could still answer, so this is checked, not inferred.
        if not os.path.isdir(st.device_dir):
            errors[ErrorReason.GPU_LOST] += 1
            if not st.lost:
                st.reader.reset()  # its layout is re-listed when it comes back
            st.lost = True
            return DeviceSample(info=st.info, source=SOURCE, up=False)
        if st.lost:  # back after it was lost: read afresh at once, looked for again
            st.static_retries = STATIC_RETRIES
            self._reread_static(st)
        elif slow and st.missing and st.static_retries:  # still incomplete
            st.static_retries -= 1
            self._reread_static(st)
            if st.missing and not st.static_retries:
                log.info("amdgpu card static information still missing; not looked for "
                         "again until the card is found again", card=st.card.card,
                         device=st.info.pci_bus_id, missing=st.missing)
        st.lost = False
        try:
            sample: DeviceSample = st.card_module.read_card(
                st.card, st.info, errors, st.counters, st.reader, slow)
            rates = self._pcie.rates(st.device_dir) if self._pcie and st.pcie_bw else {}
            return copy_with(sample, pcie_throughput_bytes_per_second=rates) if rates else sample
        except Exception as exc:  # a card torn down mid-read: keep the others going
            errors[ErrorReason.CARD] += 1
            log.debug("amdgpu card read failed", card=st.card.card, reason=str(exc))
            return DeviceSample(info=st.info, source=SOURCE, up=False)

    def close(self) -> None:
        # The discovery (and its udev observer) is shared with the Intel backend:
        # it is not ours to stop here.
        for st in self._cards.values():
            st.reader.close()
        self._cards.clear()
        self._generation = -1
        if self._pcie is not None:
            self._pcie.close()
            self._pcie = None
