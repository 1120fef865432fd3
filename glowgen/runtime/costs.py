"""What a stretch of the optimized graph costs: bytes of weights, bytes of inputs plus peak
live activations, estimated work, and the bytes that cross a cut.  Known only through types
and operands (no op is named): the partitioner asks these of contiguous runs of nodes in
topological order."""
from __future__ import annotations

from ..engine.graph import Constant, Function, Node


def node_flops(node: Node) -> float:
    """Estimated multiply-adds x 2 of a node, from its types alone.  With a weight operand
    (the largest constant of rank >= 2) each output element reads the weight's elements per
    output feature: 2 * outputs * weight.size / (the weight's largest dimension that is also an
    output dimension), which is a convolution's or a dense layer's count.  Without one, the
    elements it reads and writes, or for a product of two computed tensors of rank >= 2, its
    inner dimension."""
    out_elems = sum(o.type.size for o in node.outputs)
    ins = node.flat_inputs()
    weights = [v for v in ins if isinstance(v, Constant) and v.type.rank >= 2]
    out_shape = node.outputs[0].type.shape if node.outputs else ()
    if weights:
        w = max(weights, key=lambda v: v.type.size)
        shared = [d for d in w.type.shape if d in out_shape and d > 1] or [max(w.type.shape)]
        per_output = w.type.size / max(shared)
        return 2.0 * out_elems * max(per_output, 1.0)
    ranked = [v for v in ins if v.type.rank >= 2]
    if len(ranked) == 2 and out_shape and len(ins) == 2:
        a, b = ranked
        if a.type.shape[-1] == b.type.shape[-2 if b.type.rank >= 2 else -1] and a.type.shape[-1] > 1:
            return 2.0 * out_elems * a.type.shape[-1]
    return float(max(out_elems, sum(v.type.size for v in ins)))


def _flops(node) -> float:
    """A node's work; a conditional's: that of its costlier branch."""
    if node.subfunctions():
        return max(sum(_flops(n) for n in f.nodes) for f in node.subfunctions())
    return node_flops(node)


def _branch_constants(node) -> dict:
    """{id: bytes} of the constants a node's sub-functions hold (both branches are loaded)."""
    out = {}
    for f in node.subfunctions():
        out.update((id(c), c.type.nbytes) for c in f.constants)
        for n in f.nodes:
            out.update(_branch_constants(n))
    return out


class GraphCosts:
    """Per-node facts of `function` in its node order, and the cost of any contiguous run."""

    def __init__(self, function: Function):
        self.function = function
        self.nodes = list(function.nodes)
        n = len(self.nodes)
        self.index = {id(node): i for i, node in enumerate(self.nodes)}
        graph_outputs = {id(v) for _, v in function.outputs}
        self.flops = [_flops(node) for node in self.nodes]
        self.constants = []            # per node: {id(constant): bytes}
        self.reads = []                # per node: [(id(value), bytes, producer index or -1)]
        self.outputs = []              # per node: [(id(value), bytes)]
        self.last_use: dict[int, int] = {}
        for i, node in enumerate(self.nodes):
            consts, reads, seen = {}, [], set()
            for v in node.flat_inputs():
                if isinstance(v, Constant):
                    consts[id(v)] = v.type.nbytes
                elif id(v) not in seen:
                    seen.add(id(v))
                    p = v.producer
                    reads.append((id(v), v.type.nbytes, self.index[id(p)] if p is not None else -1))
                    self.last_use[id(v)] = i
            consts.update(_branch_constants(node))
            self.constants.append(consts)
            self.reads.append(reads)
            self.outputs.append([(id(o), o.type.nbytes) for o in node.outputs])
            for o in node.outputs:
                if id(o) in graph_outputs:
                    self.last_use[id(o)] = n          # read by the caller: live to the end
        # values whose last reader is node i, with their producer and bytes
        self.dying: list[list] = [[] for _ in range(n + 1)]
        for i, node in enumerate(self.nodes):
            for vid, nbytes in self.outputs[i]:
                self.dying[self.last_use.get(vid, i)].append((vid, nbytes, i))

    def __len__(self) -> int:
        return len(self.nodes)

    def memory_from(self, a: int, stop: int) -> list[tuple[int, int]]:
        """For each end b in (a, stop]: (weights, inputs + outputs + peak activations) of nodes
        [a, b).  One sweep: the live set at node t is what nodes a..t computed and someone
        still reads at or after t; inputs are what the run reads that was computed before it;
        outputs what it computes that is read after it."""
        out = []
        weights, seen_consts = 0, set()
        inputs, seen_inputs = 0, set()
        live = peak = 0
        outputs = 0         # what [a, t] computes and someone after t reads: the run's outputs
        for t in range(a, stop):
            if t > a:
                for vid, nbytes, producer in self.dying[t - 1]:
                    if producer >= a:
                        live -= nbytes
                        if producer < t - 1:
                            outputs -= nbytes
            for cid, nbytes in self.constants[t].items():
                if cid not in seen_consts:
                    seen_consts.add(cid)
                    weights += nbytes
            for vid, nbytes, producer in self.reads[t]:
                if producer < a and vid not in seen_inputs:
                    seen_inputs.add(vid)
                    inputs += nbytes
            live += sum(nbytes for _, nbytes in self.outputs[t])
            peak = max(peak, live)
            outputs += sum(nbytes for vid, nbytes in self.outputs[t] if self.last_use.get(vid, t) > t)
            # A compiled run holds its outputs for the whole call (beside its inputs) and its
            # own values in the activation region: the outputs counted again is what that costs
            # (an overestimate by at most the outputs, where an underestimate costs a replan).
            out.append((weights, inputs + peak + outputs))
        return out

    def crossing(self, lo: int, hi: int) -> list[int]:
        """crossing[c] for c in [lo, hi]: bytes computed in [lo, c) and read in [c, hi)."""
        cross = [0] * (hi - lo + 1)
        for i in range(lo, hi):
            for vid, nbytes in self.outputs[i]:
                last = min(self.last_use.get(vid, i), hi - 1)
                # read after its producer i up to `last`: crosses every cut c in (i, last]
                for c in range(i + 1, last + 1):
                    cross[c - lo] += nbytes
        return cross
