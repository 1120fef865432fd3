"""ONNX ops whose output shapes depend on the values of their operands.

NonZero, Compress, Unique and NonMaxSuppression give as many elements as their data says.
glowgen compiles static graphs, so such an op compiles only when its operands are known
while compiling: Compress then lowers by its clause in specs/ops.glowdef, and the others
are folded here into constants.  When an operand is computed at run time, the importer
raises DataDependentError, and the specializing model (glowgen/staged.py) cuts the graph
there: it runs the part before, computes the op with the functions below on the concrete
operands, and runs the part after compiled for the shapes that came out.

Each function takes the node's inputs (None for an absent optional one) and its attributes
(ONNX defaults filled in) and returns all of the op's outputs, as ONNX defines them
(checked against onnxruntime in tests/test_data_dependent.py).  They run once per call on
whole tensors with NumPy's vectorized functions."""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np
import onnx
from onnx import helper

from ..errors import CompileTimeInputError, DataDependentError, InputError


def nonzero(inputs: Sequence, attrs: dict) -> list:
    """[rank, n] int64: the indices of the nonzero elements, in row-major order.  A scalar
    counts as a 1-D tensor of one element (onnxruntime's [1, n])."""
    x = np.asarray(inputs[0])
    return [np.array(np.nonzero(x.reshape(-1) if x.ndim == 0 else x), dtype=np.int64)]


def compress(inputs: Sequence, attrs: dict) -> list:
    """The slices of x where the 1-D condition is true, along `axis` (x flattened without
    one); a condition shorter than the dimension selects among the first slices only."""
    x, condition = np.asarray(inputs[0]), np.asarray(inputs[1])
    if condition.ndim != 1:
        raise InputError(f"Compress: the condition must be 1-D, got shape {list(condition.shape)}")
    axis = attrs.get("axis")
    size = x.size if axis is None else x.shape[axis]
    if condition.shape[0] > size:
        raise InputError(f"Compress: the condition has {condition.shape[0]} entries, more than "
                         f"the {size} of the compressed {'tensor' if axis is None else 'dimension'}")
    return [np.compress(condition.astype(bool), x, axis=axis)]


def unique(inputs: Sequence, attrs: dict) -> list:
    """Y, indices (of first occurrences), inverse_indices, counts; Y sorted, or in the order
    of first occurrence when sorted=0; of the flattened tensor, or of slices along `axis`."""
    x = np.asarray(inputs[0])
    axis = attrs.get("axis")
    if axis is not None and axis < 0:
        axis += x.ndim
    y, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True,
                                          return_counts=True, axis=axis)
    inverse = inverse.reshape(-1)
    if not attrs.get("sorted", 1):
        order = np.argsort(first, kind="stable")          # by first occurrence
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        y = np.take(y, order, axis=0 if axis is None else axis)
        first, counts, inverse = first[order], counts[order], rank[inverse]
    return [y, first.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64)]


def non_max_suppression(inputs: Sequence, attrs: dict) -> list:
    """[selected, 3] int64 (batch, class, box): per batch and class, the boxes scoring above
    score_threshold, best first (the lower index first among equal scores), each kept unless
    its IoU with a box kept before exceeds iou_threshold, at most max_output_boxes_per_class
    of them (0 or absent: none)."""
    boxes, scores = np.asarray(inputs[0]), np.asarray(inputs[1])
    limit, iou_limit, score_limit = (None if i >= len(inputs) or inputs[i] is None
                                     or np.asarray(inputs[i]).size == 0
                                     else np.asarray(inputs[i]).reshape(-1)[0] for i in (2, 3, 4))
    limit = 0 if limit is None else max(int(limit), 0)
    iou_limit = boxes.dtype.type(0) if iou_limit is None else iou_limit
    if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3 \
            or scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise InputError(f"NonMaxSuppression: boxes must be [batches, boxes, 4] and scores "
                         f"[batches, classes, boxes], got {list(boxes.shape)} and "
                         f"{list(scores.shape)}")
    selected = []
    for b in range(boxes.shape[0]):
        suppresses = _suppression(boxes[b], attrs.get("center_point_box", 0), iou_limit)
        for c in range(scores.shape[1]):
            score = scores[b, c]
            candidates = (np.arange(score.size) if score_limit is None
                          else np.flatnonzero(score > score_limit))
            order = candidates[np.argsort(-score[candidates], kind="stable")]
            alive = np.ones(order.size, bool)
            kept = 0
            for k in range(order.size):          # greedy: each kept box suppresses the rest
                if kept == limit:
                    break
                if alive[k]:
                    selected.append((b, c, order[k]))
                    kept += 1
                    alive[k + 1:] &= ~suppresses[order[k], order[k + 1:]]
    return [np.array(selected, np.int64).reshape(-1, 3)]


