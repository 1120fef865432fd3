"""Interpolation weights of the spec language (Resize, Upsample).

Resize is separable: along each resized axis the result is a constant linear map of the
operand, out = W @ x along that axis, plus a constant where tf_crop_and_resize
extrapolates.  W is sparse (each output reads a few neighbours), so the graph uses it as
[out, taps] indices and weights.  Every interpolation mode (nearest, linear, cubic, their antialiased forms,
exclude_outside) is only a different W, computed here at compile time from the attributes,
following ONNX's definition of Resize (onnx/reference/ops/op_resize.py) axis by axis.

The functions are plain functions of numbers and lists; those marked @helper are callable
from the specs (`resize_tap_weights(...)` in specs/lowerings.glowdef), where
specs/helpers.glowdef declares them.  Grid sampling's positions and taps live here too.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from ..errors import ShapeError
from .registry import helper

RESIZE_MODES = ("nearest", "linear", "cubic")
COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                    "asymmetric", "tf_crop_and_resize")
# "legacy" is not an ONNX value: it is how Resize-10 and Upsample round (as onnxruntime does),
# down when enlarging and up when shrinking.
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "legacy")


# ----------------------------------------------------------------------------- import
def _per_axis(values, axes, rank, fill):
    """Values given for `axes` only, spread over all `rank` dimensions (`fill` elsewhere)."""
    out = list(fill)
    for i, a in enumerate(axes):
        out[a] = values[i]
    return out


def _resize_plan(shape, scales, sizes, axes, policy):
    """(output shape, scale of every dimension) of ONNX Resize from its scales or sizes."""
    rank = len(shape)
    axes = [int(a) + rank if int(a) < 0 else int(a) for a in axes] or list(range(rank))
    scales = [float(s) for s in np.asarray(scales, np.float64).reshape(-1)]
    sizes = [int(s) for s in np.asarray(sizes, np.int64).reshape(-1)]
    if len(scales) and len(sizes):
        raise ShapeError("Resize takes scales or sizes, not both")
    if len(sizes):
        if len(sizes) != len(axes):
            raise ShapeError(f"Resize sizes {sizes} must give one size per resized axis {axes}")
        out = _per_axis(sizes, axes, rank, shape)
        full = [out[i] / shape[i] for i in range(rank)]
        if policy in ("not_larger", "not_smaller"):
            pick = min if policy == "not_larger" else max
            scale = pick(full[a] for a in axes)
            full = [scale if i in axes else 1.0 for i in range(rank)]
            out = [int(scale * shape[i] + 0.5) if i in axes else shape[i] for i in range(rank)]
        elif policy != "stretch":
            raise ShapeError(f"keep_aspect_ratio_policy must be stretch, not_larger or not_smaller, "
                             f"not {policy!r}")
        return tuple(out), tuple(full)
    if len(scales) != len(axes):
        raise ShapeError(f"Resize needs scales or sizes for the resized axes {axes}, got "
                         f"scales {scales} and sizes {sizes}")
    if any(s <= 0 for s in scales):
        raise ShapeError(f"Resize scales must be positive, got {scales}")
    full = _per_axis(scales, axes, rank, [1.0] * rank)
    return tuple(int(shape[i] * full[i]) for i in range(rank)), tuple(full)


@helper
def resize_sizes(shape, scales, sizes, axes, policy="stretch"):
    """The output shape of ONNX Resize (scales and sizes as given, for `axes` or all)."""
    return _resize_plan(shape, scales, sizes, axes, policy)[0]


@helper
def resize_scales(shape, scales, sizes, axes, policy="stretch"):
    """The scale of every dimension of ONNX Resize (what the coordinate transform divides by)."""
    return _resize_plan(shape, scales, sizes, axes, policy)[1]


@helper
def resize_roi(rank, roi, axes, mode):
    """The region of interest [starts..., ends...] of every dimension; only
    tf_crop_and_resize reads it, every other mode the whole input."""
    full = [0.0] * rank + [1.0] * rank
    roi = [float(v) for v in np.asarray(roi, np.float64).reshape(-1)]
    if mode != "tf_crop_and_resize" or not roi:
        return tuple(full)
    axes = [int(a) + rank if int(a) < 0 else int(a) for a in axes] or list(range(rank))
    if len(roi) != 2 * len(axes):
        raise ShapeError(f"Resize roi {roi} must give a start and an end for each resized axis {axes}")
    for i, a in enumerate(axes):
        full[a], full[rank + a] = roi[i], roi[len(axes) + i]
    return tuple(full)


@helper
def resize_active_axes(shape, sizes, scales, roi):
    """The axes Resize changes: an axis with scale 1, the same size and the whole input as
    its region is the identity (as in ONNX's definition), whatever the mode."""
    rank = len(shape)
    return tuple(a for a in range(rank)
                 if not (math.isclose(scales[a], 1.0) and sizes[a] == shape[a]
                         and math.isclose(roi[a], 0.0) and math.isclose(roi[rank + a], 1.0)))


@helper
def resize_shape(shape, sizes, axes):
    """The shape after resizing `axes` to `sizes` (the other dimensions keep theirs)."""
    return tuple(sizes[i] if i in axes else d for i, d in enumerate(shape))


@helper
def legacy_resize_scales(shape, scales):
    """Upsample and Resize-10 give a scale per dimension and floor the output size."""
    scales = [float(s) for s in np.asarray(scales, np.float64).reshape(-1)]
    if len(scales) != len(shape):
        raise ShapeError(f"scales {scales} must give one scale per dimension of {list(shape)}")
    return tuple(scales)


# ----------------------------------------------------------------------------- weights
def _source_coordinates(ctm, out_len, in_len, scale, roi_start, roi_end):
    """Where each output position samples the input (ONNX's coordinate transforms), and
    which positions tf_crop_and_resize puts outside the input (None for other modes)."""
    y = np.arange(out_len, dtype=np.float64)
    length = scale * in_len                       # the unrounded output length
    outside = None
    if ctm == "align_corners":
        x = np.zeros(out_len) if length == 1 else y * (in_len - 1) / (length - 1)
    elif ctm == "asymmetric":
        x = y / scale
    elif ctm == "tf_crop_and_resize":
        if length == 1:
            x = np.full(out_len, (roi_end - roi_start) * (in_len - 1) / 2)
        else:
            x = y * (roi_end - roi_start) * (in_len - 1) / (length - 1)
        x = x + roi_start * (in_len - 1)
        outside = (x < 0) | (x > in_len - 1)
    elif ctm == "pytorch_half_pixel":
        x = np.full(out_len, -0.5) if length == 1 else (y + 0.5) / scale - 0.5
    elif ctm == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif ctm == "half_pixel_symmetric":
        offset = in_len / 2 * (1 - out_len / length)
        x = offset + (y + 0.5) / scale - 0.5
    else:
        raise ShapeError(f"coordinate_transformation_mode must be one of {', '.join(COORDINATE_MODES)}, "
                         f"not {ctm!r}")
    return x, outside


def _cubic(x, a):
    """The cubic convolution kernel with coefficient `a` (Keys)."""
    x = np.abs(x)
    return np.where(x <= 1, ((a + 2) * x - (a + 3)) * x * x + 1,
                    np.where(x < 2, ((a * x - 5 * a) * x + 8 * a) * x - 4 * a, 0.0))


def _taps(mode, nearest_mode, ratio, scale, cubic_a, antialias):
    """Coefficients of the taps around one output position; `ratio` in (0, 1] is its
    distance from the input position on its left."""
    if mode == "nearest":
        if ratio == 1:
            return np.array([0.0, 1.0])
        if nearest_mode == "legacy":
            nearest_mode = "ceil" if scale < 1 else "floor"
        up = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5,
              "floor": False, "ceil": True}[nearest_mode]
        return np.array([0.0, 1.0]) if up else np.array([1.0, 0.0])
    if mode == "linear":
        if not antialias:
            return np.array([1 - ratio, ratio])
        s = min(scale, 1.0)       # a wider tent when shrinking
        start = int(np.floor(-1 / s) + 1)
        c = np.clip(1 - np.abs((np.arange(start, 2 - start) - ratio) * s), 0, 1)
        return c / c.sum()
    if not antialias:
        return _cubic(np.array([ratio + 1, ratio, 1 - ratio, 2 - ratio]), cubic_a)
    s = min(scale, 1.0)
    start = int(np.floor(-2 / s) + 1)
    c = _cubic(s * (np.arange(start, 2 - start) - ratio), cubic_a)
    return c / c.sum()


