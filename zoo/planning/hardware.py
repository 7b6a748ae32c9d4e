"""The devices a plan runs on: catalog/hardware.csv by any name a device goes by, this machine's RAM, or an
amount of memory."""

from __future__ import annotations

import csv
import difflib
import functools
import os
import re
from dataclasses import dataclass

from zoo.errors import HardwareNotFound
from zoo.throughput.roofline import HARDWARE, Device, load_hardware

_UNITS = {"b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


@dataclass(frozen=True)
class Hardware:
    name: str
    capacity: int  # bytes
    device: Device | None = None  # peak FLOP/s and bandwidth, for the step time
    interconnect: float | None = None  # bytes/s each way between two devices


def _key(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower().replace("nvidia", "").replace("geforce", ""))


@functools.lru_cache(maxsize=4)  # a search by fit plans thousands of rows on one device
def load_devices(path=HARDWARE) -> dict[str, Hardware]:
    """The devices of the hardware table by every name they go by (normalized: case, spaces and hyphens aside)."""
    devices = load_hardware(path)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    out: dict[str, Hardware] = {}
    for row in rows:
        ic = (row.get("interconnect_gbs") or "").strip()
        hw = Hardware(
            row["device"],
            int(float(row["memory_gib"]) * 2**30),
            devices[row["column"]],
            float(ic) * 1e9 if ic else None,
        )
        for name in [row["device"], row["column"], *(row.get("aliases") or "").split(";")]:
            if name.strip():
                out.setdefault(_key(name), hw)
    return out


def ram_bytes() -> int:
    """This machine's physical memory (hardware="cpu")."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@functools.lru_cache(maxsize=64)  # a search by fit plans every row on one device
def hardware_of(value) -> Hardware:
    """A device by any of its names, "cpu", or an amount of memory: bytes, or text with a unit ("24GiB", "80 GB")."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return Hardware(f"{value} bytes", value)
    text = str(value).strip()
    if m := re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmgt]i?b|b)", text.lower()):
        return Hardware(text, int(float(m.group(1)) * _UNITS[m.group(2)]))
    if text.lower() == "cpu":
        return Hardware("cpu (this machine's RAM)", ram_bytes())
    devices = load_devices()
    if _key(text) in devices:
        return devices[_key(text)]
    names = sorted({h.name for h in devices.values()})
    close = [n for n in names if _key(text) and _key(text) in _key(n)] or difflib.get_close_matches(text, names, 5, 0.4)
    raise HardwareNotFound(text, close or names)
