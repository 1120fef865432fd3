"""ONNX control flow (If, Loop, Scan), resolved at import time.

glowgen graphs have static shapes, and the importer removes control flow while it reads the
model wherever it can.  An If whose condition is known at compile time becomes the nodes of
the branch it takes; a Loop with a known trip count and a Scan over a static axis become
their body, imported once per iteration (unrolled), when they run a few iterations; longer
ones become a native loop over their body compiled once (a WhileLoop, below).  The bodies
are ONNX subgraphs
imported by the same generic importer (`_Importer.inline_graph`), in a nested name scope,
so names a body does not define resolve to the enclosing graph as ONNX specifies.

What is decided only at run time stays control flow (onnx_subgraphs.py): an If whose
branches give the same types becomes a Conditional node owning both; a Loop whose trip
count or condition is known only at run time, with loop-carried values of fixed types
and no scan outputs (their length, the number of iterations, is part of the types), a
WhileLoop owning its body.  A Loop with a known trip count and a Scan that run more than
UNROLL_AT_MOST iterations become WhileLoops too, their scan inputs and outputs read and
written slice by slice in place.

The slicing and stacking around unrolled bodies is written as ONNX nodes too
(`_Importer.emit_onnx`), so this module needs no glowgen op by name.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import CompileTimeInputError, ModelError, UnsupportedError
from .onnx_subgraphs import conditional, scan_loop, while_loop

# Unrolling copies the body once per iteration; beyond this the model is not one to unroll.
MAX_UNROLLED_ITERATIONS = 4096
# A Loop with a known trip count, or a Scan, running more iterations than this runs as a
# native loop over its body compiled once (a WhileLoop) where it can: unrolling a few
# iterations lets the optimizer fold and fuse across them, but its compile time grows
# with the iterations (faster than linearly: a 1000-iteration Loop with a scan output
# took 196 s to compile unrolled).
UNROLL_AT_MOST = 16


def graph_attribute(node: onnx.NodeProto, name: str, desc: str) -> onnx.GraphProto:
    for a in node.attribute:
        if a.name == name and a.type == onnx.AttributeProto.GRAPH:
            return a.g
    raise UnsupportedError(f"{desc}: graph attribute {name!r} is missing")


def int_attribute(node: onnx.NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def compile_time_value(importer, node: onnx.NodeProto, index: int, what: str, desc: str) -> np.ndarray:
    """The compile-time data of input `index` of `node`; a model input behind it is a
    CompileTimeInputError, so callers (and the conformance runner) can bind it."""
    value = importer.values[node.input[index]]
    data = importer.constant(value)
    if data is None:
        needed = importer.placeholders_behind(value)
        raise CompileTimeInputError(
            f"{desc}: the {what} ({node.input[index]!r}) must be known at compile time, since "
            f"glowgen resolves control flow while compiling, but it depends on model input"
            f"{'s' if len(needed) > 1 else ''} {', '.join(map(repr, needed))}; bind "
            f"{'them' if len(needed) > 1 else 'it'} as constant{'s' if len(needed) > 1 else ''} "
            f"to specialize the model (Python: constant_inputs=...)", needed, node.input[index])
    return data


def _bind_outputs(importer, node: onnx.NodeProto, values: list) -> None:
    for name, value in zip(node.output, values):
        if name:
            importer.values[name] = value


# ----------------------------------------------------------------------------- If
def import_if(importer, node: onnx.NodeProto, desc: str, opset: int) -> None:
    """The branch a compile-time condition selects, inlined; with a condition known only at
    run time, both branches in a conditional node (onnx_subgraphs.py)."""
    _check_condition(importer.values[node.input[0]], desc)
    try:
        cond = compile_time_value(importer, node, 0, "condition", desc)
    except CompileTimeInputError as unknown:
        _bind_outputs(importer, node, _run_time_if(importer, node, desc, opset, unknown).outputs)
        return
    branch = "then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"
    outputs = importer.inline_graph(graph_attribute(node, branch, desc), {}, f"{desc} ({branch})", opset)
    _bind_outputs(importer, node, outputs)


def _check_condition(cond, desc: str) -> None:
    if cond.type.size != 1:
        raise ModelError(f"{desc}: the condition {cond.name!r} is {cond.type}, with "
                         f"{cond.type.size} elements; an If's condition is one bool")
    if cond.type.dtype != "bool":
        raise ModelError(f"{desc}: the condition {cond.name!r} is {cond.type}; an If's condition "
                         f"is a bool (convert it with Cast(to=BOOL))")


def _run_time_if(importer, node: onnx.NodeProto, desc: str, opset: int,
                 unknown: CompileTimeInputError):
    """Both branches compiled, one run per call.  When that cannot be (the branches give
    different types, or a branch itself needs values known while compiling), the condition
    must be known at compile time after all: `unknown` is raised with the reason, and
    glowgen.compile specializes the model per value of the condition."""
    why = None
    try:
        cond_node = conditional(importer, node, importer.values[node.input[0]],
                                graph_attribute(node, "then_branch", desc),
                                graph_attribute(node, "else_branch", desc), desc, opset)
        if cond_node is None:
            why = "its branches give different types"
    except CompileTimeInputError as inner:
        why = f"a branch needs a value known at compile time ({inner})"
    if why is not None:
        raise CompileTimeInputError(f"{unknown} ({why}, so the If cannot be decided at run time)",
                                    unknown.inputs, unknown.value) from None
    return cond_node


# ----------------------------------------------------------------------------- Loop
def import_loop(importer, node: onnx.NodeProto, desc: str, opset: int) -> None:
    """Loop unrolled: the trip count must be known at compile time, and so must the
    condition after every iteration (a loop that stops on data cannot be unrolled)."""
    body = graph_attribute(node, "body", desc)
    inputs = list(node.input) + [""] * (2 - len(node.input))
    if not inputs[0] and not inputs[1]:
        raise UnsupportedError(f"{desc}: a Loop with neither trip count nor condition never ends")
    try:
        trip_count = (int(compile_time_value(importer, node, 0, "trip count", desc).reshape(-1)[0])
                      if inputs[0] else None)
        keep_going = (bool(compile_time_value(importer, node, 1, "initial condition", desc).reshape(-1)[0])
                      if inputs[1] else True)
    except CompileTimeInputError as unknown:
        _run_time_loop(importer, node, body, inputs, desc, opset, unknown)
        return
    carried = [importer.values[n] for n in inputs[2:]]
    n_carried = len(carried)
    n_scans = len(body.output) - 1 - n_carried
    if trip_count is not None and (trip_count > UNROLL_AT_MOST or (n_scans > 0 and trip_count <= 0)):
        loop = _known_trip_loop(importer, node, body, inputs, trip_count, keep_going, desc, opset)
        if loop is not None:
            _bind_outputs(importer, node, loop.outputs)
            return
    if trip_count is not None and trip_count > MAX_UNROLLED_ITERATIONS:
        _run_time_loop(importer, node, body, inputs, desc, opset, UnsupportedError(
            f"{desc}: trip count {trip_count} is too large to unroll (at most "
            f"{MAX_UNROLLED_ITERATIONS})"))
        return
    formals = [i.name for i in body.input]
    scans: list[list] = [[] for _ in body.output[1 + n_carried:]]
    iteration = 0
    while keep_going and (trip_count is None or iteration < trip_count):
        if iteration >= MAX_UNROLLED_ITERATIONS:
            raise UnsupportedError(f"{desc}: the loop runs more than {MAX_UNROLLED_ITERATIONS} "
                                   f"iterations; too many to unroll")
        bindings = {formals[0]: importer.function.add_constant(np.array(iteration, np.int64),
                                                               f"{node.name or 'loop'}.iter"),
                    formals[1]: importer.function.add_constant(np.array(True), f"{node.name or 'loop'}.cond")}
        bindings.update(zip(formals[2:], carried))
        outs = importer.inline_graph(body, bindings, f"{desc} (iteration {iteration})", opset)
        cond_out, carried, scanned = outs[0], outs[1:1 + n_carried], outs[1 + n_carried:]
        for stack, value in zip(scans, scanned):
            stack.append(value)
        iteration += 1
        if inputs[1] or trip_count is None:
            known = importer.constant(cond_out)
            if known is None:
                # What this unrolling imported is dead now (DCE collects it).
                _run_time_loop(importer, node, body, inputs, desc, opset, UnsupportedError(
                    f"{desc}: the loop's condition depends on data computed in the loop, so the "
                    f"number of iterations is not known at compile time"))
                return
            keep_going = bool(np.asarray(known).reshape(-1)[0])
    if any(not stack for stack in scans):
        raise UnsupportedError(f"{desc}: the loop runs no iteration, so its scan outputs are empty "
                               f"tensors of unknown shape, which glowgen does not support")
    stacked = [importer.emit_onnx("Concat", [importer.emit_onnx("Unsqueeze", [v], axes=[0])[0]
                                             for v in stack], axis=0)[0]
               for stack in scans]
    _bind_outputs(importer, node, list(carried) + stacked)


def _known_trip_loop(importer, node: onnx.NodeProto, body, inputs: list, trip_count: int,
                     keep_going: bool, desc: str, opset: int):
    """A Loop whose trip count is known at compile time as a native loop (a WhileLoop), or
    None when it cannot be one (the caller unrolls it).  Its scan outputs have the trip count
    for length, so a loop with some must provably run all its iterations: its condition is
    true initially and its body passes it through or gives a constant true."""
    n_carried = len(inputs) - 2
    trip = importer.values[inputs[0]]
    if trip.type.dtype != "i64" or trip.type.size != 1:
        return None                                     # _run_time_loop's error says why
    cond = importer.values[inputs[1]] if inputs[1] else None
    length = None
    if len(body.output) > 1 + n_carried:
        if not keep_going or (cond is not None and not _passes_condition_through(body)):
            return None
        cond, length = None, max(trip_count, 0)
    try:
        return while_loop(importer, node, trip, cond, [importer.values[n] for n in inputs[2:]],
                          body, desc, opset, length)
    except CompileTimeInputError:
        return None                                     # the body needs unrolled constants


def _passes_condition_through(body: onnx.GraphProto) -> bool:
    """Whether a Loop body's condition output is its condition input, or a constant true."""
    out, given = body.output[0].name, body.input[1].name
    producers = {o: n for n in body.node for o in n.output}
    while out in producers and producers[out].op_type == "Identity":
        out = producers[out].input[0]
    if out == given:
        return True
    made = producers.get(out)
    value = next((a.t for a in made.attribute if a.name == "value"), None) if (
        made is not None and made.op_type == "Constant") else next(
        (t for t in body.initializer if t.name == out), None)
    if value is None:
        return False
    data = numpy_helper.to_array(value)
    return data.size == 1 and bool(data.reshape(-1)[0])