@functools.lru_cache(maxsize=256)
def _axis_map(in_len, out_len, scale, roi_start, roi_end, mode, ctm, nearest_mode, cubic_a,
              exclude_outside, antialias):
    """(W [out_len, in_len], outside [out_len]) of one resized axis."""
    if mode not in RESIZE_MODES:
        raise ShapeError(f"Resize mode must be one of {', '.join(RESIZE_MODES)}, not {mode!r}")
    if mode == "nearest" and nearest_mode not in NEAREST_MODES:
        raise ShapeError(f"nearest_mode must be one of {', '.join(NEAREST_MODES[:-1])}, not {nearest_mode!r}")
    x, outside = _source_coordinates(ctm, out_len, in_len, scale, roi_start, roi_end)
    w = np.zeros((out_len, in_len), np.float64)
    for o in range(out_len):
        if outside is not None and outside[o]:
            continue                               # the extrapolation value, added apart
        left = math.floor(x[o])
        ratio = 1.0 if x[o] == left else x[o] - left
        taps = _taps(mode, nearest_mode, ratio, scale, cubic_a, antialias)
        n = len(taps)
        # The n input positions nearest x (ties to the left), as ONNX picks them.
        if n % 2 == 0:
            first = left - n // 2 + 1 if x[o] != left else left - n // 2
        else:
            centre = left if x[o] - left <= 0.5 else left + 1
            first = centre - (n - 1) // 2
        idx = np.arange(first, first + n)
        if exclude_outside:
            taps = np.where((idx < 0) | (idx >= in_len), 0.0, taps)
            total = taps.sum()
            taps = taps / (total if total != 0 else 1.0)
        # Positions beyond the edges repeat the edge element.
        np.add.at(w[o], np.clip(idx, 0, in_len - 1), taps)
    return w, (np.zeros(out_len, bool) if outside is None else outside)


