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

The cut is made on the ONNX graph, not on the typed graph that runtime/subgraph.py cuts:
that one exists only with every shape known, and the shapes behind the op are not.
"""
from __future__ import annotations

import logging
from typing import Iterable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .errors import DataDependentError, GlowgenError
from .frontend import onnx_data_dependent

log = logging.getLogger("glowgen.specialize")

_SUBGRAPHS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


# ----------------------------------------------------------------------------- the ONNX cut
def reads(node: onnx.NodeProto) -> list[str]:
    """The names `node` reads from its scope: its inputs, and the names its subgraphs (an
    If's branches, a Loop's body) use without defining them."""
    names = [n for n in node.input if n]
    for attr in node.attribute:
        if attr.type in _SUBGRAPHS:
            for graph in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs):
                names += _outer_reads(graph)
    return names


def _outer_reads(graph: onnx.GraphProto) -> list[str]:
    defined = {v.name for v in graph.input} | {i.name for i in graph.initializer}
    out = []
    for node in graph.node:
        out += [n for n in reads(node) if n not in defined]
        defined.update(o for o in node.output if o)
    return out


def ancestors(proto: onnx.ModelProto, names: Iterable[str]) -> list[onnx.NodeProto]:
    """The nodes of the main graph that the values `names` are computed from, in graph order."""
    producer = {o: node for node in proto.graph.node for o in node.output if o}
    keep, stack = set(), list(names)
    while stack:
        node = producer.get(stack.pop())
        if node is not None and id(node) not in keep:
            keep.add(id(node))
            stack.extend(reads(node))
    return [n for n in proto.graph.node if id(n) in keep]


def piece(proto: onnx.ModelProto, nodes: list, outputs: list[str], types: dict,
          name: str) -> onnx.ModelProto:
    """The model computing `outputs` with `nodes` of `proto`: its inputs are what the nodes
    read and do not compute (model inputs keep their declarations, other values get their
    type from `types`, name -> ValueInfoProto), and the initializers they read come along."""
    inits = {i.name: i for i in proto.graph.initializer}
    declared = {vi.name: vi for vi in proto.graph.input}
    computed = {o for n in nodes for o in n.output if o}
    needed = list(dict.fromkeys([r for n in nodes for r in reads(n)] + list(outputs)))
    inputs, used_inits = [], []
    for value in needed:
        if value in computed:
            continue
        if value in inits:
            used_inits.append(inits[value])
        else:
            inputs.append(declared.get(value) or _dynamic(_typed(types, value)))
    graph = helper.make_graph(nodes, name, inputs, [_typed(types, o) for o in outputs],
                              used_inits)
    model = helper.make_model(graph, opset_imports=proto.opset_import,
                              ir_version=proto.ir_version)
    model.functions.extend(proto.functions)
    return model


def _typed(types: dict, name: str) -> onnx.ValueInfoProto:
    vi = types.get(name)
    if vi is None or not vi.type.tensor_type.elem_type:
        raise GlowgenError(f"cannot cut the graph at {name!r}: ONNX shape inference gives no "
                           f"element type for it; declare it in the model's value_info")
    return vi


def _dynamic(vi: onnx.ValueInfoProto) -> onnx.ValueInfoProto:
    """`vi` with the dimensions shape inference could not fix left blank (dynamic), rather
    than named after its own symbols (unk__0)."""
    out = onnx.ValueInfoProto()
    out.CopyFrom(vi)
    if out.type.tensor_type.HasField("shape"):
        for d in out.type.tensor_type.shape.dim:
            if not d.HasField("dim_value"):
                d.Clear()
    return out


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
