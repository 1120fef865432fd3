"""Shape algebra of the spec language: reshape targets, slices, squeezes, gathers,
permutations, padding, splits, einsum.

Each function marked @helper is callable from the specs, where specs/helpers.glowdef declares
it with its parameters."""
from __future__ import annotations

import numpy as np

from ..engine.specrt import b_broadcast, b_normalize_axes, b_normalize_axis, b_prod
from ..engine.types import dtype_from_onnx
from ..errors import ShapeError
from .registry import helper


@helper
def reshape_target(shape, target, allowzero=0):
    """ONNX/NumPy reshape target resolution: 0 copies a dimension, -1 is inferred."""
    target = [int(t) for t in target]
    out = []
    for i, t in enumerate(target):
        if t == 0 and not allowzero:
            if i >= len(shape):
                raise ShapeError(f"reshape target {target}: 0 at position {i} has no input dimension")
            out.append(shape[i])
        else:
            out.append(t)
    if out.count(-1) > 1:
        raise ShapeError(f"reshape target {target} has more than one -1")
    total = b_prod(shape)
    if -1 in out:
        known = b_prod(d for d in out if d != -1)
        if known == 0 or total % known:
            raise ShapeError(f"cannot reshape {list(shape)} to {target}")
        out[out.index(-1)] = total // known
    if b_prod(out) != total:
        raise ShapeError(f"cannot reshape {list(shape)} ({total} elements) to {target}")
    return tuple(out)


@helper
def flatten_shape(shape, axis):
    axis = b_normalize_axis(axis, len(shape) + 1) if axis != len(shape) else axis
    return (b_prod(shape[:axis]), b_prod(shape[axis:]))


@helper
def squeeze_shape(shape, axes):
    if len(axes) == 0:
        return tuple(d for d in shape if d != 1)
    axes = b_normalize_axes(axes, len(shape))
    for a in axes:
        if shape[a] != 1:
            raise ShapeError(f"cannot squeeze axis {a} of shape {list(shape)}: it is not 1")
    return tuple(d for i, d in enumerate(shape) if i not in axes)


@helper
def unsqueeze_shape(shape, axes):
    rank = len(shape) + len(axes)
    axes = b_normalize_axes(axes, rank)
    it = iter(shape)
    return tuple(1 if i in axes else next(it) for i in range(rank))


@helper
def concat_shape(shapes, axis):
    first = shapes[0]
    axis = b_normalize_axis(axis, len(first))
    total = 0
    for s in shapes:
        if len(s) != len(first) or any(a != b for i, (a, b) in enumerate(zip(s, first)) if i != axis):
            raise ShapeError("concatenated shapes " + ", ".join(str(list(x)) for x in shapes)
                             + f" differ outside axis {axis}")
        total += s[axis]
    return tuple(total if i == axis else d for i, d in enumerate(first))


@helper
def slice_bounds(shape, starts, ends, axes, steps):
    """Resolve ONNX Slice parameters to per-axis (start, stop, step) on every axis."""
    rank = len(shape)
    axes = list(axes) if len(axes) else list(range(len(starts)))
    steps = list(steps) if len(steps) else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ShapeError("Slice starts, ends, axes and steps must have the same length")
    bounds = [[0, d, 1] for d in shape]
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = b_normalize_axis(a, rank)
        d = shape[a]
        if st == 0:
            raise ShapeError("Slice step must not be 0")
        s, e = int(s), int(e)
        if s < 0:
            s += d
        if e < 0:
            e += d
        if st > 0:
            s = min(max(s, 0), d)
            e = min(max(e, 0), d)
        else:
            # ONNX: a backward slice's start clamps to [0, d - 1], its end to [-1, d - 1]
            # (-1: through element 0).
            s = min(max(s, 0), d - 1)
            e = min(max(e, -1), d - 1)
        bounds[a] = [s, e, int(st)]
    return tuple(tuple(b) for b in bounds)


@helper
def slice_shape(starts, stops, steps):
    return tuple(len(range(s, e, st)) for s, e, st in zip(starts, stops, steps))


@helper
def gather_shape(data_shape, indices_shape, axis):
    axis = b_normalize_axis(axis, len(data_shape))
    return tuple(data_shape[:axis]) + tuple(indices_shape) + tuple(data_shape[axis + 1:])


