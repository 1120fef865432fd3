"""A model cut at an op whose output shape depends on run-time values.

NonZero, Unique and a Compress with a computed condition give as many elements as their
operands' values say, so no compilation before the call can know the shapes after them.
The specializing model (specialize.py) cuts the ONNX graph at the first such op instead:

    head   the nodes the op's operands are computed from, as a model of its own whose
           outputs are those operands and every value of the head the rest reads;
    op     computed natively on the concrete operands (frontend/onnx_data_dependent.py);
    tail   every other node, as a model whose inputs are the model inputs, the head's values
           and the op's outputs it reads.

Head and tail are specializing models themselves, sharing their parent's variant cache (its
LRU bound, its lock and its statistics; each variant names its piece), so the tail is
compiled per shape the op gives, and a repeated extent finds its variant compiled.  A tail
that meets a second such op is cut again, and so on.

The cut is made on the ONNX graph (frontend/onnx_cut.py), not on the typed graph that
runtime/subgraph.py cuts: that one exists only with every shape known, and the shapes behind
the op are not.
"""
from __future__ import annotations

import logging
import numpy as np
import onnx
from onnx import numpy_helper

from .errors import DataDependentError
from .frontend import onnx_data_dependent
from .frontend.onnx_cut import ancestors, piece, reads

log = logging.getLogger("glowgen.specialize")


# ----------------------------------------------------------------------------- the stages
class Staged:
    """Runs a model cut at the data-dependent node `error` names: head, the node natively,
    tail (see the module docstring).  `parent` is the SpecializingModel of the whole."""

    def __init__(self, parent, error: DataDependentError):
        proto = parent.proto
        node = next((n for n in proto.graph.node if error.outputs
                     and list(error.outputs) == [o for o in n.output if o]), None)
        if node is None or not onnx_data_dependent.is_data_dependent(node):
            raise error          # not a node of the main graph (a function body's, say)
        self.node = node
        what = f"{node.op_type} {node.name or node.output[0]!r}"
        typed = onnx.shape_inference.infer_shapes(proto)
        types = {vi.name: vi for vi in list(typed.graph.value_info) + list(typed.graph.output)
                 + list(typed.graph.input)}
        graph_outputs = [o.name for o in proto.graph.output]
        inits = {i.name: i for i in proto.graph.initializer}

        head_nodes = ancestors(proto, reads(node))
        in_head = {id(n) for n in head_nodes}
        tail_nodes = [n for n in proto.graph.node if id(n) not in in_head and n is not node]
        head_values = {o for n in head_nodes for o in n.output if o}
        tail_reads = [r for n in tail_nodes for r in reads(n)]
        head_outputs = [v for v in dict.fromkeys(list(reads(node)) + tail_reads + graph_outputs)
                        if v in head_values]
        tail_values = {o for n in tail_nodes for o in n.output if o}
        tail_outputs = [o for o in graph_outputs if o in tail_values]

        # The operands of the node that are constants of the model (the others come from
        # the call: model inputs or the head's outputs).
        self.constants = {n: numpy_helper.to_array(inits[n]) for n in node.input if n in inits}
        self.head = self.tail = None
        if head_nodes:
            self.head = parent.piece(piece(proto, head_nodes, head_outputs, types,
                                           f"{proto.graph.name}_until_{node.output[0]}"),
                                     f"until {what}")
        if tail_nodes and tail_outputs:
            self.tail = parent.piece(piece(proto, tail_nodes, tail_outputs, types,
                                           f"{proto.graph.name}_after_{node.output[0]}"),
                                     f"after {what}")
        self.output_names = graph_outputs
        log.info("cut the graph at %s, whose output shape depends on run-time values: %d "
                 "node(s) before it, %d after; it is computed natively on each call",
                 what, len(head_nodes), len(tail_nodes))

    @property
    def pieces(self) -> list:
        return [p for p in (self.head, self.tail) if p is not None]

    def run(self, arrays: dict) -> dict:
        values = dict(arrays)
        if self.head is not None:
            values.update(self.head.run({n: values[n] for n in self.head.input_names}))
        operands = [None if not n else self.constants[n] if n in self.constants else values[n]
                    for n in self.node.input]
        values.update(onnx_data_dependent.evaluate(self.node, operands))
        if self.tail is not None:
            values.update(self.tail.run({n: values[n] for n in self.tail.input_names}))
        return {n: np.asarray(values[n]) for n in self.output_names}