def _suppression(boxes: np.ndarray, center_point_box: int, iou_limit) -> np.ndarray:
    """[n, n] bool: whether box i suppresses box j (IoU above the limit; boxes without area
    or apart suppress nothing), computed in the boxes' element type as onnxruntime does."""
    if center_point_box:
        half_w, half_h = boxes[:, 2] / 2, boxes[:, 3] / 2
        x0, x1 = boxes[:, 0] - half_w, boxes[:, 0] + half_w
        y0, y1 = boxes[:, 1] - half_h, boxes[:, 1] + half_h
    else:
        y0, y1 = np.minimum(boxes[:, 0], boxes[:, 2]), np.maximum(boxes[:, 0], boxes[:, 2])
        x0, x1 = np.minimum(boxes[:, 1], boxes[:, 3]), np.maximum(boxes[:, 1], boxes[:, 3])
    ix = np.minimum(x1[:, None], x1[None]) - np.maximum(x0[:, None], x0[None])
    iy = np.minimum(y1[:, None], y1[None]) - np.maximum(y0[:, None], y0[None])
    inter = ix * iy
    area = (x1 - x0) * (y1 - y0)
    union = area[:, None] + area[None] - inter
    ok = (ix > 0) & (iy > 0) & (inter > 0) & (area[:, None] > 0) & (area[None] > 0) & (union > 0)
    iou = np.divide(inter, union, out=np.zeros_like(inter), where=ok)
    return ok & (iou > iou_limit)


# op type -> (the function, the attributes it reads with their ONNX defaults)
DATA_DEPENDENT: dict[str, tuple[Callable, dict]] = {
    "NonZero": (nonzero, {}),
    "Compress": (compress, {"axis": None}),
    "Unique": (unique, {"axis": None, "sorted": 1}),
    "NonMaxSuppression": (non_max_suppression, {"center_point_box": 0}),
}


# The operands whose values decide an op's output shape, where not all of them do: a
# Compress's shape is its condition's count of true values, whatever the data it selects.
DECIDING: dict[str, tuple[int, ...]] = {"Compress": (1,)}


def is_data_dependent(node: onnx.NodeProto) -> bool:
    return node.domain in ("", "ai.onnx") and node.op_type in DATA_DEPENDENT


def node_attributes(node: onnx.NodeProto) -> dict:
    _, defaults = DATA_DEPENDENT[node.op_type]
    attrs = dict(defaults)
    attrs.update((a.name, helper.get_attribute_value(a)) for a in node.attribute)
    return attrs


def evaluate(node: onnx.NodeProto, inputs: Sequence[Optional[np.ndarray]]) -> dict:
    """{output name: array} of `node` on concrete `inputs`, for the outputs it names."""
    function, _ = DATA_DEPENDENT[node.op_type]
    results = function(list(inputs), node_attributes(node))
    return {name: r for name, r in zip(node.output, results) if name}


def import_node(importer, node: onnx.NodeProto, desc: str) -> bool:
    """Import `node` when its operands are compile-time values: True when done here (folded
    into constants), False when its clause in the specs imports it (Compress).  Operands
    computed at run time raise DataDependentError (refused inside a Loop or If body, which
    the graph cannot be cut in)."""
    values = [importer.values.get(name) if name else None for name in node.input]
    if any(name and v is None for name, v in zip(node.input, values)):
        return False          # the generic path reports the undefined input
    known = [None if v is None else importer.constant(v) for v in values]
    deciding = DECIDING.get(node.op_type, range(len(values)))
    unknown = [i for i in deciding if i < len(values) and values[i] is not None and known[i] is None]
    if not unknown:               # its output shape is known while compiling
        if importer.registry.onnx.get(node.op_type):
            return False          # (Compress with a constant condition: a Gather)
        for name, array in evaluate(node, known).items():
            importer.values[name] = importer.function.add_constant(array, name)
        return True
    behind = sorted({name for i in unknown for name in importer.placeholders_behind(values[i])})
    first = node.input[unknown[0]]
    if importer.subgraph_depth:
        # A CompileTimeInputError: a Loop whose body needs it falls back to unrolling, where
        # the operands may be constants; an If, to deciding its condition while compiling.
        # The names behind it may be the body's own (its iteration number, the state it
        # carries), which no caller can bind: the model inputs behind those are found when
        # the Loop around it asks for its trip count (specialize.py grows the set).
        inputs = {i.name for i in importer.proto.graph.input}
        given = [n for n in behind if n in inputs]
        own = [n for n in behind if n not in inputs]
        what = (", ".join(map(repr, given)) if not own else
                f"the model inputs behind the body's {', '.join(map(repr, own))}"
                + (f" and {', '.join(map(repr, given))}" if given else ""))
        raise CompileTimeInputError(
            f"{desc} is inside a Loop, If or Scan body and its output shape depends on the "
            f"values of operands computed at run time; glowgen cuts the graph at such an op "
            f"only in the main graph, so glowgen.compile(model) compiles the model per value "
            f"of {what} instead (bound as constants: each new value compiles a variant, "
            f"glowgen.compile's max_variants of them kept). Move the op out of the body to "
            f"cut the graph there", behind, first)
    raise DataDependentError(
        f"{desc}: its output shape depends on the values of its operands, which are computed "
        f"from model input{'s' if len(behind) > 1 else ''} {', '.join(map(repr, behind))} at "
        f"run time; compile with glowgen.compile(model) without input_shapes and "
        f"constant_inputs (or with specialize=True) to cut the graph at it (the part before "
        f"runs, {node.op_type} is computed on its values, and the part after is compiled for "
        f"the shapes that come out; `glowgen run`: without --input-shape, the inputs "
        f"given with --input NAME=FILE.npy), or bind {'them' if len(behind) > 1 else 'it'} "
        f"with constant_inputs", behind, node.name or node.output[0], [o for o in node.output if o],
        first)