def _run_time_loop(importer, node: onnx.NodeProto, body, inputs: list, desc: str, opset: int,
                   unknown: UnsupportedError) -> None:
    """The Loop as a WhileLoop node: its body compiled once and run as many times as the
    trip count and condition say when the model runs.  When that cannot be (scan outputs,
    whose length is the number of iterations; a state whose type changes from one iteration
    to the next; a body that itself needs values known at compile time), `unknown`, the
    reason the loop could not be unrolled, is raised with that reason added: for a
    CompileTimeInputError, glowgen.compile then specializes per trip count."""
    trip = importer.values[inputs[0]] if inputs[0] else None
    cond = importer.values[inputs[1]] if inputs[1] else None
    for label, v, dtype in (("trip count", trip, "i64"), ("condition", cond, "bool")):
        if v is not None and (v.type.dtype != dtype or v.type.size != 1):
            raise ModelError(f"{desc}: the {label} {v.name!r} is {v.type}; a Loop's {label} is "
                             f"one {dtype}")
    initial = [importer.values[n] for n in inputs[2:]]
    why, loop = None, None
    if len(body.output) > 1 + len(initial):
        why = "it has scan outputs, whose length is the number of iterations"
    else:
        try:
            loop = while_loop(importer, node, trip, cond, initial, body, desc, opset)
            if loop is None:
                why = "its body gives the loop-carried values other types than it takes"
        except CompileTimeInputError as inner:
            why = f"its body needs a value known at compile time ({inner})"
    if why is not None:
        reason = f"{unknown} ({why}, so the Loop cannot run as a loop at run time either)"
        if isinstance(unknown, CompileTimeInputError):
            raise CompileTimeInputError(reason, unknown.inputs, unknown.value) from None
        raise UnsupportedError(reason) from None
    _bind_outputs(importer, node, loop.outputs)