@helper
def matmul_shape(a, b):
    """numpy.matmul result shape (1-D operands promoted and the unit dim dropped)."""
    if len(a) == 0 or len(b) == 0:
        raise ShapeError("MatMul operands must have rank at least 1")
    a2 = (1,) + tuple(a) if len(a) == 1 else tuple(a)
    b2 = tuple(b) + (1,) if len(b) == 1 else tuple(b)
    if a2[-1] != b2[-2]:
        raise ShapeError(f"MatMul: inner dimensions differ: {list(a)} x {list(b)}")
    batch = b_broadcast(a2[:-2], b2[:-2])
    out = batch + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


@helper
def channel_shape(rank, channels, axis=1):
    """Shape that broadcasts a per-channel vector along `axis` of a rank-`rank` tensor."""
    return tuple(channels if i == axis else 1 for i in range(axis, rank))


@helper
def onnx_dtype(code):
    return dtype_from_onnx(int(code))


@helper
def slice_part(shape, starts, ends, axes, steps, which):
    """One of starts / stops / steps (which = 0, 1, 2) of ONNX Slice, for every dimension."""
    return tuple(b[which] for b in slice_bounds(shape, starts, ends, axes, steps))


@helper
def shape_range(shape, start, end):
    """The dimensions ONNX Shape(start, end) returns."""
    r = len(shape)
    start = max(0, min(r, start + r if start < 0 else start))
    end = max(0, min(r, end + r if end < 0 else end))
    return tuple(shape[start:end])


@helper
def compose_perm(inner, outer):
    """The single permutation equal to Transpose(Transpose(x, inner), outer)."""
    return tuple(inner[p] for p in outer)


@helper
def moves_data(shape, perm):
    """Whether transposing `shape` by `perm` changes the order of the elements in memory:
    it does not when the dimensions larger than 1 keep their relative order."""
    kept = [p for p in perm if shape[p] != 1]
    return kept != sorted(kept)


@helper
def varies_only_along(shape, out_shape, axis):
    """A tensor of `shape` broadcast against `out_shape` is constant except along `axis`
    (a per-channel vector, or a scalar), and does not enlarge `out_shape`."""
    if len(shape) > len(out_shape):
        return False
    aligned = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    return all(d == 1 or (i == axis and d == out_shape[i]) for i, d in enumerate(aligned))


@helper
def pad_shape(shape, pads):
    """Shape after padding; `pads` is [begin of each dimension..., end of each dimension...]."""
    n = len(shape)
    return tuple(d + pads[i] + pads[n + i] for i, d in enumerate(shape))


@helper
def onnx_pads(pads, axes, rank):
    """ONNX Pad's `pads` input (with the optional `axes` of opset 18) for every dimension."""
    pads = [int(p) for p in pads]
    if not len(axes):
        if len(pads) != 2 * rank:
            raise ShapeError(f"Pad: {len(pads)} pads for a rank-{rank} input; expected {2 * rank}")
        return tuple(pads)
    axes = [b_normalize_axis(a, rank) for a in axes]
    if len(pads) != 2 * len(axes):
        raise ShapeError(f"Pad: {len(pads)} pads for {len(axes)} axes; expected {2 * len(axes)}")
    full = [0] * (2 * rank)
    for i, a in enumerate(axes):
        full[a], full[rank + a] = pads[i], pads[len(axes) + i]
    return tuple(full)


