"""Convolutions whose output planes are too small for the GEMM's vectors: computed transposed.

The GEMM kernel vectorizes along the columns of C, a convolution's output pixels.  When
there are few of them -- ResNet's and MobileNet's last stages have 7 x 7 = 49 -- the last
NR-wide panel is mostly padding: 49 columns take 64 lanes, and such layers ran at 77% of
the speed of the others.  Their filters are many (512 to 2048), so the product is computed
transposed, vectorized along the filters:

    C^T [pixels x filters] = P^T [pixels x K] @ W^T [K x filters]

with the patches P^T packed in MR-pixel blocks (the A side: im2col panels MR wide are
exactly that) and the weights W^T packed at compile time in NR-filter panels (packing.py,
layout "t").  C^T goes to scratch; a last pass transposes it back 16 x 16 blocks at a time
in registers and stores each output row through the bias and the fused elementwise run.
"""
from __future__ import annotations

import math

from llvmlite import ir

from .conv_planes import (PlaneGeometry, aligned_floats, conv_is_pointwise, fill_plane,
                          patch_panel, zero_planes)
from ..gemm import GemmShape, emit_gemm
from ..llvmutil import for_range, i64
from ..vectors import copy_run, f32_vector, splat, transpose_block, vload, vstore

# Transposed when that wastes this much less of the vector lanes: not for LeNet's second
# convolution with AVX2 (16 filters fill two 8-lane vectors, 100 pixels 89% of 16-wide
# panels: a gain of 0.11, and the transposed form took 0.030 instead of 0.021 ms in all).
_MIN_GAIN = 0.12