# ----------------------------------------------------------------------------- Scan
@dataclass
class ScanLayout:
    """Which axis each scan input and output runs along, and which way (1: backwards);
    None means ONNX's default (axis 0, forwards)."""
    input_axes: Optional[list] = None
    input_directions: Optional[list] = None
    output_axes: Optional[list] = None
    output_directions: Optional[list] = None

    @classmethod
    def of(cls, node: onnx.NodeProto) -> "ScanLayout":
        return cls(*(int_attribute(node, name, None) for name in (
            "scan_input_axes", "scan_input_directions", "scan_output_axes", "scan_output_directions")))


def import_scan(importer, node: onnx.NodeProto, desc: str, opset: int) -> None:
    body = graph_attribute(node, "body", desc)
    n_scan_in = int_attribute(node, "num_scan_inputs", None)
    if n_scan_in is None:
        raise UnsupportedError(f"{desc}: attribute 'num_scan_inputs' is required")
    if opset < 9:
        _import_scan8(importer, node, body, n_scan_in, desc, opset)
        return
    values = [importer.values[n] for n in node.input]
    n_state = len(values) - n_scan_in
    outputs = _scan(importer, node, ScanLayout.of(node), body, values[:n_state],
                    values[n_state:], desc, opset)
    _bind_outputs(importer, node, outputs)


