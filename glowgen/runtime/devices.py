"""Devices: where partitions of a network are loaded and run.

A device is a backend kind (any registered backend: "cpu", "interpreter", ...), a memory
budget (bytes of weights plus peak activations it may hold) and threads.  A cpu device is a
share of this machine's cores: each runs one call at a time on its own `threads` threads, so
two devices of one thread each use the two cores of a two-core machine side by side."""
from __future__ import annotations

import re
from typing import Optional, Union

from ..backends.base import backend_names, get_backend
from ..errors import GlowgenError

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
          "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}
_MEMORY = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]*)\s*$")


def parse_memory(memory: Union[int, str, None]) -> Optional[int]:
    """Bytes from 123, "64MB", "1.5 GiB" (binary units: 1 MB = 2**20 bytes); None stays None."""
    if memory is None:
        return None
    if isinstance(memory, bool):
        raise GlowgenError(f"device memory must be bytes or a size such as '64MB', not {memory!r}")
    if isinstance(memory, int):
        if memory <= 0:
            raise GlowgenError(f"device memory must be positive, not {memory}")
        return memory
    if isinstance(memory, str):
        m = _MEMORY.match(memory)
        if m and m.group(2).upper() in _UNITS:
            size = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
            if size > 0:
                return size
    raise GlowgenError(f"device memory {memory!r} is not a size: give bytes or a number with "
                       f"a unit such as '64MB', '512KB', '2GB'")


def format_bytes(n: float) -> str:
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


class Device:
    """A backend kind with a memory budget and threads.  `memory` None: what the backend
    says it has (for the cpu, the memory this machine has available)."""

    def __init__(self, kind: str = "cpu", memory: Union[int, str, None] = None, threads: int = 1,
                 name: Optional[str] = None):
        if not isinstance(kind, str) or kind not in backend_names():
            raise GlowgenError(f"unknown device kind {kind!r}: a device is one of the registered "
                               f"backends: {', '.join(backend_names())}")
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise GlowgenError(f"device threads must be a positive integer, not {threads!r}")
        self.kind = kind
        self.backend = get_backend(kind)
        budget = parse_memory(memory)
        self.memory = budget if budget is not None else self.backend.device_memory()
        self.memory_given = budget is not None
        self.threads = threads
        self.name = name            # the Host names unnamed devices kind0, kind1, ...
        self.used = 0               # bytes taken by partitions loaded on it (the Provisioner's)

    @property
    def free(self) -> int:
        return self.memory - self.used

    def compile_options(self) -> dict:
        """The compile options this device gives its partitions: its threads, where the
        backend takes a threads option."""
        return {"threads": self.threads} if "threads" in self.backend.options else {}

    def describe(self) -> str:
        mem = format_bytes(self.memory) if self.memory_given else f"{format_bytes(self.memory)} (available)"
        return f"{self.name} ({self.kind}, {mem}, {self.threads} thread{'s' if self.threads > 1 else ''})"

    def __repr__(self) -> str:
        return f"Device({self.kind!r}, memory={self.memory}, threads={self.threads}, name={self.name!r})"


def parse_device_spec(spec: str) -> Device:
    """A device from the command line: KIND[:key=value,...] with keys memory, threads, name
    ("cpu:memory=64MB,threads=1")."""
    kind, _, rest = spec.partition(":")
    kwargs: dict = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in ("memory", "threads", "name"):
            raise GlowgenError(f"--device {spec!r}: expected KIND[:memory=SIZE,threads=N,name=NAME], "
                               f"got {item!r}")
        if key == "threads":
            try:
                kwargs[key] = int(value)
            except ValueError:
                raise GlowgenError(f"--device {spec!r}: threads must be an integer, not {value!r}") from None
        else:
            kwargs[key] = value.strip()
    return Device(kind.strip(), **kwargs)


def name_devices(devices) -> list[Device]:
    """Check the list and give unnamed devices names (kind + index); names must be unique."""
    devices = list(devices)
    if not devices:
        raise GlowgenError("a host needs at least one device, e.g. Device('cpu')")
    for d in devices:
        if not isinstance(d, Device):
            raise GlowgenError(f"devices must be glowgen.runtime.Device objects, not {d!r}")
    taken = {d.name for d in devices if d.name}
    counts: dict[str, int] = {}
    for d in devices:
        if d.name:
            continue
        i = counts.get(d.kind, 0)
        while f"{d.kind}{i}" in taken:
            i += 1
        d.name = f"{d.kind}{i}"
        taken.add(d.name)
        counts[d.kind] = i + 1
    names = [d.name for d in devices]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise GlowgenError(f"device names must be unique: {', '.join(map(repr, dup))} given twice")
    return devices
