"""The partitioner: a network's optimized graph cut into a DAG of partitions over devices.

1. Each node gets a device kind: the user's mapping (node names of the optimized graph or of
   the ONNX model) if given; else, when the devices are of several kinds, a kind whose backend
   implements the node after lowering (staying on the kind of the node before where it can,
   so runs stay long); else the one kind there is.
2. Runs of nodes of one kind, in topological order, are the first cut.
3. A run that fits no device of its kind is cut further into contiguous pieces, one per
   device: each piece's weights plus inputs, outputs and peak activations within its device's free
   memory, minimizing (the largest piece's estimated work + the bytes that cross the cuts,
   as work) -- balanced work is what lets successive requests pipeline across devices.
   Over two devices, three pieces A B A (head and tail on one device) are taken instead
   when they balance the devices' work better: memory often forces an uneven cut in two,
   since early layers have little weight and much work and late layers the reverse.
4. `replicas` copies of the whole, each on the device with the fewest of the network's
   partitions among those with room for it (the most memory free first).

The result is a Plan (plan.py): data, printed by `glowgen partition`."""
from __future__ import annotations

import itertools
import math
from typing import Mapping, Optional, Sequence

from ..engine.graph import Constant, Function, Node, Placeholder
from ..errors import GlowgenError, UnsupportedError
from .costs import GraphCosts
from .devices import Device, format_bytes
from .plan import Partition, Plan, Tensor
from .subgraph import boundary

# A byte crossing a cut costs about as much as this much work (two copies through memory at
# ~10 GB/s against ~100 GFLOPS of kernels).
FLOPS_PER_CROSSING_BYTE = 20.0
# Work thresholds tried by the balanced split (between the ideal share and the whole).
THRESHOLDS = 24


def node_matches(node: Node, name: str) -> bool:
    return node.name == name or name in node.origin


