"""glowgen.runtime.Host, Glow's HostManager: networks added by name are partitioned over the
host's devices, provisioned, and served, many requests at once.

    from glowgen.runtime import Host, Device
    with Host([Device("cpu", memory="64MB"), Device("cpu", memory="64MB")]) as host:
        host.add_network("resnet", "resnet50.onnx")
        out = host.run("resnet", {"input": x})
        fut = host.run_async("resnet", {"input": x})      # a concurrent.futures.Future
"""
from __future__ import annotations

import threading
import time
from typing import Mapping, Optional, Sequence

import numpy as np

from ..errors import GlowgenError
from .devices import Device, name_devices
from .executor import Executor, Network, Replica
from .plan import Plan
from .provisioner import MemoryOverflow, provision, unload

# Plans made again when compiled partitions turn out larger than estimated.
REPLANS = 3


class _Signature:
    """The network's inputs, checked as a compiled model checks them (same messages)."""

    def __init__(self, input_types):
        self.input_types = dict(input_types)

    @property
    def input_names(self):
        return list(self.input_types)

    def __call__(self, feeds):
        from ..api import CompiledModel
        return CompiledModel.check_feeds(self, feeds)


class Host:
    def __init__(self, devices: Optional[Sequence[Device]] = None, max_pending: int = 1024):
        self.devices = name_devices(devices if devices is not None else [Device("cpu")])
        self._executor = Executor([d.name for d in self.devices], max_pending)
        self._networks: dict[str, tuple[Network, Plan, list]] = {}
        self._lock = threading.Lock()          # the table of networks
        self._provisioning = threading.Lock()  # one network planned and charged at a time
        self._closed = False

    # ------------------------------------------------------------------ networks
    def add_network(self, name: str, model, replicas: int = 1,
                    mapping: Optional[Mapping[str, str]] = None,
                    input_shapes: Optional[Mapping] = None,
                    constant_inputs: Optional[Mapping] = None, progress=None, **options) -> Plan:
        """Partition `model` (a path, bytes or onnx.ModelProto) over the devices and load it.
        `replicas`: copies for throughput (spread over the devices with room for one).
        `mapping`: {node name: device name} puts nodes (ONNX node names work) on devices.
        Other keyword arguments are compile options of the backends.  Returns the plan."""
        from .. import api
        from ..engine.registry import Registry
        if not isinstance(name, str) or not name:
            raise GlowgenError(f"a network needs a name (a non-empty string), not {name!r}")
        with self._lock:
            if self._closed:
                raise GlowgenError("the host is closed")
            if name in self._networks:
                raise GlowgenError(f"the host has a network named {name!r} already; remove it first")
        registry = Registry.default()
        function = api.load(model, input_shapes, registry, constant_inputs)
        api.optimize(function, registry, stage="optimized", backend=self.devices[0].kind)
        with self._provisioning:
            plan, loaded = self._place(name, function, registry, mapping, replicas, options, progress)
        replica_list = []
        constants = {v.name: np.asarray(v.data) for _, v in function.outputs
                     if not hasattr(v, "node") and hasattr(v, "data")}
        for r in range(replicas):
            mine = [item for item in loaded if item.partition.replica == r]
            produced = {t for item in mine for t in item.output_names}
            outputs = []
            for out, v in function.outputs:
                if v.name not in produced and v.name not in constants and \
                        v.name not in {p.name for p in function.placeholders}:
                    raise GlowgenError(f"internal: output {out!r} has no partition computing it")
                outputs.append((out, v.name))
            replica_list.append(Replica(mine, outputs, self._executor.workers))
        net = Network(name, _Signature({p.name: p.type for p in function.placeholders}),
                      replica_list, constants)
        with self._lock:
            if name in self._networks or self._closed:       # added meanwhile by another thread
                unload(loaded)
                raise GlowgenError(f"the host has a network named {name!r} already; remove it first"
                                   if not self._closed else "the host is closed")
            self._networks[name] = (net, plan, loaded)
        return plan

    def _place(self, name, function, registry, mapping, replicas, options, progress):
        """Plan and provision; plan again with scaled estimates when compiled partitions come
        out larger than estimated."""
        from .partitioner import partition
        margin, overflow = 1.0, None
        for attempt in range(REPLANS + 1):
            try:
                plan = partition(function, registry, self.devices, name, mapping, replicas, margin)
            except GlowgenError:
                if overflow is None:
                    raise
                raise GlowgenError(str(overflow)) from None   # what compiling showed, with sizes
            try:
                loaded = provision(plan, function, registry, self.devices, options, progress)
                break
            except MemoryOverflow as e:
                if attempt == REPLANS or mapping:
                    raise GlowgenError(str(e)) from None
                # compiled programs came out larger than estimated: plan again, estimates scaled
                overflow, margin = e, margin * e.ratio * 1.01
        return plan, loaded

    def remove_network(self, name: str) -> None:
        """Stop serving `name` once its pending requests finish, and free its memory."""
        net, _, loaded = self._get(name)
        with self._lock:
            del self._networks[name]
        while self._executor.pending_on(net):
            time.sleep(0.001)
        unload(loaded)

    remove = remove_network

    def _get(self, name: str):
        try:
            return self._networks[name]
        except KeyError:
            known = ", ".join(map(repr, self._networks)) or "none yet (add_network first)"
            raise GlowgenError(f"the host has no network named {name!r}; networks: {known}") from None

    @property
    def networks(self) -> list[str]:
        return list(self._networks)

    def plan(self, name: str) -> Plan:
        return self._get(name)[1]

    # ------------------------------------------------------------------ requests
    def run_async(self, name: str, feeds: Mapping[str, np.ndarray]):
        """A concurrent.futures.Future of the outputs {name: array}.  Bad inputs fail the
        future (a GlowgenError); a full queue raises QueueFull here."""
        return self._executor.submit(self._get(name)[0], feeds)

    def run(self, name: str, feeds: Mapping[str, np.ndarray], timeout: Optional[float] = None) -> dict:
        return self.run_async(name, feeds).result(timeout)

    # ------------------------------------------------------------------ state
    def stats(self) -> dict:
        nets = {}
        for name, (net, plan, _) in list(self._networks.items()):
            lat = sorted(net.latencies)
            pick = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] if lat else None  # noqa: E731
            nets[name] = {"completed": net.completed, "failed": net.failed,
                          "partitions": len(plan.replica(0)), "replicas": plan.replicas,
                          "p50_ms": pick(0.5) and pick(0.5) * 1e3,
                          "p99_ms": pick(0.99) and pick(0.99) * 1e3}
        devices = {d.name: {"kind": d.kind, "memory": d.memory, "used": d.used,
                            "threads": d.threads,
                            "calls": self._executor.workers[d.name].calls,
                            "busy_seconds": self._executor.workers[d.name].busy_seconds}
                   for d in self.devices}
        return {"pending": self._executor.pending, "refused": self._executor.refused,
                "networks": nets, "devices": devices}

    def close(self) -> None:
        """Take no more requests, finish those accepted, stop the device workers."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._executor.close()

    def __enter__(self) -> "Host":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Host devices={[d.name for d in self.devices]} networks={self.networks}>"
