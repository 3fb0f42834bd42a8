"""DRM cards: enumeration under a sysfs root, PCI identity, driver routing, hotplug.

Owns the list of ``class/drm/card<N>`` entries (any N, never connectors such as
``card0-DP-1``) and what each one is: PCI bus id, vendor/device id, kernel driver,
render node. The AMD and Intel backends ask ``cards(["amdgpu"])`` /
``cards(["i915", "xe"])`` every cycle, the processes backend asks whether any card
whose driver writes usage stats is bound.

Every ``cards()`` call checks that the list is current without udev: it lists
``class/drm`` and compares each ``card<N>`` name and link target with what the last
enumeration saw (a listdir and a readlink per card: microseconds). Only a
difference re-reads the cards. A listing that fails (EMFILE, EIO) is an error the
backends count (``listing_error``), never "every card removed": the last known
cards stay. So a card that appears or goes (the kernel removes
its class link before the device directory) is seen within one cycle under any
``--path.sysfs``, in a container where no uevent reaches the exporter too. A
device directory that vanished under a link still there is the backends' to see:
they check it every cycle and report that card down (``gpu_lost``) until the link
goes or the directory is back.

A card seen half-written (its ``class/drm`` link there, its device link, identity or
driver not yet: the kernel adds them one after the other) is read again at each call
until it is complete, ``INCOMPLETE_RETRIES`` times at most (a virtual card without a
device never completes): its link does not change when the rest appears, so the
comparison above alone would never look at it again.

Attributes are read through ``SysFS`` so fixture roots work. pyudev is used only to
*hear* DRM add/remove events on the real ``/sys`` (its root is fixed there); each
event triggers ``rescan()`` (a full re-read, which also catches a ``change`` that
leaves the links as they were).

A backend with no card is not asked every cycle: the collector retries its open() on
its back-off, capped by ``retry_interval``. So that a new card is not left waiting for
that, the callbacks given to ``on_card_added`` (the Hub's ``reprobe``) run when a
udev ``add`` or ``bind`` event arrives and when any re-enumeration (a backend that is
up noticing the change on its cycle) finds a card it had not seen.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from exporter.core.fs import SysFS, read_int, read_text
from exporter.core.model import normalize_pci_bus_id
from exporter.sources.base import Capabilities

log = structlog.get_logger(__name__)

_PCI_ADDR_RE = re.compile(r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")

# Longest wait between two open() retries of a backend with no card: where udev events
# reach us, a card added wakes it at once (on_card_added) and the collector's back-off
# alone is enough; where none does (a container, --path.sysfs elsewhere), every
# HOTPLUG_POLL seconds, once the back-off has grown to it.
UDEV_POLL = 60.0
HOTPLUG_POLL = 10.0
INCOMPLETE_RETRIES = 30  # re-reads of a card seen half-written: one per cards() call


@dataclass(frozen=True)
class DrmCard:
    card: str  # "card1" (never a connector like "card1-DP-1")
    pci_bus_id: str  # normalised "0000:03:00.0"
    vendor_id: int  # 0x1002 AMD, 0x8086 Intel, 0x10de NVIDIA
    device_id: int
    driver: str  # basename of device/driver: "amdgpu", "i915", "xe", "nvidia", ...
    device_dir: Path  # <sysfs root>/class/drm/cardN/device (through the symlink)
    render_node: str | None  # "renderD128" if a drm/renderD* sibling exists


def parse_uevent(text: str | None) -> dict[str, str]:
    """``KEY=value`` lines of a sysfs ``uevent`` file (pure)."""
    out: dict[str, str] = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def _pci_id_pair(uevent: dict[str, str]) -> tuple[int | None, int | None]:
    """``PCI_ID=1002:747E`` -> (0x1002, 0x747e)."""
    vendor, sep, device = uevent.get("PCI_ID", "").partition(":")
    try:
        return (int(vendor, 16), int(device, 16)) if sep else (None, None)
    except ValueError:
        return None, None


def read_card(sysfs: SysFS, card: str) -> DrmCard | None:
    """One ``class/drm/cardN`` entry, or None when it is not a PCI GPU (or vanished)."""
    device_dir = sysfs.path("class", "drm", card, "device")
    if not device_dir.is_dir():
        return None  # virtual card without a device, or removed while we looked
    uevent = parse_uevent(read_text(device_dir / "uevent"))

    # The bus id: PCI_SLOT_NAME, else the name the device link resolves to.
    bus_id = uevent.get("PCI_SLOT_NAME")
    if not bus_id:
        resolved = device_dir.resolve().name
        bus_id = resolved if _PCI_ADDR_RE.fullmatch(resolved) else None
    if not bus_id:
        return None  # platform/USB display device: not a GPU any backend here reads

    ue_vendor, ue_device = _pci_id_pair(uevent)
    vendor = read_int(device_dir / "vendor")
    device = read_int(device_dir / "device")
    vendor = vendor if vendor is not None else ue_vendor
    device = device if device is not None else ue_device
    if vendor is None:
        return None

    driver_link = device_dir / "driver"
    driver = os.path.basename(os.path.realpath(driver_link)) if driver_link.exists() else ""
    driver = driver or uevent.get("DRIVER", "")

    render: str | None = None
    try:
        nodes = sorted(n for n in os.listdir(device_dir / "drm") if n.startswith("renderD"))
        render = nodes[0] if nodes else None
    except OSError:
        pass
    return DrmCard(
        card=card,
        pci_bus_id=normalize_pci_bus_id(bus_id),
        vendor_id=vendor,
        device_id=device if device is not None else 0,
        driver=driver,
        device_dir=device_dir,
        render_node=render,
    )


Fingerprint = tuple[tuple[str, str], ...]  # (card, class/drm link target), sorted


class ListingError(Exception):
    """``class/drm`` exists but cannot be listed now (EMFILE, ENOMEM, EIO, EACCES)."""


def _drm_dir(sysfs: SysFS) -> str:
    return os.fspath(sysfs.path("class", "drm"))


def _drm_entries(drm: str) -> list[str]:
    """The names in ``drm`` (``class/drm``): none where it does not exist (no DRM at
    all, a fixture without cards); any other failure raises ListingError, because an
    empty answer would read as "every card removed"."""
    try:
        return os.listdir(drm)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        raise ListingError(f"cannot list {drm}: {exc}") from exc


def is_card_entry(name: str) -> bool:
    """``card<N>`` (any N), never a connector (``card1-DP-1``) or a render node."""
    return name.startswith("card") and name[4:].isdecimal()


def card_fingerprint(drm: str) -> Fingerprint:
    """What identifies the current set of cards under ``drm`` (the path of
    ``class/drm``), read as cheaply as sysfs allows: every backend asks each cycle.

    Raises ListingError where ``class/drm`` cannot be listed now."""
    out = []
    for name in _drm_entries(drm):
        if is_card_entry(name):
            try:
                target = os.readlink(f"{drm}/{name}")
            except OSError:
                target = ""  # a plain directory (some fixture trees) or gone meanwhile
            out.append((name, target))
    return tuple(sorted(out))


def enumerate_cards(sysfs: SysFS, incomplete: set[str] | None = None) -> list[DrmCard]:
    """Every PCI DRM card under ``<root>/class/drm``, sorted by PCI bus id; the names of
    the entries that are no card yet, or one bound to no driver yet, are added to
    ``incomplete``.

    Raises ListingError where ``class/drm`` cannot be listed now."""
    cards = []
    for entry in _drm_entries(_drm_dir(sysfs)):
        if is_card_entry(entry):
            card = read_card(sysfs, entry)
            if card is not None:
                cards.append(card)
            if incomplete is not None and (card is None or not card.driver):
                incomplete.add(entry)
    return sorted(cards, key=lambda c: (c.pci_bus_id, c.card))


class DrmDiscovery:
    """The current DRM cards, shared by the backends that read them.

    Thread-safe: backends call ``cards()`` from their collector threads while the
    pyudev observer thread calls ``rescan()``.
    """

    def __init__(self, sysfs: SysFS, hotplug: bool) -> None:
        self.sysfs = sysfs
        self.hotplug = hotplug
        self._drm = _drm_dir(sysfs)  # listed on every cards() call: joined once
        self._lock = threading.Lock()
        self._scan_lock = threading.Lock()  # one enumeration at a time (threads, events)
        self._cards: list[DrmCard] | None = None  # None: not enumerated yet
        self._fingerprint: Fingerprint = ()  # what class/drm looked like at that enumeration
        # card entry -> re-reads left while it is incomplete (module doc); bounded by
        # class/drm's card entries, each given INCOMPLETE_RETRIES at most while its link stays
        self._incomplete: dict[tuple[str, str], int] = {}
        self._generation = 0
        self._observer: Any = None  # pyudev.MonitorObserver while started
        self.listing_error: str | None = None  # why the last class/drm listing failed
        self._added: list[Callable[[], None]] = []  # on_card_added callbacks

    @property
    def generation(self) -> int:
        """Bumps whenever the set of cards (or what one of them is) changes."""
        return self._generation

    def cards(self, drivers: Collection[str] | None = None) -> list[DrmCard]:
        """The cards bound to one of ``drivers`` (all cards if None), current as of now.

        Where ``class/drm`` cannot be listed (EMFILE under a connection flood, ...), the
        last known cards stay and ``listing_error`` says why until a listing works again.
        """
        return self.listing(drivers)[0]

    def listing(self, drivers: Collection[str] | None = None) -> tuple[list[DrmCard], int]:
        """``cards(drivers)`` and the generation of that very list (read together: a
        backend that skips its own matching while the generation stays never pairs an
        old list with a newer generation)."""
        try:
            if self._changed():
                with self._scan_lock:
                    # Another backend's thread may have just re-enumerated: check again.
                    if self._changed():
                        self._rescan()
            if self.listing_error is not None:  # (read without the lock: one reference)
                self._listing_failed(None)
        except ListingError as exc:
            self._listing_failed(str(exc))
        with self._lock:
            current, generation = self._cards or (), self._generation
        if drivers is None:
            return list(current), generation
        return [c for c in current if c.driver in drivers], generation

    def on_card_added(self, callback: Callable[[], None]) -> None:
        """``callback()`` (cheap, never raising: it runs on the thread that noticed) is
        called when a card appears after the first enumeration, or udev says ``add``."""
        self._added.append(callback)

    def _card_added(self) -> None:
        for callback in self._added:
            callback()

    def _changed(self) -> bool:
        return self._cards is None or any(self._incomplete.values()) or \
            card_fingerprint(self._drm) != self._fingerprint

    def rescan(self) -> None:
        """Re-enumerate now: what a udev add/remove event triggers."""
        try:
            with self._scan_lock:
                self._rescan()
        except ListingError as exc:
            self._listing_failed(str(exc))

    def _listing_failed(self, reason: str | None) -> None:
        """Remember why class/drm could not be listed (None: it could); one log line
        when that starts and one when it ends, never one per cycle."""
        with self._lock:
            before, self.listing_error = self.listing_error, reason
        if reason is not None and before is None:
            log.warning("drm card listing failed; keeping the last known cards", reason=reason)
        elif reason is None and before is not None:
            log.info("drm card listing works again")

    def _rescan(self) -> None:
        # Fingerprint first: a change while enumerating then shows on the next call.
        fingerprint = card_fingerprint(self._drm)
        incomplete: set[str] = set()
        found = enumerate_cards(self.sysfs, incomplete)
        with self._lock:
            self._fingerprint = fingerprint
            # An entry (name, link) keeps its count of re-reads while it stays incomplete.
            self._incomplete = {
                entry: self._incomplete.get(entry, INCOMPLETE_RETRIES + 1) - 1
                for entry in fingerprint if entry[0] in incomplete}
            before = {c.card: c for c in self._cards or ()}
            after = {c.card: c for c in found}
            first = self._cards is None
            self._cards = found
            if before != after:
                self._generation += 1
        if not first and any(before.get(name) != card for name, card in after.items()):
            self._card_added()  # down backends look again now, not at their next retry
        # One log line per card that appears or goes: a state change, not a cycle.
        for name, card in after.items():
            if before.get(name) != card:
                log.info(
                    "drm card found" if first else "drm card appeared",
                    card=name,
                    pci_bus_id=card.pci_bus_id,
                    driver=card.driver,
                    vendor_id=f"0x{card.vendor_id:04x}",
                )
        for name, card in before.items():
            if name not in after:
                log.info("drm card removed", card=name, pci_bus_id=card.pci_bus_id)

    @property
    def watching(self) -> bool:
        """udev events reach us (a real /sys with a working monitor)."""
        return self._observer is not None

    def retry_interval(self, interval: float) -> float:
        """The longest a backend with no card waits before it looks again (the
        collector's back-off grows to it: 1, 2, 5, 10 s, ...).

        HOTPLUG_POLL in a container (no udev event reaches it: only looking again sees
        a new card); where udev tells us, UDEV_POLL (an added card wakes the backend at
        once), so idle backends on a host without their cards cost next to nothing.
        """
        return max(interval, UDEV_POLL if self.watching else HOTPLUG_POLL)

    def capabilities(self, interval: float) -> Capabilities:
        """The capabilities of a backend whose open() only reads this card list: the
        collector's back-off before it retries grows no longer than ``retry_interval``,
        and a card added wakes it at once (Hub.reprobe)."""
        return Capabilities(retry_interval=self.retry_interval(interval))

    def start(self) -> None:
        """Also listen for DRM uevents (real /sys only): a re-read on any event. Idempotent."""
        if not self.hotplug:
            return
        with self._lock:
            if self._observer is not None:
                return
            try:
                import pyudev

                monitor = pyudev.Monitor.from_netlink(pyudev.Context())
                monitor.filter_by("drm")
                observer = pyudev.MonitorObserver(
                    monitor, callback=self._on_event, name="drm-hotplug", daemon=True
                )
                observer.start()
            except Exception as exc:  # no netlink in this namespace, no libudev, ...
                # Not fatal: cards() notices changes by itself. Said once.
                log.info("drm hotplug events unavailable, polling class/drm",
                         reason=str(exc))
                self.hotplug = False
                return
            self._observer = observer

    def stop(self) -> None:
        with self._lock:
            observer, self._observer = self._observer, None
        if observer is not None:
            observer.send_stop()

    def _on_event(self, device: Any) -> None:
        action = getattr(device, "action", None)
        if action not in ("add", "remove", "change", "bind", "unbind"):
            return
        try:
            self.rescan()
            if action in ("add", "bind"):
                self._card_added()  # also what the listing alone does not show (a PMU)
        except Exception as exc:  # never let the observer thread die
            log.warning("drm rescan failed", reason=str(exc))
