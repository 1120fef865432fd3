"""Cutting an ONNX graph into models of their own.

The cut is made on the ONNX graph, not on the typed graph that runtime/subgraph.py cuts:
that one exists only with every shape known, and these pieces are cut exactly where shapes
are not (specialize.py's deciders compute values that decide shapes; staged.py cuts at ops
whose output shapes depend on run-time values)."""
from __future__ import annotations

from typing import Iterable

import onnx
from onnx import helper

from ..errors import GlowgenError

_SUBGRAPHS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


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
            inputs.append(declared.get(value) or dynamic(typed(types, value)))
    graph = helper.make_graph(nodes, name, inputs, [typed(types, o) for o in outputs],
                              used_inits)
    model = helper.make_model(graph, opset_imports=proto.opset_import,
                              ir_version=proto.ir_version)
    model.functions.extend(proto.functions)
    return model


def typed(types: dict, name: str) -> onnx.ValueInfoProto:
    vi = types.get(name)
    if vi is None or not vi.type.tensor_type.elem_type:
        raise GlowgenError(f"cannot cut the graph at {name!r}: ONNX shape inference gives no "
                           f"element type for it; declare it in the model's value_info")
    return vi


def dynamic(vi: onnx.ValueInfoProto) -> onnx.ValueInfoProto:
    """`vi` with the dimensions shape inference could not fix left blank (dynamic), rather
    than named after its own symbols (unk__0)."""
    out = onnx.ValueInfoProto()
    out.CopyFrom(vi)
    if out.type.tensor_type.HasField("shape"):
        for d in out.type.tensor_type.shape.dim:
            if not d.HasField("dim_value"):
                d.Clear()
    return out
