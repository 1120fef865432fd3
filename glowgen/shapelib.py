"""The shape-function library of the spec language.

Formulas in specs/ops.glowdef call these by name (`reshape_target(...)`, `auto_pads(...)`):
shape algebra that is too loopy for the expression language.  They are plain functions of
shapes and lists; the emitters look names up here after the generic builtins of
`engine/specrt.py`.
"""
from __future__ import annotations

import numpy as np

from .engine.specrt import b_broadcast, b_broadcastable, b_normalize_axes, b_normalize_axis, b_prod
from .engine.types import dtype_from_onnx
from .errors import ShapeError

def b_reshape_target(shape, target, allowzero=0):
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


def b_flatten_shape(shape, axis):
    axis = b_normalize_axis(axis, len(shape) + 1) if axis != len(shape) else axis
    return (b_prod(shape[:axis]), b_prod(shape[axis:]))


def b_squeeze_shape(shape, axes):
    if len(axes) == 0:
        return tuple(d for d in shape if d != 1)
    axes = b_normalize_axes(axes, len(shape))
    for a in axes:
        if shape[a] != 1:
            raise ShapeError(f"cannot squeeze axis {a} of shape {list(shape)}: it is not 1")
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def b_unsqueeze_shape(shape, axes):
    rank = len(shape) + len(axes)
    axes = b_normalize_axes(axes, rank)
    it = iter(shape)
    return tuple(1 if i in axes else next(it) for i in range(rank))


def b_concat_shape(shapes, axis):
    first = shapes[0]
    axis = b_normalize_axis(axis, len(first))
    total = 0
    for s in shapes:
        if len(s) != len(first) or any(a != b for i, (a, b) in enumerate(zip(s, first)) if i != axis):
            raise ShapeError("concatenated shapes " + ", ".join(str(list(x)) for x in shapes)
                             + f" differ outside axis {axis}")
        total += s[axis]
    return tuple(total if i == axis else d for i, d in enumerate(first))


def b_slice_bounds(shape, starts, ends, axes, steps):
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


def b_slice_shape(starts, stops, steps):
    return tuple(len(range(s, e, st)) for s, e, st in zip(starts, stops, steps))


def b_gather_shape(data_shape, indices_shape, axis):
    axis = b_normalize_axis(axis, len(data_shape))
    return tuple(data_shape[:axis]) + tuple(indices_shape) + tuple(data_shape[axis + 1:])


def b_auto_pads(mode, spatial, kernel, strides, dilations, pads):
    """Resolve ONNX auto_pad to explicit [begin..., end...] pads."""
    mode = mode.decode() if isinstance(mode, bytes) else (mode or "NOTSET")
    n = len(spatial)
    if mode in ("NOTSET", ""):
        return tuple(pads) if len(pads) else (0,) * (2 * n)
    if mode == "VALID":
        return (0,) * (2 * n)
    if mode not in ("SAME_UPPER", "SAME_LOWER"):
        raise ShapeError(f"auto_pad {mode!r} is not one of NOTSET, VALID, SAME_UPPER, SAME_LOWER")
    begin, end = [], []
    for i in range(n):
        out = -(-spatial[i] // strides[i])
        total = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - spatial[i])
        small, big = total // 2, total - total // 2
        begin.append(small if mode == "SAME_UPPER" else big)
        end.append(big if mode == "SAME_UPPER" else small)
    return tuple(begin + end)


def b_matmul_shape(a, b):
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


def b_channel_shape(rank, channels, axis=1):
    """Shape that broadcasts a per-channel vector along `axis` of a rank-`rank` tensor."""
    return tuple(channels if i == axis else 1 for i in range(axis, rank))


def b_onnx_dtype(code):
    return dtype_from_onnx(int(code))


def b_slice_part(shape, starts, ends, axes, steps, which):
    """One of starts / stops / steps (which = 0, 1, 2) of ONNX Slice, for every dimension."""
    return tuple(b[which] for b in b_slice_bounds(shape, starts, ends, axes, steps))


def b_shape_range(shape, start, end):
    """The dimensions ONNX Shape(start, end) returns."""
    r = len(shape)
    start = max(0, min(r, start + r if start < 0 else start))
    end = max(0, min(r, end + r if end < 0 else end))
    return tuple(shape[start:end])