def _scan(importer, node, layout: ScanLayout, body, states: list, scan_inputs: list, desc: str,
          opset: int) -> list:
    """Scan (opset 9 semantics): the final states, then the scan outputs stacked along their
    axes; a native loop over the body when the scan is long, else unrolled."""
    n_in = len(scan_inputs)
    if not n_in:
        raise UnsupportedError(f"{desc}: a Scan needs at least one scan input")
    in_axes = _normalized(layout.input_axes or [0] * n_in, [v.type.rank for v in scan_inputs],
                          desc, "scan_input_axes")
    lengths = {v.type.shape[a] for v, a in zip(scan_inputs, in_axes)}
    if len(lengths) != 1:
        raise UnsupportedError(f"{desc}: the scan inputs have different lengths "
                               f"{sorted(lengths)} along their scan axes")
    steps = lengths.pop()
    if steps > UNROLL_AT_MOST:
        outputs = _scan_loop(importer, node, layout, body, states, scan_inputs, in_axes, desc, opset)
        if outputs is not None:
            return outputs
    return _unroll_scan(importer, layout, body, states, scan_inputs, in_axes, steps, desc, opset)


def _scan_loop(importer, node, layout: ScanLayout, body, states: list, scan_inputs: list,
               in_axes: list, desc: str, opset: int) -> Optional[list]:
    """The Scan as a native loop (a WhileLoop), iteration i reading slice i of each scan
    input and writing slice i of each scan output in place.  The loop scans and stacks
    along first axes: a scan input along another axis is transposed to put it first (once,
    before the loop), and a scan output is transposed back after it.  None when the body
    gives its state other types than it takes, or needs values known at compile time that
    unrolling makes constants (the caller unrolls it then; what the transposes added is
    dead and DCE collects it)."""
    n_state = len(states)
    n_out = len(body.output) - n_state
    firsts = [_axis_first(importer, v, axis) for v, axis in zip(scan_inputs, in_axes)]
    try:
        loop = scan_loop(importer, node, states, firsts,
                         layout.input_directions or [0] * len(scan_inputs),
                         layout.output_directions or [0] * n_out, body, desc, opset)
    except CompileTimeInputError:
        loop = None                 # the body needs values unrolling makes constants
    if loop is None:
        return None
    results = list(loop.outputs[:n_state])
    stacked = loop.outputs[n_state:]
    out_axes = _normalized(layout.output_axes or [0] * n_out, [v.type.rank for v in stacked],
                           desc, "scan_output_axes")
    for value, axis in zip(stacked, out_axes):
        if axis:
            # The stacked axis (first) goes to `axis`, the others keep their order.
            perm = list(range(1, axis + 1)) + [0] + list(range(axis + 1, value.type.rank))
            value = importer.emit_onnx("Transpose", [value], perm=perm)[0]
        results.append(value)
    return results