def _axis_args(in_len, axis, sizes, scales, roi, mode, ctm, nearest_mode, cubic_a, exclude_outside, antialias):
    rank = len(sizes)
    return (int(in_len), int(sizes[axis]), float(scales[axis]), float(roi[axis]), float(roi[rank + axis]),
            str(mode), str(ctm), str(nearest_mode), float(cubic_a), bool(exclude_outside), bool(antialias))


def _sparse_rows(w):
    """W [out, in] as (indices [out, T], weights [out, T]): the T = most nonzero weights in
    any row, padded with weight 0 at index 0."""
    count = max(1, int((w != 0).sum(axis=1).max()))
    idx = np.zeros((w.shape[0], count), np.int64)
    weights = np.zeros((w.shape[0], count), np.float64)
    for o, row in enumerate(w):
        nz = np.flatnonzero(row)
        idx[o, :len(nz)], weights[o, :len(nz)] = nz, row[nz]
    return idx, weights


@helper
def resize_tap_indices(*args):
    """The input positions each output position reads along the axis, [out_len, taps]."""
    return _sparse_rows(_axis_map(*_axis_args(*args))[0])[0].tolist()


@helper
def resize_tap_weights(*args):
    """Their weights, [out_len, taps]."""
    return _sparse_rows(_axis_map(*_axis_args(*args))[0])[1].tolist()


@helper
def resize_taps(*args):
    """How many input positions an output position reads (T of the [out_len, T] taps)."""
    return int(_sparse_rows(_axis_map(*_axis_args(*args))[0])[0].shape[1])


@helper
def resize_tap_column(*args, tap=0):
    """The input position each output position reads as its tap `tap`, [out_len]."""
    return _sparse_rows(_axis_map(*_axis_args(*args))[0])[0][:, int(tap)].tolist()


@helper
def resize_weight_column(*args, tap=0):
    """The weight of that tap, [out_len]."""
    return _sparse_rows(_axis_map(*_axis_args(*args))[0])[1][:, int(tap)].tolist()


@helper
def resize_fill(*args, value=0.0):
    """What tf_crop_and_resize adds where it extrapolates: `value` there, 0 elsewhere."""
    return [float(value) if o else 0.0 for o in _axis_map(*_axis_args(*args))[1]]


@helper
def resize_extrapolates(*args):
    return bool(_axis_map(*_axis_args(*args))[1].any())


@helper
def resize_gather_indices(*args):
    """The input position each output position copies, where every row of W is one 1."""
    return np.argmax(_axis_map(*_axis_args(*args))[0], axis=1).tolist()


# ----------------------------------------------------------------------------- GridSample
# GridSample reads its sampling positions from a tensor, so its weights are computed in the
# graph; these are the constants that computation needs, one entry per spatial axis.
@helper
def grid_scale(spatial, align_corners):
    """Denormalizing a grid coordinate g of an axis of length n is (g + 1) * scale + offset:
    (g + 1) / 2 * (n - 1) with align_corners, ((g + 1) * n - 1) / 2 without."""
    return tuple((n - 1) / 2 if align_corners else n / 2 for n in spatial)


@helper
def grid_offset(spatial, align_corners):
    return tuple(0.0 if align_corners else -0.5 for _ in spatial)


@helper
def grid_low(spatial, align_corners):
    """The border reflection and border padding go by: the outer edge of the first element,
    or its centre with align_corners."""
    return tuple(0.0 if align_corners else -0.5 for _ in spatial)


@helper
def grid_high(spatial, align_corners):
    return tuple(n - 1.0 if align_corners else n - 0.5 for n in spatial)


@helper
def grid_tap_offsets(mode):
    """The input positions a sample reads, relative to the one at or below it."""
    return {"nearest": (0.0,), "linear": (0.0, 1.0), "cubic": (-1.0, 0.0, 1.0, 2.0)}[mode]


@helper
def grid_tap_combinations(rank, taps):
    """For each of the taps ** rank combinations of one tap per axis, where its tap on axis
    i sits in a [rank * taps] list of per-axis taps: entry i * taps + tap."""
    combos = np.stack(np.meshgrid(*[np.arange(taps)] * rank, indexing="ij"), -1).reshape(-1, rank)
    return (combos + np.arange(rank) * taps).tolist()


@helper
def row_major_strides(shape):
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))


__all__ = [name for name in dir() if name.startswith("b_")]
