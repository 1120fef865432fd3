"""The provisioner: each partition of a plan compiled for its device's backend and loaded
there, with the device's memory accounted.

Partitions compile on threads of their own (the LLVM work of the cpu backend runs outside
Python's lock for much of its time).  Replicas of one partition on devices of one kind share
one compiled program (its weights are read-only and every call runs in its own execution
context), while each device is charged for the copy it holds.  A partition whose compiled
program is larger than its device has left is refused with the sizes: MemoryOverflow, which
the Host answers by planning again with estimates scaled by what compiling showed."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..engine.graph import Function
from ..errors import GlowgenError
from .devices import Device, format_bytes
from .plan import Partition, Plan
from .subgraph import cut


class MemoryOverflow(GlowgenError):
    """A compiled partition is larger than the memory its device has left."""

    def __init__(self, message: str, ratio: float):
        super().__init__(message)
        self.ratio = ratio          # compiled bytes / estimated bytes of the worst partition


@dataclass
class Loaded:
    """A partition made runnable on its device."""
    partition: Partition
    device: Device
    model: object                   # a CompiledModel
    input_names: list
    output_names: list


def compiled_bytes(model) -> int:
    return int(sum(model.program.region_sizes.values()))


def _compile(function: Function, registry, kind: str, options: Mapping):
    from .. import pipeline
    from ..api import CompiledModel
    pipeline.run(function, registry, pipeline.PIPELINE, kind)
    return CompiledModel(function, registry, kind, **options)


def provision(plan: Plan, function: Function, registry, devices: Sequence[Device],
              options: Mapping, progress=None) -> list[Loaded]:
    """Compile and load every partition of `plan`; charge each device.  Nothing is charged
    when anything fails."""
    by_name = {d.name: d for d in devices}
    jobs: dict[tuple, list[Partition]] = {}
    for p in plan.partitions:
        dev = by_name[p.device]
        opts = {**dev.compile_options(), **options}
        key = (tuple(p.nodes), p.kind, tuple(sorted(opts.items(), key=lambda kv: kv[0])))
        jobs.setdefault(key, []).append(p)
    # Cut serially (the whole graph is shared); compile in parallel.
    work = []
    for key, parts in jobs.items():
        p = parts[0]
        sub, _, _ = cut(function, [n for n in function.nodes if n.name in set(p.nodes)],
                        f"{plan.network}_{p.name.split('.')[0]}")
        work.append((key, sub, p.kind, dict(key[2])))
    workers = max(1, min(len(work), os.cpu_count() or 1))
    done = 0

    def build(item):
        nonlocal done
        key, sub, kind, opts = item
        model = _compile(sub, registry, kind, opts)
        done += 1
        if progress:
            progress(done, len(work))
        return key, model

    if workers == 1:
        models = dict(map(build, work))
    else:
        with ThreadPoolExecutor(workers, thread_name_prefix="glowgen-provision") as pool:
            models = dict(pool.map(build, work))

    # memory: every device's partitions together within what it has left
    charge: dict[str, int] = {}
    loaded, worst = [], 1.0
    for key, parts in jobs.items():
        for p in parts:
            model = models[key]
            p.compiled_memory = compiled_bytes(model)
            worst = max(worst, p.compiled_memory / max(1, p.weights + p.activations))
            charge[p.device] = charge.get(p.device, 0) + p.compiled_memory
            loaded.append(Loaded(p, by_name[p.device], model, list(model.input_names),
                                 list(model.output_names)))
    for name, need in charge.items():
        dev = by_name[name]
        if need > dev.free:
            mine = [p for p in plan.partitions if p.device == name]
            raise MemoryOverflow(
                f"network {plan.network!r}: partition{'s' if len(mine) > 1 else ''} "
                f"{', '.join(p.name for p in mine)} compiled to {format_bytes(need)} but device "
                f"{name} has {format_bytes(dev.free)} free of {format_bytes(dev.memory)}: "
                f"{format_bytes(need - dev.free)} too big", worst)
    for name, need in charge.items():
        by_name[name].used += need
    loaded.sort(key=lambda item: item.partition.index)
    return loaded


def unload(loaded: Sequence[Loaded]) -> None:
    for item in loaded:
        item.device.used -= item.partition.compiled_memory or 0