def _axis_first(importer, value, axis: int):
    if axis == 0:
        return value
    perm = [axis] + [d for d in range(value.type.rank) if d != axis]
    return importer.emit_onnx("Transpose", [value], perm=perm)[0]


def _unroll_scan(importer, layout: ScanLayout, body, states: list, scan_inputs: list,
                 in_axes: list, steps: int, desc: str, opset: int) -> list:
    """The Scan unrolled over the scan axis (`steps` long)."""
    n_state = len(states)
    n_out = len(body.output) - n_state
    in_dirs = list(layout.input_directions or [0] * len(scan_inputs))
    if steps == 0:
        raise UnsupportedError(f"{desc}: the scan axis is empty, so the scan outputs are empty "
                               f"tensors of unknown shape, which glowgen does not support")
    if steps > MAX_UNROLLED_ITERATIONS:
        raise UnsupportedError(f"{desc}: {steps} scan steps are too many to unroll "
                               f"(at most {MAX_UNROLLED_ITERATIONS})")
    formals = [i.name for i in body.input]
    scanned: list[list] = [[] for _ in range(n_out)]
    for t in range(steps):
        bindings = dict(zip(formals[:n_state], states))
        for formal, value, axis, reverse in zip(formals[n_state:], scan_inputs, in_axes, in_dirs):
            index = steps - 1 - t if reverse else t
            piece = importer.emit_onnx("Slice", [value], starts=[index], ends=[index + 1], axes=[axis])[0]
            bindings[formal] = importer.emit_onnx("Squeeze", [piece], axes=[axis])[0]
        outs = importer.inline_graph(body, bindings, f"{desc} (step {t})", opset)
        states = outs[:n_state]
        for stack, value in zip(scanned, outs[n_state:]):
            stack.append(value)
    out_axes = _normalized(layout.output_axes or [0] * n_out, [s[0].type.rank + 1 for s in scanned],
                           desc, "scan_output_axes")
    results = list(states)
    for stack, axis, reverse in zip(scanned, out_axes, layout.output_directions or [0] * n_out):
        pieces = [importer.emit_onnx("Unsqueeze", [v], axes=[axis])[0]
                  for v in (stack[::-1] if reverse else stack)]
        results.append(importer.emit_onnx("Concat", pieces, axis=axis)[0])
    return results


def _normalized(axes, ranks, desc, what) -> list:
    out = []
    for a, r in zip(axes, ranks):
        if not -r <= a < r:
            raise UnsupportedError(f"{desc}: {what} holds axis {a}, out of range for rank {r}")
        out.append(a + r if a < 0 else a)
    return out


def _import_scan8(importer, node, body, n_scan_in, desc, opset) -> None:
    """Scan-8 runs its body per batch element (axis 0) and scans axis 1: each batch element
    is a Scan-9 over axis 0 of its slice, and the results are stacked along the batch."""
    if node.input[0]:
        lens = compile_time_value(importer, node, 0, "sequence_lens", desc)
        full = {v.type.shape[1] for v in (importer.values[n] for n in node.input[-n_scan_in:])}
        if any(int(x) not in full for x in np.asarray(lens).reshape(-1)):
            raise UnsupportedError(f"{desc}: sequence_lens shorter than the scan axis are not "
                                   f"supported")
    values = [importer.values[n] for n in node.input[1:]]
    n_state = len(values) - n_scan_in
    layout = ScanLayout(input_directions=int_attribute(node, "directions", None))
    per_batch = []
    for b in range(values[0].type.shape[0]):
        sliced = [importer.emit_onnx("Squeeze", [importer.emit_onnx(
            "Slice", [v], starts=[b], ends=[b + 1], axes=[0])[0]], axes=[0])[0] for v in values]
        per_batch.append(_scan(importer, node, layout, body, sliced[:n_state], sliced[n_state:],
                               f"{desc} (batch {b})", opset))
    outputs = [importer.emit_onnx("Concat", [importer.emit_onnx("Unsqueeze", [r[i]], axes=[0])[0]
                                             for r in per_batch], axis=0)[0]
               for i in range(len(per_batch[0]))]
    _bind_outputs(importer, node, outputs)


CONTROL_FLOW: dict[str, Callable] = {"If": import_if, "Loop": import_loop, "Scan": import_scan}
