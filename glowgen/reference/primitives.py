"""NumPy implementations of the non-elementwise primitives (the `extern` list of
`specs/cpu_kernels.glowdef`).  Simple over fast: this is the reference backend."""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..engine.types import numpy_dtype
from ..speclib.shapes import einsum_parse, shape_range


def _einsum(eq, *xs):
    """numpy.einsum, with bfloat16 operands widened to f32 (NumPy's einsum has no bfloat16
    loop); run_node rounds the result back to the declared type."""
    return np.einsum(eq, *[x.astype(np.float32) if x.dtype.name == "bfloat16" else x for x in xs])


def _windows(xp: np.ndarray, kernel, strides, dilations, out_hw):
    """[N, C, OH, OW, KH, KW] view of windows of the padded input."""
    kh, kw = kernel
    dh, dw = dilations
    eff = ((kh - 1) * dh + 1, (kw - 1) * dw + 1)
    win = sliding_window_view(xp, eff, axis=(2, 3))
    win = win[:, :, ::strides[0], ::strides[1], ::dh, ::dw]
    return win[:, :, :out_hw[0], :out_hw[1]]


def _pad_for(x, pads, kernel, strides, dilations, out_hw, value):
    """Pad H and W by `pads` plus whatever a ceil-mode last window needs."""
    h, w = x.shape[2:]
    extra = []
    for i, (size, k, s, d) in enumerate(zip((h, w), kernel, strides, dilations)):
        need = (out_hw[i] - 1) * s + (k - 1) * d + 1
        have = size + pads[i] + pads[i + 2]
        extra.append(max(0, need - have))
    widths = ((0, 0), (0, 0), (pads[0], pads[2] + extra[0]), (pads[1], pads[3] + extra[1]))
    return np.pad(x, widths, constant_values=value)


def _exact_matmul(a, b):
    """A float32 product accumulated in float64 and rounded once. BLAS sums a float32 dot
    product in an order that depends on the instruction set it picked and on the row's place
    in its register blocks, so two output channels with the same weights may differ in the
    last bit; the reference rounds once, so equal channels stay equal (light_squeezenet's
    logits are 9.5e9, where one ulp decides a softmax tie)."""
    if a.dtype == np.float32 and b.dtype == np.float32:
        return np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.float32)
    return np.matmul(a, b)