def b_compose_perm(inner, outer):
    """The single permutation equal to Transpose(Transpose(x, inner), outer)."""
    return tuple(inner[p] for p in outer)


def b_moves_data(shape, perm):
    """Whether transposing `shape` by `perm` changes the order of the elements in memory:
    it does not when the dimensions larger than 1 keep their relative order."""
    kept = [p for p in perm if shape[p] != 1]
    return kept != sorted(kept)


def b_varies_only_along(shape, out_shape, axis):
    """A tensor of `shape` broadcast against `out_shape` is constant except along `axis`
    (a per-channel vector, or a scalar), and does not enlarge `out_shape`."""
    if len(shape) > len(out_shape):
        return False
    aligned = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    return all(d == 1 or (i == axis and d == out_shape[i]) for i, d in enumerate(aligned))


def b_pad_shape(shape, pads):
    """Shape after padding; `pads` is [begin of each dimension..., end of each dimension...]."""
    n = len(shape)
    return tuple(d + pads[i] + pads[n + i] for i, d in enumerate(shape))


def b_outer_pads(pads, count):
    """The pads of the first `count` dimensions, [begins..., ends...]."""
    n = len(pads) // 2
    return tuple(pads[:count]) + tuple(pads[n:n + count])


def b_spatial_pads(pads, count=2):
    """The pads of the dimensions after the first `count`, as [begins..., ends...] (the
    layout of Conv and pooling pads when count is 2: N and C are not spatial)."""
    n = len(pads) // 2
    return tuple(pads[count:n]) + tuple(pads[n + count:])


def b_onnx_pads(pads, axes, rank):
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


