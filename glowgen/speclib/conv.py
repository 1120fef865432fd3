"""Convolution and pooling arithmetic: output sizes, ONNX auto_pad, window pads and
counts, Col2Im as a transposed convolution.

Each function marked @helper is callable from the specs, where specs/helpers.glowdef declares
it with its parameters."""
from __future__ import annotations

import numpy as np

from ..engine.specrt import b_prod
from ..errors import ShapeError
from .registry import helper


@helper
def auto_pads(mode, spatial, kernel, strides, dilations, pads):
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


@helper
def outer_pads(pads, count):
    """The pads of the first `count` dimensions, [begins..., ends...]."""
    n = len(pads) // 2
    return tuple(pads[:count]) + tuple(pads[n:n + count])


@helper
def spatial_pads(pads, count=2):
    """The pads of the dimensions after the first `count`, as [begins..., ends...] (the
    layout of Conv and pooling pads when count is 2: N and C are not spatial)."""
    n = len(pads) // 2
    return tuple(pads[count:n]) + tuple(pads[n + count:])


@helper
def conv_shape(spatial, kernel, pads, strides, dilations, ceil_mode=0):
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


@helper
def pool_shape(spatial, kernel, pads, strides, dilations, ceil_mode):
    return conv_shape(spatial, kernel, pads, strides, dilations, ceil_mode)


@helper
def convtranspose_shape(spatial, kernel, pads, strides, dilations, output_padding):
    n = len(spatial)
    return tuple((spatial[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1
                 + output_padding[i] - pads[i] - pads[i + n] for i in range(n))


@helper
def convtranspose_pads(mode, spatial, kernel, strides, dilations, output_padding, pads, output_shape):
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


@helper
def window_pads(spatial, kernel, pads, strides, dilations, ceil_mode):
    """Pads [begin..., end...] under which a convolution has the pooling's output size: with
    ceil_mode the last window may hang over the end, which then gets the missing zeros."""
    n = len(spatial)
    out = pool_shape(spatial, kernel, pads, strides, dilations, ceil_mode)
    end = list(pads[n:])
    for i in range(n):
        needed = (out[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1
        end[i] += max(0, needed - (spatial[i] + pads[i] + pads[n + i]))
    return tuple(pads[:n]) + tuple(end)


@helper
def window_counts(spatial, kernel, pads, strides, dilations, ceil_mode, count_include_pad):
    """How many taps of each pooling window fall on the input (or, with count_include_pad,
    on the input or its explicit pads): the divisor of an average pool, [1, 1, *out]."""
    n = len(spatial)
    out = pool_shape(spatial, kernel, pads, strides, dilations, ceil_mode)
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


@helper
def col2im_weights(channels, block):
    """ConvTranspose weights [channels * K, 1, *block] (K = prod(block)) that put column
    entry j of each channel at offset j of its block: a one-hot filter per entry."""
    k = b_prod(block)
    eye = np.eye(k).reshape((k, 1) + tuple(block))
    return np.tile(eye, (channels, 1) + (1,) * len(block)).tolist()


@helper
def col2im_output_padding(image, blocks, block, pads, strides, dilations):
    """What a transposed convolution of `blocks` positions adds at the end to reach `image`."""
    n = len(image)
    return tuple(image[i] - (strides[i] * (blocks[i] - 1) + dilations[i] * (block[i] - 1) + 1
                             - pads[i] - pads[n + i]) for i in range(n))