def conv(node, x, w, b=None):
    n, c, _, _ = x.shape
    m, cg, kh, kw = w.shape
    out = node.outputs[0].type.shape
    oh, ow = out[2], out[3]
    g = node.group
    xp = _pad_for(x, node.pads, (kh, kw), node.strides, node.dilations, (oh, ow), 0)
    win = _windows(xp, (kh, kw), node.strides, node.dilations, (oh, ow))   # N C OH OW KH KW
    win = win.reshape(n, g, cg, oh, ow, kh, kw)
    cols = win.transpose(1, 0, 3, 4, 2, 5, 6).reshape(g, n * oh * ow, cg * kh * kw)
    wg = w.reshape(g, m // g, cg * kh * kw).transpose(0, 2, 1)            # G K MG
    y = _exact_matmul(cols, wg)                                             # G (N OH OW) MG
    y = y.reshape(g, n, oh, ow, m // g).transpose(1, 0, 4, 2, 3).reshape(n, m, oh, ow)
    if b is not None:
        y = y + b.reshape(1, m, 1, 1)
    return y


def requantize_multipliers(x_scale, w_scale, scale, dtype="i8") -> np.ndarray:
    """The multipliers x_scale * w_scale[m] / scale of an integer product's requantization
    (computed in f64; rounded once to f32 for i8 results, kept in f64 for i16 ones, whose
    65536 steps an f32 product of large sums would not always round right)."""
    mult = np.float64(x_scale) * np.asarray(w_scale, np.float64) / np.float64(scale)
    return mult if dtype == "i16" else mult.astype(np.float32)


def requantize(acc, mult, offset, dtype="i8", bounds=None, residual=None) -> np.ndarray:
    """Integer sums to `dtype` as the cpu kernels compute it: the sums in mult's float type
    (f32 for i8, f64 for i16: see requantize_multipliers) times mult, rounded halves to even,
    plus `offset`, saturated to `bounds` (low, high: default the type's range; max with low,
    then min with high) (`mult` broadcasts against `acc`).  `residual`, when given, is
    (r, r_offset, ratio) of a QuantizedConv's residual, whose value joins the scaled sums
    before the rounding (join_residual)."""
    ft = np.asarray(mult).dtype.type
    info = np.iinfo(numpy_dtype(dtype))
    low, high = bounds if bounds is not None else (info.min, info.max)
    with np.errstate(over="ignore"):
        if residual is None:
            v = np.asarray(acc).astype(ft) * mult
        else:
            v = join_residual(np.asarray(acc).astype(ft), mult, *residual)
        v = np.round(v)
    return np.minimum(np.maximum(v + ft(offset), low), high).astype(info.dtype)


def residual_ratio(node, dtype="i8"):
    """r_scale / scale of a QuantizedConv with a residual, in its multipliers' float type
    (requantize_multipliers)."""
    ratio = np.float64(node.r_scale) / np.float64(node.scale)
    return ratio if dtype == "i16" else np.float32(ratio)


def residual_constant(r_offset: int, ratio) -> np.float32:
    """-r_offset * ratio rounded to f32: what an i8 product's residual adds to its scaled sums
    besides r * ratio (join_residual)."""
    return np.float32(-r_offset) * np.float32(ratio)


def join_residual(sums, mult, r, r_offset: int, ratio):
    """The scaled sums (in mult's float type) with a QuantizedConv's residual r joined, before
    the rounding.  For i8 (f32) two fused multiply-adds, each rounded once, as the kernels'
    vfmadd: fma(r, ratio, fma(sums, mult, residual_constant)); for i16 (f64, the plain loops)
    sums * mult + (r - r_offset) * ratio, each step rounded."""
    if np.asarray(mult).dtype == np.float64:
        return sums * mult + (np.asarray(r).astype(np.float64) - r_offset) * np.float64(ratio)
    scaled = fma32(sums, mult, residual_constant(r_offset, ratio))
    return fma32(np.asarray(r).astype(np.float32), np.float32(ratio), scaled)


def fma32(a, b, c) -> np.ndarray:
    """a * b + c of f32 values (arrays that broadcast), rounded once to f32, as a fused
    multiply-add computes it: the product is exact in f64 (24 + 24 bits), the sum rounded to
    odd there (TwoSum's error says whether it was exact), then to nearest in f32, which
    gives the sum rounded once (Boldo and Melquiond: rounding to odd at 53 bits, then to
    nearest at 24 <= 53 - 2)."""
    a, b, c = np.broadcast_arrays(*(np.asarray(v, np.float32) for v in (a, b, c)))
    p = a.astype(np.float64) * b.astype(np.float64)
    c = c.astype(np.float64)
    s = p + c
    back = s - p
    error = (p - (s - back)) + (c - back)           # p + c == s + error, exactly
    even = (np.ascontiguousarray(s).view(np.uint64) & 1) == 0
    odd = np.nextafter(s, np.where(error > 0, np.inf, -np.inf))
    return np.where((error != 0) & even, odd, s).astype(np.float32)


def saturation(node, dtype="i8") -> tuple[int, int]:
    """The bounds (low, high) an integer product's result saturates to: its `low` and `high`
    attributes (a ReLU's or a folded Rescale's bounds) within the range of `dtype`, low at
    most high: a max with low then a min with high, as the Max and Min they replace, which
    then saturates in either order (the kernels keep the order of the type's saturation
    that LLVM turns into one saturating pack)."""
    info = np.iinfo(numpy_dtype(dtype))
    high = int(max(min(node.high, info.max), info.min))
    return int(min(max(node.low, info.min), high)), high


def quantized_conv(node, x, w, ws, b, r=None):
    """(x - x_offset) conv w + b summed exactly (padding is real zero), then requantized
    (with the residual r - r_offset, where there is one)."""
    q = node.inputs[0].type.quant
    dtype = node.outputs[0].type.dtype
    m = w.shape[0]
    shifted = x.astype(np.int64) - q.offset
    acc = conv(node, shifted, w.astype(np.int64), b.astype(np.int64))
    mult = requantize_multipliers(q.scale, ws, node.scale, dtype).reshape(1, m, 1, 1)
    residual = None if r is None else (r, node.r_offset, residual_ratio(node, dtype))
    return requantize(acc, mult, node.offset, dtype, saturation(node, dtype), residual)


def quantized_matmul(node, x, w, ws, b):
    q = node.inputs[0].type.quant
    dtype = node.outputs[0].type.dtype
    acc = np.matmul(x.astype(np.int64) - q.offset, w.astype(np.int64)) + b.astype(np.int64)
    return requantize(acc, requantize_multipliers(q.scale, ws, node.scale, dtype), node.offset, dtype,
                      saturation(node, dtype))


def _lowest(dtype):
    return -np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).min


def max_pool(node, x):
    out = node.outputs[0].type.shape
    xp = _pad_for(x, node.pads, node.kernel, node.strides, node.dilations, out[2:], _lowest(x.dtype))
    return _windows(xp, node.kernel, node.strides, node.dilations, out[2:]).max(axis=(4, 5))


def avg_pool(node, x):
    out = node.outputs[0].type.shape
    ones = (1, 1)
    xp = _pad_for(x, node.pads, node.kernel, node.strides, ones, out[2:], 0)
    sums = _windows(xp, node.kernel, node.strides, ones, out[2:]).sum(axis=(4, 5))
    # The divisor counts the window's elements inside the input (and inside the explicit
    # pads when count_include_pad), never the ceil-mode overhang.
    h, w = x.shape[2:]
    if node.count_include_pad:
        p = node.pads
        inside = np.zeros((1, 1, h + p[0] + p[2], w + p[1] + p[3]), x.dtype)
        inside[...] = 1
        ind = _pad_for(inside, (0, 0, 0, 0), node.kernel, node.strides, ones, out[2:], 0)
    else:
        ind = _pad_for(np.ones((1, 1, h, w), x.dtype), node.pads, node.kernel, node.strides, ones,
                       out[2:], 0)
    counts = _windows(ind, node.kernel, node.strides, ones, out[2:]).sum(axis=(4, 5))
    return sums / np.maximum(counts, 1)


def _axes(node, x):
    return tuple(node.axes) if len(node.axes) else tuple(range(x.ndim))


def reduce_with(fn):
    def run(node, x):
        if x.size == 0 and fn in (np.max, np.min):
            # The empty maximum is the lowest value (ONNX: -inf), the empty minimum the highest.
            lo = _lowest(x.dtype)
            hi = np.inf if np.issubdtype(x.dtype, np.floating) else np.iinfo(x.dtype).max
            return fn(x, axis=_axes(node, x), keepdims=bool(node.keepdims),
                      initial=lo if fn is np.max else hi)
        return fn(x, axis=_axes(node, x), keepdims=bool(node.keepdims))
    return run


def slice_(node, x):
    index = []
    for s, e, st in zip(node.starts, node.stops, node.steps):
        # A negative step's stop of -1 means "through index 0", which Python spells None.
        index.append(slice(s, None if (st < 0 and e < 0) else e, st))
    return x[tuple(index)]


def gather(node, x, indices):
    dim = x.shape[node.axis]
    idx = np.where(indices < 0, indices + dim, indices)
    return np.take(x, idx, axis=node.axis)




def range_(node):
    count = node.outputs[0].type.shape[0]
    dtype = node.outputs[0].type.np_dtype
    return (np.asarray(node.start, dtype) + np.arange(count, dtype=dtype) * np.asarray(node.delta, dtype)).astype(dtype)


# ----------------------------------------------------------------------------- conformance (issue 6)
def _windows_nd(xp, kernel, strides, dilations, out):
    """[N, C, *out, *kernel] view of the windows of a padded N-D input."""
    n = len(kernel)
    eff = tuple((k - 1) * d + 1 for k, d in zip(kernel, dilations))
    axes = tuple(range(2, 2 + n))
    win = sliding_window_view(xp, eff, axis=axes)
    index = (slice(None), slice(None)) + tuple(slice(0, o * s, s) for o, s in zip(out, strides)) \
        + tuple(slice(None, None, d) for d in dilations)
    return win[index]


def _pad_nd(x, pads, kernel, strides, dilations, out, value):
    n = len(kernel)
    widths = [(0, 0), (0, 0)]
    for i in range(n):
        need = (out[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1
        have = x.shape[2 + i] + pads[i] + pads[i + n]
        widths.append((pads[i], pads[i + n] + max(0, need - have)))
    return np.pad(x, widths, constant_values=value)


def conv_nd(node, x, w, b=None):
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    kernel = w.shape[2:]
    out = node.outputs[0].type.shape[2:]
    g = node.group
    nd = len(kernel)
    xp = _pad_nd(x, node.pads, kernel, node.strides, node.dilations, out, 0)
    win = _windows_nd(xp, kernel, node.strides, node.dilations, out)   # N C *out *K
    win = win.reshape((n, g, cg) + tuple(out) + tuple(kernel))
    wg = w.reshape((g, m // g, cg) + tuple(kernel))
    letters = "abcdefghij"
    o, k = letters[:nd], letters[nd:2 * nd]
    y = _einsum(f"NGC{o}{k},GMC{k}->NGM{o}", win, wg).reshape((n, m) + tuple(out))
    if b is not None:
        y = y + b.reshape((1, m) + (1,) * nd)
    return y


def max_pool_nd(node, x):
    out = node.outputs[0].type.shape[2:]
    xp = _pad_nd(x, node.pads, node.kernel, node.strides, node.dilations, out, _lowest(x.dtype))
    win = _windows_nd(xp, node.kernel, node.strides, node.dilations, out)
    return win.max(axis=tuple(range(-len(out), 0)))


def avg_pool_nd(node, x):
    out = node.outputs[0].type.shape[2:]
    nd = len(out)
    ones = (1,) * nd
    red = tuple(range(-nd, 0))
    xp = _pad_nd(x, node.pads, node.kernel, node.strides, ones, out, 0)
    sums = _windows_nd(xp, node.kernel, node.strides, ones, out).sum(axis=red)
    spatial = x.shape[2:]
    if node.count_include_pad:
        p = node.pads
        inside = np.ones((1, 1) + tuple(spatial[i] + p[i] + p[i + nd] for i in range(nd)), x.dtype)
        ind = _pad_nd(inside, (0,) * (2 * nd), node.kernel, node.strides, ones, out, 0)
    else:
        ind = _pad_nd(np.ones((1, 1) + tuple(spatial), x.dtype), node.pads, node.kernel,
                      node.strides, ones, out, 0)
    counts = _windows_nd(ind, node.kernel, node.strides, ones, out).sum(axis=red)
    return sums / np.maximum(counts, 1)


def conv_transpose(node, x, w, b=None):
    n, c = x.shape[:2]
    spatial = x.shape[2:]
    kernel = w.shape[2:]
    nd = len(kernel)
    g = node.group
    mg = w.shape[1]
    strides, dil, pads = node.strides, node.dilations, node.pads
    full = tuple((spatial[i] - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1 + node.output_padding[i]
                 for i in range(nd))
    y = np.zeros((n, g, mg) + full, dtype=np.result_type(x, w))
    xg = x.reshape((n, g, c // g) + tuple(spatial))
    wg = w.reshape((g, c // g, mg) + tuple(kernel))
    for k in np.ndindex(*kernel):
        contrib = _einsum("ngc...,gcm->ngm...", xg, wg[(slice(None), slice(None), slice(None)) + k])
        index = (slice(None),) * 3 + tuple(
            slice(k[i] * dil[i], k[i] * dil[i] + (spatial[i] - 1) * strides[i] + 1, strides[i])
            for i in range(nd))
        y[index] += contrib
    y = y.reshape((n, g * mg) + full)
    # Negative pads (an output_shape larger than the full result) add zeros instead.
    y = np.pad(y, [(0, 0), (0, 0)] + [(max(-pads[i], 0), max(-pads[i + nd], 0)) for i in range(nd)])
    crop = (slice(None), slice(None)) + tuple(
        slice(max(pads[i], 0), y.shape[2 + i] - max(pads[i + nd], 0)) for i in range(nd))
    y = y[crop]
    if b is not None:
        y = y + b.reshape((1, -1) + (1,) * nd)
    return y


def split(node, x):
    bounds = np.cumsum(node.sizes)[:-1]
    return tuple(np.split(x, bounds, axis=node.axis))


def pad(node, x):
    r = x.ndim
    pads = list(node.pads)
    grow = [(max(pads[i], 0), max(pads[i + r], 0)) for i in range(r)]
    if node.mode == "constant":
        y = np.pad(x, grow, mode="constant", constant_values=np.asarray(node.value).astype(x.dtype))
    else:
        y = np.pad(x, grow, mode={"reflect": "reflect", "edge": "edge", "wrap": "wrap"}[node.mode])
    crop = tuple(slice(-min(pads[i], 0), y.shape[i] + min(pads[i + r], 0)) for i in range(r))
    return y[crop]


def trilu(node, x):
    return np.triu(x, node.k) if node.upper else np.tril(x, node.k)


def gather_elements(node, x, indices):
    idx = np.where(indices < 0, indices + x.shape[node.axis], indices)
    return np.take_along_axis(x, idx.astype(np.int64), axis=node.axis)


def gather_nd(node, x, indices):
    b = node.batch_dims
    last = indices.shape[-1]
    batch_shape = x.shape[:b]
    xb = x.reshape((-1,) + x.shape[b:])
    ib = indices.reshape((xb.shape[0], -1, last))
    out = []
    for i in range(xb.shape[0]):
        idx = ib[i]
        idx = np.where(idx < 0, idx + np.array(x.shape[b:b + last]), idx)
        out.append(xb[i][tuple(idx.T)])
    return np.stack(out).reshape(tuple(indices.shape[:-1]) + x.shape[b + last:]) if batch_shape else \
        out[0].reshape(tuple(indices.shape[:-1]) + x.shape[last:])


_REDUCERS = {"none": None, "add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def scatter_elements(node, x, indices, updates):
    y = x.copy()
    axis = node.axis
    idx = np.where(indices < 0, indices + x.shape[axis], indices)
    full = list(np.indices(idx.shape, sparse=False))
    full[axis] = idx
    where = tuple(full)
    fn = _REDUCERS[node.reduction]
    if fn is None:
        y[where] = updates
    else:
        fn.at(y, where, updates)
    return y


def scatter_nd(node, x, indices, updates):
    y = x.copy()
    last = indices.shape[-1]
    idx = indices.reshape(-1, last)
    upd = updates.reshape((idx.shape[0],) + x.shape[last:])
    fn = _REDUCERS[node.reduction]
    for i in range(idx.shape[0]):
        where = tuple(idx[i])
        y[where] = upd[i] if fn is None else fn(y[where], upd[i])
    return y


def one_hot(node, indices, values):
    depth = node.depth
    idx = np.asarray(indices).astype(np.int64)
    idx = np.where(idx < 0, idx + depth, idx)
    axis = node.axis if node.axis >= 0 else node.axis + idx.ndim + 1
    hot = np.expand_dims(idx, axis) == np.arange(depth).reshape(
        [-1 if i == axis else 1 for i in range(idx.ndim + 1)])
    return np.where(hot, values[1], values[0])


def _arg(fn):
    def run(node, x):
        axis = node.axis
        if node.select_last_index:
            flipped = np.flip(x, axis)
            y = x.shape[axis] - 1 - fn(flipped, axis=axis)
        else:
            y = fn(x, axis=axis)
        return np.expand_dims(y, axis) if node.keepdims else y
    return run


def top_k(node, x):
    axis = node.axis
    if node.largest:
        # Stable descending order: the first of equal values wins, as in ONNX.
        order = np.flip(np.argsort(np.flip(x, axis), axis=axis, kind="stable"), axis)
        order = x.shape[axis] - 1 - order
    else:
        order = np.argsort(x, axis=axis, kind="stable")
    idx = np.take(order, np.arange(node.k), axis=axis)
    return np.take_along_axis(x, idx, axis=axis), idx.astype(np.int64)


def _cum(fn, identity):
    def run(node, x):
        axis = node.axis
        y = np.flip(x, axis) if node.reverse else x
        out = fn(y, axis=axis, dtype=x.dtype)
        if node.exclusive:
            out = np.concatenate([np.full_like(np.take(out, [0], axis=axis), identity),
                                  np.take(out, np.arange(out.shape[axis] - 1), axis=axis)], axis=axis)
        return np.flip(out, axis) if node.reverse else out
    return run


def hardmax(node, x):
    idx = np.argmax(x, axis=node.axis)
    return (np.expand_dims(idx, node.axis) == np.arange(x.shape[node.axis]).reshape(
        [-1 if i == node.axis else 1 for i in range(x.ndim)])).astype(x.dtype)


def einsum(node, xs):
    labels, out = einsum_parse(node.equation, [x.shape for x in xs])
    names = {}
    letters = iter("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    def term(ls):
        return "".join(names.setdefault(l, next(letters)) for l in ls)
    eq = ",".join(term(ls) for ls in labels) + "->" + term(out)
    return _einsum(eq, *xs)


PRIMITIVES = {
    "Conv": conv,
    "MaxPool": max_pool,
    "AvgPool": avg_pool,
    "BatchMatMul": lambda node, a, b: _exact_matmul(a, b),
    "ReduceSum": reduce_with(np.sum),
    "ReduceMax": reduce_with(np.max),
    "ReduceMin": reduce_with(np.min),
    "ReduceProd": reduce_with(np.prod),
    "Reshape": lambda node, x: x.reshape(node.shape),
    "Transpose": lambda node, x: np.transpose(x, node.perm),
    "Pad": pad,
    "Concat": lambda node, xs: np.concatenate(xs, axis=node.axis),
    "Slice": slice_,
    "Gather": gather,
    "Expand": lambda node, x: np.broadcast_to(x, node.outputs[0].type.shape).copy(),
    "Shape": lambda node, x: np.array(shape_range(x.shape, node.start, node.end), np.int64),
    "Size": lambda node, x: np.array(x.size, np.int64),
    "Splat": lambda node: np.full(node.shape, node.value, dtype=node.outputs[0].type.np_dtype),
    "Range": range_,
    # conformance (issue 6)
    "ConvN": conv_nd,
    "QuantizedConv": quantized_conv,
    "QuantizedMatMul": quantized_matmul,
    "MaxPoolN": max_pool_nd,
    "AvgPoolN": avg_pool_nd,
    "ConvTranspose": conv_transpose,
    "Split": split,
    "Pad": pad,
    "Trilu": trilu,
    "GatherElements": gather_elements,
    "GatherND": gather_nd,
    "ScatterElements": scatter_elements,
    "ScatterND": scatter_nd,
    "EyeLike": lambda node, x: np.eye(x.shape[0], x.shape[1], node.k, dtype=node.outputs[0].type.np_dtype),
    "OneHot": one_hot,
    "ArgMax": _arg(np.argmax),
    "ArgMin": _arg(np.argmin),
    "TopK": top_k,
    "CumSum": _cum(np.cumsum, 0),
    "CumProd": _cum(np.cumprod, 1),
    "Hardmax": hardmax,
    "Einsum": einsum,
}