class Partitioner:
    def __init__(self, function: Function, registry, devices: Sequence[Device],
                 margin: float = 1.0):
        self.function = function
        self.registry = registry
        self.devices = list(devices)
        self.by_name = {d.name: d for d in self.devices}
        self.costs = GraphCosts(function)
        self.margin = margin            # estimates are multiplied by this before fitting
        self._support_cache: dict = {}

    # ------------------------------------------------------------------ step 1: kinds
    def supports(self, node: Node, kind: str) -> bool:
        """Does `kind`'s backend run `node` once it is lowered for it?  Asked of a copy of the
        node alone in a scratch graph (its constants kept: lowering may depend on them)."""
        key = (kind, node.OP, repr(sorted(node.attr_values().items())),
               tuple((v.type, isinstance(v, Constant)) for v in node.flat_inputs()),
               tuple(id(f) for f in node.subfunctions()))
        if key not in self._support_cache:
            from .. import pipeline
            scratch = Function("support")
            def operand(v):
                if isinstance(v, Constant):
                    return scratch.add_constant(v.data, "c")
                return scratch.add_placeholder("x", v.type)
            copy = scratch.add_node(type(node), node.map_operands(operand), node.copy_args())
            for i, o in enumerate(copy.outputs):
                scratch.add_output(f"y{i}", o)
            try:
                pipeline.run(scratch, self.registry, pipeline.PIPELINE, kind)
                ok = True
            except GlowgenError:
                ok = False
            self._support_cache[key] = ok
        return self._support_cache[key]

    def kinds_by_support(self) -> list[str]:
        kinds = list(dict.fromkeys(d.kind for d in self.devices))
        if len(kinds) == 1:
            return [kinds[0]] * len(self.costs)
        out, previous = [], None
        for node in self.costs.nodes:
            candidates = ([previous] if previous else []) + [k for k in kinds if k != previous]
            chosen = next((k for k in candidates if self.supports(node, k)), None)
            if chosen is None:
                raise UnsupportedError(
                    f"node {node.name!r} ({node.OP}"
                    + (f", from ONNX node {', '.join(map(repr, node.origin))}" if node.origin else "")
                    + f") runs on none of the devices' backends ({', '.join(kinds)}); add a "
                      f"device whose backend implements it")
            out.append(chosen)
            previous = chosen
        return out

    def devices_by_mapping(self, mapping: Mapping[str, str]) -> list[str]:
        for node_name, dev in mapping.items():
            if dev not in self.by_name:
                raise GlowgenError(f"the mapping sends {node_name!r} to device {dev!r}, which the "
                                   f"host does not have; devices: {', '.join(self.by_name)}")
            if not any(node_matches(n, node_name) for n in self.costs.nodes):
                raise GlowgenError(f"the mapping names node {node_name!r}, which is not in the "
                                   f"network (names are ONNX node names or the optimized graph's)")
        out, previous = [], self.devices[0].name
        for node in self.costs.nodes:
            dev = next((d for name, d in mapping.items() if node_matches(node, name)), previous)
            out.append(dev)
            previous = dev
        return out

    # ------------------------------------------------------------------ step 3: memory
    def fit(self, lo: int, hi: int, kind: str, free: dict) -> list[tuple[int, int, str, str]]:
        """[(start, stop, device, reason)] covering nodes [lo, hi) on devices of `kind`."""
        devices = [d for d in self.devices if d.kind == kind]
        weights, acts = self.costs.memory_from(lo, hi)[-1]
        need = (weights + acts) * self.margin
        # Of the devices with room, the one with the fewest of this network's partitions, then
        # the most memory free: replicas spread over the devices.  (By memory first, two cpu
        # devices on one machine, each measuring what is available as it is made, put both
        # replicas of a small network on whichever measured a few KB more.)
        fitting = [d for d in devices if need <= free[d.name]]
        if fitting:
            best = max(fitting, key=lambda d: (-self._placed.get(d.name, 0), free[d.name]))
            return [(lo, hi, best.name, "fits")]
        # contiguous pieces over k devices, the fewest k that fits
        table = {a: self.costs.memory_from(a, hi) for a in range(lo, hi)}
        def mem(a, b):          # (weights, weights + inputs + outputs + peak activations)
            w, acts = table[a][b - a - 1]
            return w * self.margin, (w + acts) * self.margin
        order = sorted(devices, key=lambda d: -free[d.name])
        for k in range(2, len(order) + 1):
            pieces, score = None, math.inf
            # Which device takes which piece matters when their memory differs (the heavy
            # tail of a CNN wants the large one): every order for a few devices, else the
            # largest first and the largest last.
            chosen = order[:k]
            orders = (itertools.permutations(chosen) if k <= 3 else (chosen, chosen[::-1]))
            seen = set()
            for devs in orders:
                budgets = tuple(free[d.name] for d in devs)
                if budgets in seen:
                    continue            # devices with equal room: one order is enough
                seen.add(budgets)
                split, split_score = self._balanced_split(lo, hi, list(budgets), mem)
                if split is not None and split_score < score:
                    pieces, score = [(a, b, devs[j].name, "memory") for j, (a, b) in enumerate(split)], split_score
            if k == 2:
                for first, second in ((order[0], order[1]), (order[1], order[0])):
                    folded, folded_score = self._folded_split(
                        lo, hi, free[first.name], free[second.name], mem)
                    if folded is not None and folded_score < score * 0.97:
                        score = folded_score
                        pieces = [(a, b, dev.name, "memory, balanced")
                                  for (a, b), dev in zip(folded, (first, second, first))]
            if pieces is not None:
                return pieces
        self._refuse(lo, hi, kind, devices, free, weights, acts, mem)

    def _folded_split(self, lo, hi, budget_a, budget_b, mem):
        """Three pieces on two devices, A B A: the head and the tail on A, the middle on B.
        When memory forces an uneven cut in two (early layers: little weight, much work;
        late layers: the reverse), folding balances the devices' work: (cuts, score) with
        score = the busier device's work + crossing bytes as work; (None, inf) if none fits."""
        prefix = [0.0]
        for f in self.costs.flops[lo:hi]:
            prefix.append(prefix[-1] + f)
        cross = self.costs.crossing(lo, hi)
        best, best_score = None, math.inf
        for c1 in range(lo + 1, hi - 1):
            head_w, head = mem(lo, c1)
            if head_w > budget_a:
                break
            if head > budget_a:
                continue
            for c2 in range(hi - 1, c1, -1):
                tail_w, tail = mem(c2, hi)
                if head_w + tail_w > budget_a:
                    break
                if head + tail > budget_a or mem(c1, c2)[1] > budget_b:
                    continue
                work_a = prefix[c1 - lo] + prefix[hi - lo] - prefix[c2 - lo]
                work_b = prefix[c2 - lo] - prefix[c1 - lo]
                score = max(work_a, work_b) + FLOPS_PER_CROSSING_BYTE * (cross[c1 - lo] + cross[c2 - lo])
                if score < best_score:
                    best, best_score = [(lo, c1), (c1, c2), (c2, hi)], score
        return best, best_score

    def _balanced_split(self, lo, hi, budgets, mem):
        """Cuts of [lo, hi) into len(budgets) contiguous pieces, piece j within budgets[j],
        minimizing max piece work + crossing bytes as work; None when none fits."""
        k = len(budgets)
        prefix = [0.0]
        for f in self.costs.flops[lo:hi]:
            prefix.append(prefix[-1] + f)
        work = lambda a, b: prefix[b - lo] - prefix[a - lo]   # noqa: E731
        cross = self.costs.crossing(lo, hi)
        total = prefix[-1] or 1.0
        ideal = total / k
        thresholds = sorted({ideal * (total / ideal) ** (i / (THRESHOLDS - 1)) for i in range(THRESHOLDS)}
                            | {math.inf})
        best, best_score = None, math.inf
        for limit in thresholds:
            split = self._min_crossing(lo, hi, budgets, mem, work, cross, limit * (1 + 1e-9))
            if split is None:
                continue
            score = (max(work(a, b) for a, b in split)
                     + FLOPS_PER_CROSSING_BYTE * sum(cross[a - lo] for a, _ in split[1:]))
            if score < best_score:
                best, best_score = split, score
        return best, best_score

    @staticmethod
    def _min_crossing(lo, hi, budgets, mem, work, cross, limit):
        k = len(budgets)
        INF = math.inf
        # best[j][i]: least crossing bytes for nodes [lo, i) in j pieces; back[j][i]: last cut
        best = [[INF] * (hi + 1) for _ in range(k + 1)]
        back = [[-1] * (hi + 1) for _ in range(k + 1)]
        best[0][lo] = 0.0
        for j in range(1, k + 1):
            budget = budgets[j - 1]
            for i in range(lo + 1, hi + 1):
                if j == k and i != hi:
                    continue
                for a in range(i - 1, lo - 1, -1):
                    weights, need = mem(a, i)
                    if weights > budget or work(a, i) > limit:
                        break       # weights and work only grow as the piece grows backwards
                    if need > budget:
                        continue
                    prev = best[j - 1][a]
                    if prev == INF:
                        continue
                    c = prev + (cross[a - lo] if j > 1 else 0)
                    if c < best[j][i]:
                        best[j][i], back[j][i] = c, a
        if best[k][hi] == INF:
            return None
        cuts, i = [], hi
        for j in range(k, 0, -1):
            a = back[j][i]
            cuts.append((a, i))
            i = a
        return cuts[::-1]

    def _refuse(self, lo, hi, kind, devices, free, weights, acts, mem):
        biggest = max(devices, key=lambda d: free[d.name])
        room = free[biggest.name]
        alone = max(range(lo, hi), key=lambda i: mem(i, i + 1)[1])
        what = (f"network needs {format_bytes(weights + acts)} (weights {format_bytes(weights)} + "
                f"inputs, outputs and peak activations {format_bytes(acts)})" if (lo, hi) == (0, len(self.costs))
                else f"nodes {self.costs.nodes[lo].name!r} .. {self.costs.nodes[hi - 1].name!r} need "
                     f"{format_bytes(weights + acts)} (weights {format_bytes(weights)} + inputs, outputs and "
                     f"peak activations {format_bytes(acts)})")
        names = ", ".join(f"{d.name} {format_bytes(free[d.name])} free" for d in devices)
        single = mem(alone, alone + 1)[1]
        if single > room:
            node = self.costs.nodes[alone]
            raise GlowgenError(
                f"{what}; node {node.name!r} ({node.OP}) alone needs "
                f"{format_bytes(single)}, {format_bytes(single - room)} "
                f"more than the largest {kind} device has ({names}): give a device more memory")
        short = (weights + acts) * self.margin - sum(free[d.name] for d in devices)
        by = (f" by {format_bytes(short)} or more" if short > 0 else
              " (together they have room, but no cut into one piece per device fits each one)")
        raise GlowgenError(f"{what}: too big for the {kind} devices ({names}){by}; add {kind} "
                           f"devices or give them more memory")

    # ------------------------------------------------------------------ the plan
    def plan(self, network: str, mapping: Optional[Mapping[str, str]] = None, replicas: int = 1) -> Plan:
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
            raise GlowgenError(f"replicas must be a positive integer, not {replicas!r}")
        plan = Plan(network, inputs=[p.name for p in self.function.placeholders],
                    devices=[d.describe() for d in self.devices], replicas=replicas)
        free = {d.name: d.free for d in self.devices}
        self._placed: dict[str, int] = {}
        if mapping:
            assigned = self.devices_by_mapping(mapping)
            keys = assigned
        else:
            keys = self.kinds_by_support()
        runs = []                           # (start, stop, key)
        for i, key in enumerate(keys):
            if runs and runs[-1][2] == key:
                runs[-1] = (runs[-1][0], i + 1, key)
            else:
                runs.append((i, i + 1, key))
        for r in range(replicas):
            pieces = []
            for lo, hi, key in runs:
                if mapping:
                    pieces.append((lo, hi, key, "user"))
                else:
                    reason = "support" if len(runs) > 1 else None
                    for a, b, dev, why in self.fit(lo, hi, key, free):
                        pieces.append((a, b, dev, reason or why))
            first = len(plan.partitions)
            for a, b, dev, why in pieces:
                w, acts = self.costs.memory_from(a, b)[-1]
                free[dev] -= int((w + acts) * self.margin)
                self._placed[dev] = self._placed.get(dev, 0) + 1
                self._add_partition(plan, a, b, self.by_name[dev], why, r, first)
        # the network's outputs, from replica 0's partitions
        produced = {t: p.index for p in plan.replica(0) for t in p.outputs}
        for name, v in self.function.outputs:
            source = produced.get(v.name, "constant" if isinstance(v, Constant) else "input")
            plan.outputs.append((name, v.name, source))
        return plan

    def _add_partition(self, plan: Plan, a: int, b: int, device: Device, reason: str, replica: int,
                       first: int) -> None:
        nodes = self.costs.nodes[a:b]
        inputs, outputs = boundary(self.function, nodes)
        producer = {}
        for p in plan.partitions[first:]:
            for t in p.outputs:
                producer[t] = p.index
        index = len(plan.partitions)
        w, acts = self.costs.memory_from(a, b)[-1]
        ins = []
        for v in inputs:
            src = None if isinstance(v, Placeholder) else producer[v.name]
            ins.append(Tensor(v.name, v.type.nbytes, src, str(v.type)))
        name = f"p{index - first}" + (f".r{replica}" if plan.replicas > 1 else "")
        plan.partitions.append(Partition(
            index=index, name=name, device=device.name, kind=device.kind,
            nodes=[node.name for node in nodes], inputs=ins, outputs=[o.name for o in outputs],
            weights=w, activations=acts, flops=sum(self.costs.flops[a:b]), replica=replica,
            reason=reason))


def partition(function: Function, registry, devices: Sequence[Device], network: str = "network",
              mapping: Optional[Mapping[str, str]] = None, replicas: int = 1,
              margin: float = 1.0) -> Plan:
    """The plan of the optimized `function` over `devices` (see the module's docstring)."""
    return Partitioner(function, registry, devices, margin).plan(network, mapping, replicas)