# ----------------------------------------------------------------------------- conformance (issue 6)
def b_split_sizes(shape, axis, split, count):
    """ONNX Split's piece sizes: `split` when given, else `count` pieces of ceil(d / count)."""
    if len(split):
        return tuple(int(v) for v in split)
    d = shape[axis]
    count = max(1, int(count))
    chunk = -(-d // count)
    return tuple([chunk] * (count - 1) + [d - chunk * (count - 1)])


def b_split_shapes(shape, axis, sizes):
    return tuple(tuple(n if i == axis else s for i, s in enumerate(shape)) for n in sizes)


def b_full_pads(rank, pads, axes):
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


def b_gathernd_shape(shape, indices_shape, batch_dims):
    last = indices_shape[-1]
    return tuple(indices_shape[:-1]) + tuple(shape[batch_dims + last:])


def b_insert_dim(shape, axis, size):
    axis = b_normalize_axis(axis, len(shape) + 1)
    return tuple(shape[:axis]) + (int(size),) + tuple(shape[axis:])


def b_replace_dim(shape, axis, size):
    return tuple(int(size) if i == axis else d for i, d in enumerate(shape))


def b_interleave(a, b):
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


def b_einsum_shape(equation, shapes):
    labels, out = einsum_parse(equation, shapes)
    sizes = {}
    for ls, s in zip(labels, shapes):
        for l, d in zip(ls, s):
            if sizes.get(l, 1) != 1 and d != 1 and sizes[l] != d:
                raise ShapeError(f"einsum {equation!r}: label {l!r} has sizes {sizes[l]} and {d}")
            if d != 1 or l not in sizes:
                sizes[l] = d
    return tuple(sizes[l] for l in out)


def b_conv_shape(spatial, kernel, pads, strides, dilations, ceil_mode=0):
    n = len(spatial)
    out = []
    for i in range(n):
        span = spatial[i] + pads[i] + pads[i + n] - dilations[i] * (kernel[i] - 1) - 1
        o = (span + (strides[i] - 1 if ceil_mode else 0)) // strides[i] + 1
        if ceil_mode and (o - 1) * strides[i] >= spatial[i] + pads[i]:
            o -= 1
        out.append(o)
    if any(o <= 0 for o in out):
        raise ShapeError(f"the kernel {list(kernel)} does not fit in the padded input {list(spatial)}")
    return tuple(out)


def b_pool_shape(spatial, kernel, pads, strides, dilations, ceil_mode):
    return b_conv_shape(spatial, kernel, pads, strides, dilations, ceil_mode)


def b_convtranspose_shape(spatial, kernel, pads, strides, dilations, output_padding):
    n = len(spatial)
    return tuple((spatial[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1
                 + output_padding[i] - pads[i] - pads[i + n] for i in range(n))


def b_convtranspose_pads(mode, spatial, kernel, strides, dilations, output_padding, pads, output_shape):
    """ConvTranspose pads from explicit pads, auto_pad or output_shape (ONNX's rules)."""
    mode = mode.decode() if isinstance(mode, bytes) else (mode or "NOTSET")
    n = len(spatial)
    if len(output_shape) or mode in ("SAME_UPPER", "SAME_LOWER"):
        target = list(output_shape)[-n:] if len(output_shape) else [spatial[i] * strides[i] for i in range(n)]
        begin, end = [], []
        for i in range(n):
            total = (strides[i] * (spatial[i] - 1) + output_padding[i]
                     + ((kernel[i] - 1) * dilations[i] + 1) - target[i])
            if mode == "SAME_UPPER":
                begin.append(total // 2)
                end.append(total - total // 2)
            else:
                begin.append(total - total // 2)
                end.append(total // 2)
        return tuple(begin + end)
    if mode == "VALID":
        return (0,) * (2 * n)
    return tuple(int(p) for p in pads) if len(pads) else (0,) * (2 * n)


def b_window_pads(spatial, kernel, pads, strides, dilations, ceil_mode):
    """Pads [begin..., end...] under which a convolution has the pooling's output size: with
    ceil_mode the last window may hang over the end, which then gets the missing zeros."""
    n = len(spatial)
    out = b_pool_shape(spatial, kernel, pads, strides, dilations, ceil_mode)
    end = list(pads[n:])
    for i in range(n):
        needed = (out[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1
        end[i] += max(0, needed - (spatial[i] + pads[i] + pads[n + i]))
    return tuple(pads[:n]) + tuple(end)


def b_window_counts(spatial, kernel, pads, strides, dilations, ceil_mode, count_include_pad):
    """How many taps of each pooling window fall on the input (or, with count_include_pad,
    on the input or its explicit pads): the divisor of an average pool, [1, 1, *out]."""
    n = len(spatial)
    out = b_pool_shape(spatial, kernel, pads, strides, dilations, ceil_mode)
    per_axis = []
    for i in range(n):
        lo, hi = (-pads[i], spatial[i] + pads[n + i]) if count_include_pad else (0, spatial[i])
        counts = []
        for o in range(out[i]):
            taps = (o * strides[i] - pads[i] + k * dilations[i] for k in range(kernel[i]))
            counts.append(sum(1 for t in taps if lo <= t < hi))
        per_axis.append(counts)
    total = np.ones(())
    for counts in per_axis:
        total = np.multiply.outer(total, counts)
    return total.reshape((1, 1) + tuple(out)).tolist()


def b_col2im_weights(channels, block):
    """ConvTranspose weights [channels * K, 1, *block] (K = prod(block)) that put column
    entry j of each channel at offset j of its block: a one-hot filter per entry."""
    k = b_prod(block)
    eye = np.eye(k).reshape((k, 1) + tuple(block))
    return np.tile(eye, (channels, 1) + (1,) * len(block)).tolist()


def b_col2im_output_padding(image, blocks, block, pads, strides, dilations):
    """What a transposed convolution of `blocks` positions adds at the end to reach `image`."""
    n = len(image)
    return tuple(image[i] - (strides[i] * (blocks[i] - 1) + dilations[i] * (block[i] - 1) + 1
                             - pads[i] - pads[n + i]) for i in range(n))


def b_axis_broadcastable(shape, rhs_shape, axis):
    """ONNX's legacy broadcast: rhs lines up with shape[axis:], each dimension equal or 1."""
    return all(d == 1 or d == shape[axis + i] for i, d in enumerate(rhs_shape))


# ----------------------------------------------------------------------------- recurrent networks
def b_rnn_sequence_shape(x_shape, layout, directions, hidden):
    """Y of LSTM/GRU/RNN: [S, D, B, H], or [B, S, D, H] with layout 1."""
    seq, batch = (x_shape[0], x_shape[1]) if layout == 0 else (x_shape[1], x_shape[0])
    return (seq, directions, batch, hidden) if layout == 0 else (batch, seq, directions, hidden)


def b_rnn_state_shape(x_shape, layout, directions, hidden):
    """Y_h / Y_c of LSTM/GRU/RNN: [D, B, H], or [B, D, H] with layout 1."""
    batch = x_shape[1] if layout == 0 else x_shape[0]
    return (directions, batch, hidden) if layout == 0 else (batch, directions, hidden)


def b_rnn_activations():
    """The activations of recurrent layers the lowering can build (ONNX names)."""
    return ("Sigmoid", "Tanh", "Relu", "LeakyRelu", "HardSigmoid", "Elu", "Softplus", "ThresholdedRelu")


def b_all_in(values, allowed):
    return all(v in tuple(allowed) for v in values)


def b_rnn_step_masked(seq_lens, t):
    """Whether step t lies beyond some batch entry's sequence length."""
    return any(t >= int(n) for n in seq_lens)


def b_rnn_step_mask(seq_lens, t):
    """[B, 1] booleans: which batch entries step t is within (their sequence length)."""
    return tuple((t < int(n),) for n in seq_lens)


# Interpolation weights (Resize) live in their own module; the spec language sees them here.
from . import interpolation  # noqa: E402
from .interpolation import *  # noqa: E402,F401,F403


# ----------------------------------------------------------------------------- quantization
def b_quant_param_shape(shape, param_shape, axis, block_size):
    """The shape a quantization scale or zero point takes to broadcast against a tensor of
    `shape` (ONNX QuantizeLinear / DequantizeLinear): one value -> a scalar; a vector -> one
    value per index of `axis`; with `block_size` > 0, the parameter has the tensor's rank
    and ceil(shape[axis] / block_size) entries along `axis`, each repeated block_size times."""
    shape, param_shape = tuple(shape), tuple(param_shape)
    if b_prod(param_shape) == 1 and len(param_shape) <= 1:
        return ()
    if block_size == 0:
        if len(param_shape) != 1 or axis >= len(shape) or param_shape[0] != shape[axis]:
            raise ShapeError(f"a per-axis scale or zero point must be a vector of the {shape[axis] if axis < len(shape) else '?'} "
                             f"indices of axis {axis} of {list(shape)}, got shape {list(param_shape)}")
        return b_channel_shape(len(shape), param_shape[0], axis)
    blocks = -(-shape[axis] // block_size)
    expected = shape[:axis] + (blocks,) + shape[axis + 1:]
    if param_shape != expected:
        raise ShapeError(f"a blocked scale or zero point for {list(shape)} with block_size {block_size} "
                         f"along axis {axis} must have shape {list(expected)}, got {list(param_shape)}")
    return shape


def b_quant_param_fits(shape, param_shape, axis, block_size):
    try:
        b_quant_param_shape(shape, param_shape, axis, block_size)
        return True
    except ShapeError:
        return False


def b_block_indices(size, block_size):
    """Index of the block each of `size` positions belongs to: [0]*block_size + [1]*block_size..."""
    return tuple(i // block_size for i in range(size))


def b_float_promote(a, b):
    """The float type NumPy computes a / b in (an integer operand takes the other's type)."""
    order = ("bf16", "f16", "f32", "f64")
    floats = [d for d in (a, b) if d in order]
    if not floats:
        return "f64"
    if set(floats) == {"bf16", "f16"}:
        return "f32"            # neither holds the other
    return max(floats, key=order.index)


def b_exact_float(dtype):
    """A float type wide enough to hold every value of `dtype` (an integer of up to 16 bits
    or a float) and the sums of a few of them exactly: f32, or f64 for f64 and wide integers."""
    return "f64" if dtype in ("f64", "i32", "u32", "i64", "u64") else "f32"


def b_param_along(param_shape, size, axis, rank):
    """The shape a scale or zero point takes to broadcast against a rank-`rank` tensor: one
    value -> a scalar; a vector of `size` values -> along dimension `axis`; a tensor of the
    full rank (MatMulInteger's [D1, D2, M, 1] form) stays as it is."""
    param_shape = tuple(param_shape)
    if b_prod(param_shape) == 1 and len(param_shape) <= 1:
        return ()
    if param_shape == (size,):
        return b_channel_shape(rank, size, axis)
    if len(param_shape) == rank and b_broadcastable(param_shape, b_channel_shape(rank, size, axis)):
        return param_shape
    raise ShapeError(f"a scale or zero point must hold one value or one per index ({size}) of "
                     f"dimension {axis}, got shape {list(param_shape)}")


def b_param_fits(param_shape, size, axis, rank):
    """`param_shape` (None for an absent optional parameter) fits `param_along`."""
    if param_shape is None:
        return True
    try:
        b_param_along(param_shape, size, axis, rank)
        return True
    except ShapeError:
        return False


# ----------------------------------------------------------------------------- DFT
def b_dft_length(shape, axis, given, inverse, onesided):
    """ONNX DFT's transform length: dft_length when given (> 0), else the axis' size (or,
    for an inverse one-sided transform, the full signal length 2 * (size - 1))."""
    if given > 0:
        return int(given)
    if inverse and onesided:
        return 2 * (shape[axis] - 1)
    return shape[axis]


def b_dft_bins(length, inverse, onesided):
    """How many values the transform produces along its axis."""
    return length // 2 + 1 if onesided and not inverse else length


def b_dft_shape(shape, axis, length, inverse, onesided):
    """The result shape of DFT: `axis` holds the bins, the last dimension is 2 (real and
    imaginary parts), or 1 for an inverse one-sided (real-valued) transform."""
    out = list(shape)
    out[axis] = b_dft_bins(length, inverse, onesided)
    out[-1] = 1 if inverse and onesided else 2
    return tuple(out)


def b_dft_perm(rank, axis):
    """A permutation that moves `axis` just before the last (real/imaginary) dimension."""
    return tuple(d for d in range(rank - 1) if d != axis) + (axis, rank - 1)


def b_dft_matrix(size, parts, length, inverse, onesided):
    """The DFT along one axis as a real matrix: row (n, c) is what input element n, real
    (c = 0) or imaginary (c = 1) part, contributes to each output (bin, part).  Built by
    transforming unit inputs with NumPy's FFT, which defines the semantics (zero padding or
    truncation to `length`, 1/length scaling of the inverse, Hermitian one-sided inverse)."""
    import numpy as np
    rows = []
    for n in range(size):
        for c in range(parts):
            unit = np.zeros(size, np.complex128)
            unit[n] = 1j if c else 1.0
            if inverse and onesided:
                out = np.fft.irfft(unit, n=length)[:, None]
            else:
                full = np.fft.ifft(unit, n=length) if inverse else np.fft.fft(unit, n=length)
                full = full[:b_dft_bins(length, inverse, onesided)]
                out = np.stack([full.real, full.imag], axis=-1)
            rows.append(tuple(float(v) for v in out.reshape(-1)))
    return tuple(rows)



def b_frame_indices(length, frame, step):
    """Sample positions of the frames of a signal of `length` samples: one row of `frame`
    positions every `step` samples, as many whole frames as fit."""
    count = 1 + (length - frame) // step
    return tuple(tuple(f * step + i for i in range(frame)) for f in range(count))


# ----------------------------------------------------------------------------- Compress
def b_true_positions(condition):
    """Positions of the true entries of a 1-D condition."""
    import numpy as np
    cond = np.asarray(condition)
    if cond.ndim != 1:
        raise ShapeError(f"the condition must be 1-D, got shape {list(cond.shape)}")
    return tuple(int(i) for i in np.flatnonzero(cond))


def b_compress_shape(shape, count, axis, flatten):
    if flatten:
        return (count,)
    return tuple(count if i == axis else d for i, d in enumerate(shape))


FUNCTIONS = {name[2:]: fn for name, fn in dict(globals()).items()
             if name.startswith("b_") and callable(fn)
             and fn.__module__ in (__name__, interpolation.__name__)}
