"""NumPy implementations of the non-elementwise primitives (the `extern` list of
`specs/cpu_kernels.glowdef`).  Simple over fast: this is the reference backend."""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ... import shapelib


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
    y = np.matmul(cols, wg)                                                 # G (N OH OW) MG
    y = y.reshape(g, n, oh, ow, m // g).transpose(1, 0, 4, 2, 3).reshape(n, m, oh, ow)
    if b is not None:
        y = y + b.reshape(1, m, 1, 1)
    return y


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


def pad(node, x):
    n = x.ndim
    widths = [(node.pads[i], node.pads[n + i]) for i in range(n)]
    if node.mode == "constant":
        return np.pad(x, widths, mode="constant", constant_values=np.asarray(node.value).astype(x.dtype))
    return np.pad(x, widths, mode=node.mode)      # edge and reflect mean what NumPy means


def range_(node):
    count = node.outputs[0].type.shape[0]
    dtype = node.outputs[0].type.np_dtype
    return (np.asarray(node.start, dtype) + np.arange(count, dtype=dtype) * np.asarray(node.delta, dtype)).astype(dtype)


PRIMITIVES = {
    "Conv": conv,
    "MaxPool": max_pool,
    "AvgPool": avg_pool,
    "BatchMatMul": lambda node, a, b: np.matmul(a, b),
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
    "Shape": lambda node, x: np.array(shapelib.b_shape_range(x.shape, node.start, node.end), np.int64),
    "Size": lambda node, x: np.array(x.size, np.int64),
    "Splat": lambda node: np.full(node.shape, node.value, dtype=node.outputs[0].type.np_dtype),
    "Range": range_,
}