def lane_use(n: int, nr: int) -> float:
    return n / (-(-n // nr) * nr)


def conv_is_transposed(node, shape) -> bool:
    """A single-group GEMM convolution whose filters fill the vector lanes clearly better
    than its output pixels do."""
    m = node.inputs[1].type.shape[0]
    oh, ow = node.outputs[0].type.shape[2:]
    return node.group == 1 and lane_use(m, shape.nr) - lane_use(oh * ow, shape.nr) >= _MIN_GAIN


def pixel_block(n: int, shape) -> int:
    """Pixels per register tile: the tile's MR, unless the last block would be under half
    of it -- a 1 x NR tile for 49 = 6 x 8 + 1 pixels has too few accumulators to keep the
    FMA pipes busy -- and a little less divides the pixels (49 = 7 x 7)."""
    if n % shape.mr == 0 or n % shape.mr >= shape.mr // 2:
        return shape.mr
    for mr in range(shape.mr - 1, shape.mr // 2, -1):
        if n % mr == 0:
            return mr
    return shape.mr


def pixel_tiles(n: int, mr: int) -> list:
    """The register tiles for `n` pixels as runs (tiles, rows of each): whole tiles of MR,
    the last one ragged -- unless that wastes a twentieth of the rows computed and tiles of
    MR - 1 rows can take the rest: each of the MR - n % MR rows the ragged tile would waste
    is one tile giving up a row (49 = 4 x 6 + 5 x 5 instead of 9 x 6).  AVX2's 6-pixel tiles
    at 7 x 7 (which fit neither 7-pixel tiles, 14 accumulators + 2 vectors of weights + a
    broadcast in 16 ymm, nor their weights as FMA memory operands: 2.25 -> 3.3 ms, loads
    the bottleneck): ResNet's 512 -> 512 3x3 2.25 -> 2.10 ms alone (blocked), its 1x1
    2048 -> 512 0.971 -> 0.945 and 512 -> 2048 0.99 -> 0.97 (transposed; Zen 4 compiled for
    x86-64-v3, 1 thread, fastest of 200 on a shared machine)."""
    full, rest = divmod(n, mr)
    shorter = mr - rest
    if rest and mr > 2 and 20 * shorter >= n + shorter and full + 1 >= shorter:
        runs = [(full + 1 - shorter, mr), (shorter, mr - 1)]
        return [(t, r) for t, r in runs if t]
    return [(full + (rest > 0), mr)]


def _layout(node, shape):
    """(floats of input planes, of packed patches, of C^T) in the scratch buffer."""
    m, cg, kh, kw = node.inputs[1].type.shape
    oh, ow = node.outputs[0].type.shape[2:]
    n, k = oh * ow, cg * kh * kw
    planes = 0 if conv_is_pointwise(node) else aligned_floats(cg * PlaneGeometry(node, shape.vw).size)
    mr = pixel_block(n, shape)
    patches = aligned_floats(-(-n // mr) * mr * k)
    return planes, patches, aligned_floats(n * m)


def scratch_floats(node, shape) -> int:
    return sum(_layout(node, shape))


def transposed_items(node, shape) -> int:
    """What a split shares out (parallel.py): whole panels of filters (B's, in the product
    below), or runs of pixels (transposed_split_pixels), whichever are more.  Each task
    builds the patch matrix in its own scratch: the whole of it, or the blocks of its pixels."""
    return max(node.inputs[1].type.shape[0] // shape.nr, _pixel_units(node, shape)[1])


def _pixel_units(node, shape) -> tuple:
    """(pixels, count) of the runs of pixels a split by pixels shares out: whole blocks of the
    product's rows that also start whole vectors of the transposed store."""
    oh, ow = node.outputs[0].type.shape[2:]
    mr = pixel_block(oh * ow, shape)
    unit = mr * shape.vw // math.gcd(mr, shape.vw)
    return unit, oh * ow // unit


def transposed_split_pixels(node, shape, parts: int) -> bool:
    """A split transposed convolution shares out runs of pixels, each task computing and
    storing all filters of its pixels, when it builds its patch matrix from padded planes
    (not pointwise) and the runs divide evenly among the tasks or are many: each task then
    builds only its pixels' patches, where split by filters every task built all of them
    (ResNet-18's 3x3 convolutions at 14 x 14, 2 threads: the slower task's fastest over half
    the 1-thread time 1.10-1.23 -> 1.02-1.09).  Else its filter panels when they divide
    evenly among the tasks or are many (a pointwise one's patches are a plain copy, and
    its filters shared out keep the depthwise convolution after it joined, joining.py),
    else runs of pixels (MobileNetV2's 96-filter projections at 14 x 14: three panels
    kept one of two cores idle a third of the time)."""
    panels = node.inputs[1].type.shape[0] // shape.nr
    units = _pixel_units(node, shape)[1]
    if not conv_is_pointwise(node) and units >= parts and (units % parts == 0 or units >= 4 * parts):
        return True
    if panels >= parts and (panels % parts == 0 or panels >= 4 * parts):
        return False
    return units >= parts


def emit_conv_transposed(k) -> None:
    b, shape, node = k.b, k.gemm_shape, k.node
    (y, _), (x, xt), (w, _) = k.outs[0], k.ins[0], k.ins[1]
    bias = k.ins[2]
    n_img, c, h, wd = xt.shape
    m, cg, kh, kw = node.inputs[1].type.shape
    oh, ow = node.outputs[0].type.shape[2:]
    n, kk = oh * ow, cg * kh * kw
    mr, vw = pixel_block(n, shape), shape.vw
    planes_n, patches_n, _ = _layout(node, shape)
    planes = k.scratch
    patches = b.gep(k.scratch, [i64(planes_n)])
    ct = b.gep(k.scratch, [i64(planes_n + patches_n)])
    pointwise = conv_is_pointwise(node)
    geo = None if pointwise else PlaneGeometry(node, vw)
    blocks = -(-n // mr)

    def fill(xbase):
        """The input channels in their zero-padded planes."""
        with for_range(b, cg, name="deal") as ci:
            plane = b.gep(planes, [b.mul(ci, i64(geo.size))])
            fill_plane(b, geo, b.gep(x, [b.add(xbase, b.mul(ci, i64(h * wd)))]), plane)

    by_pixels = not k.split.whole and transposed_split_pixels(node, shape, k.split.parts)
    unit = _pixel_units(node, shape)[0]

    # Runs of blocks (first pixel, blocks, pixels in each): one run of MR-pixel blocks, or
    # with pixel_tiles' blocks of MR - 1 pixels after them (not when the tasks share out
    # runs of MR-pixel blocks).
    runs, first = [], 0
    for count, rows in pixel_tiles(n, mr) if not by_pixels else [(blocks, mr)]:
        runs.append((first, count, rows))
        first += count * rows

    def patch_blocks(xbase):
        """P^T in blocks of MR pixels: block j holds, for each k, pixels j*MR .. j*MR+MR-1
        (a run of smaller blocks after them likewise, from its first pixel on).
        A task split by pixels builds only the blocks of its rows of the product (emit_gemm's
        runs of `unit // mr` blocks, the last task to the end), not every block (MobileNetV2's
        96-filter projections at 14 x 14, 2 threads, the slower task's fastest: 110 -> 103 us,
        75 -> 70 us for the first)."""
        for p0, count, rows in runs:
            lo, hi = i64(0), i64(count)
            if by_pixels:
                run = unit // mr
                lo, hi = k.split.range(b, (n // mr) // run)
                lo, hi = b.mul(lo, i64(run)), b.select(k.split.is_last(b), i64(blocks), b.mul(hi, i64(run)))
            with for_range(b, hi, start=lo, name=f"blk{rows}") as j:
                q = b.add(i64(p0), b.mul(j, i64(rows)))            # the block's first pixel
                if pointwise:
                    valid = b.sub(i64(n), q)
                    valid = b.select(b.icmp_signed("<", valid, i64(rows)), valid, i64(rows))
                    with for_range(b, kk, name="row") as r:
                        src = b.gep(x, [b.add(xbase, b.add(b.mul(r, i64(n)), q))])
                        copy_run(b, src, b.gep(patches, [b.add(b.mul(q, i64(kk)), b.mul(r, i64(rows)))]),
                                 valid, rows)
                else:
                    patch_panel(b, geo, planes, b.gep(patches, [b.mul(q, i64(kk))]), rows, q)

    def product(img):
        for p0, count, rows in runs:
            emit_gemm(b, GemmShape(vw, rows, shape.nv), min(count * rows, n - p0), m, kk,
                      b.gep(patches, [i64(p0 * kk)]), kk, w, None, b.gep(ct, [i64(p0 * m)]), m, name="ct",
                      a_packed=True, split=k.split, split_rows=by_pixels, row_align=unit // mr)
        _store_transposed(k, ct, n, m, img, y, bias, unit if by_pixels else None)

    if not pointwise:
        zero_planes(b, geo, planes, cg)
    with for_range(b, n_img, name="img") as img:
        xbase = b.mul(img, i64(c * h * wd))
        if not pointwise:
            fill(xbase)
        patch_blocks(xbase)
        product(img)


def _store_transposed(k, ct, n: int, m: int, img, y, bias, pixel_unit=None) -> None:
    """y[img, f, p] = C^T[p, f] + bias[f], through the epilogue when there is one: blocks of
    VW pixels x VW filters are loaded as VW vectors along the filters and transposed in
    registers into VW vectors along the pixels.  A split task stores the filters of its
    panels (the last one, the filters past the last whole panel too), or with `pixel_unit`,
    every filter of its runs of that many pixels (the last one, the pixels past them too)."""
    b, vw = k.b, k.gemm_shape.vw
    split, nr = k.split, k.gemm_shape.nr
    by_pixels = pixel_unit is not None

    def block(p0, f0, pixels: int, filters: int):
        store_ct_block(k, b.gep(ct, [b.mul(p0, i64(m))]), m, f0, pixels, filters, img, p0, y, bias, m, n)

    def filters_of(p0, pixels: int):
        f_full = m // vw
        if f_full:
            lo, hi = i64(0), i64(f_full * vw)
            if not split.whole and not by_pixels:
                lo, hi = split.range(b, m // nr)
                lo, hi = b.mul(lo, i64(nr)), b.select(split.is_last(b), i64(f_full * vw), b.mul(hi, i64(nr)))
            with for_range(b, hi, start=lo, step=vw, name="tf") as f0:
                block(p0, f0, pixels, vw)
        if m % vw:
            if split.whole or by_pixels:
                block(p0, i64(f_full * vw), pixels, m % vw)
            else:
                with b.if_then(split.is_last(b)):
                    block(p0, i64(f_full * vw), pixels, m % vw)

    p_full = n // vw
    if by_pixels:     # the pixels of the product's rows this task computed (emit_gemm's row_align)
        lo, hi = split.range(b, n // pixel_unit)
        lo, hi = b.mul(lo, i64(pixel_unit)), b.select(split.is_last(b), i64(p_full * vw), b.mul(hi, i64(pixel_unit)))
    else:
        lo, hi = i64(0), i64(p_full * vw)
    if p_full:
        with for_range(b, hi, start=lo, step=vw, name="tp") as p0:
            filters_of(p0, vw)
    if n % vw:
        if by_pixels:
            with b.if_then(split.is_last(b)):
                filters_of(i64(p_full * vw), n % vw)
        else:
            filters_of(i64(p_full * vw), n % vw)


def store_ct_block(k, ct, ldct: int, f0, pixels: int, filters: int, img, p0, y, bias, m: int, n: int) -> None:
    """y[img, f0 + j, p0 + r] = C^T[r, f0 + j] (+ bias) for `pixels` rows r of C^T from `ct`
    (row stride `ldct`) and `filters` columns: VW rows loaded as vectors along the filters,
    transposed in registers into vectors along the pixels, each stored (or handed to the
    epilogue) as one output row's run of pixels."""
    b, vw = k.b, k.gemm_shape.vw
    zero = ir.Constant(f32_vector(vw), [0.0] * vw)
    rows = [vload(b, b.gep(ct, [b.add(i64(r * ldct), f0)]), vw, filters if filters < vw else None)
            if r < pixels else zero for r in range(vw)]
    cols = transpose_block(b, rows)
    for j in range(filters):
        f = b.add(f0, i64(j))
        v = cols[j]
        if bias is not None:
            v = b.fadd(v, splat(b, b.load(b.gep(bias[0], [f])), vw))
        if k.epilogue is not None:
            k.epilogue(b, v, img, f, p0, pixels)
        else:
            out = b.gep(y, [b.add(b.mul(b.add(b.mul(img, i64(m)), f), i64(n)), p0)])
            vstore(b, v, out, vw, pixels if pixels < vw else None)