@helper
def split_sizes(shape, axis, split, count):
    """ONNX Split's piece sizes: `split` when given, else `count` pieces of ceil(d / count)."""
    if len(split):
        return tuple(int(v) for v in split)
    d = shape[axis]
    count = max(1, int(count))
    chunk = -(-d // count)
    return tuple([chunk] * (count - 1) + [d - chunk * (count - 1)])


@helper
def split_shapes(shape, axis, sizes):
    return tuple(tuple(n if i == axis else s for i, s in enumerate(shape)) for n in sizes)


@helper
def full_pads(rank, pads, axes):
    """ONNX Pad's pads (for `axes`, or all axes) as [begin..., end...] over every axis."""
    pads = [int(p) for p in pads]
    if not len(axes):
        return tuple(pads)
    axes = [b_normalize_axis(a, rank) for a in axes]
    n = len(axes)
    full = [0] * (2 * rank)
    for j, a in enumerate(axes):
        full[a], full[a + rank] = pads[j], pads[j + n]
    return tuple(full)


@helper
def gathernd_shape(shape, indices_shape, batch_dims):
    last = indices_shape[-1]
    return tuple(indices_shape[:-1]) + tuple(shape[batch_dims + last:])


@helper
def insert_dim(shape, axis, size):
    axis = b_normalize_axis(axis, len(shape) + 1)
    return tuple(shape[:axis]) + (int(size),) + tuple(shape[axis:])


@helper
def replace_dim(shape, axis, size):
    return tuple(int(size) if i == axis else d for i, d in enumerate(shape))


@helper
def interleave(a, b):
    """(a0, b0, a1, b1, ...)."""
    return tuple(x for pair in zip(a, b) for x in pair)


def einsum_parse(equation, shapes):
    """Operand label lists and the output label list of an einsum equation ('...' -> '.N')."""
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise ShapeError(f"einsum {equation!r} names {len(terms)} operands, got {len(shapes)}")
    ell = 0
    labels = []
    for t, s in zip(terms, shapes):
        if "..." in t:
            n = len(s) - (len(t) - 3)
            ell = max(ell, n)
            head, _, tail = t.partition("...")
            labels.append(list(head) + [f".{k + (ell - n)}" for k in range(n)] + list(tail))
        else:
            labels.append(list(t))
        if len(labels[-1]) != len(s):
            raise ShapeError(f"einsum term {t!r} does not match an operand of rank {len(s)}")
    if arrow:
        head, dots, tail = out.partition("...")
        out_labels = list(head) + ([f".{k}" for k in range(ell)] if dots else []) + list(tail)
    else:
        counts = {}
        for ls in labels:
            for l in ls:
                counts[l] = counts.get(l, 0) + 1
        out_labels = [f".{k}" for k in range(ell)] + sorted(l for l, c in counts.items()
                                                            if c == 1 and not l.startswith("."))
    return labels, out_labels


@helper
def einsum_shape(equation, shapes):
    labels, out = einsum_parse(equation, shapes)
    sizes = {}
    for ls, s in zip(labels, shapes):
        for l, d in zip(ls, s):
            if sizes.get(l, 1) != 1 and d != 1 and sizes[l] != d:
                raise ShapeError(f"einsum {equation!r}: label {l!r} has sizes {sizes[l]} and {d}")
            if d != 1 or l not in sizes:
                sizes[l] = d
    return tuple(sizes[l] for l in out)


@helper
def axis_broadcastable(shape, rhs_shape, axis):
    """ONNX's legacy broadcast: rhs lines up with shape[axis:], each dimension equal or 1."""
    return all(d == 1 or d == shape[axis + i] for i, d in enumerate(rhs_shape))


@helper
def true_positions(condition):
    """Positions of the true entries of a 1-D condition."""
    import numpy as np
    cond = np.asarray(condition)
    if cond.ndim != 1:
        raise ShapeError(f"the condition must be 1-D, got shape {list(cond.shape)}")
    return tuple(int(i) for i in np.flatnonzero(cond))


@helper
def compress_shape(shape, count, axis, flatten):
    if flatten:
        return (count,)
    return tuple(count if i == axis else d for i, d in enumerate(shape))


# ------------------------------------------------------------------ constant indices
# An index known at compile time that falls outside its dimension is an error in the model,
# reported at compile time as onnxruntime does (a run-time index is clamped by gathers and
# skipped by scatters in native code instead: backends/cpu/kernels_more.py).
def _first_out_of_range(idx: np.ndarray, size: int):
    bad = np.argwhere((idx < -size) | (idx >= size))
    return tuple(int(i) for i in bad[0]) if bad.size else None


@helper
def indices_in_range(known, size):
    """True, or a ShapeError naming the first constant index outside [-size, size - 1]
    (`known`: the indices' compile-time value, None when they are computed at run time)."""
    if known is None:
        return True
    idx = np.asarray(known)
    at = _first_out_of_range(idx, int(size))
    if at is not None:
        raise ShapeError(f"constant index {int(idx[at])} (at {list(at)} of the indices) is out of "
                         f"range for a dimension of size {size}: indices must lie in "
                         f"[{-size}, {size - 1}]")
    return True


@helper
def index_tuples_in_range(known, shape, batch_dims):
    """As indices_in_range, for GatherND / ScatterND: entry j of each index tuple (the last
    dimension of the indices) addresses dimension batch_dims + j of `shape`."""
    if known is None:
        return True
    idx = np.asarray(known)
    if idx.ndim == 0 or idx.shape[-1] > len(shape) - batch_dims:
        return True               # the op's declaration reports a malformed index tuple
    for j in range(idx.shape[-1]):
        size = int(shape[batch_dims + j])
        at = _first_out_of_range(idx[..., j], size)
        if at is not None:
            raise ShapeError(f"constant index {int(idx[..., j][at])} (entry {j} of the index "
                             f"tuple at {list(at)}) is out of range for dimension "
                             f"{batch_dims + j} of size {size}: it must lie in [{-size}, {size - 1}]")
    return True
