"""A ConvTranspose whose kernel equals its stride and is two taps wide (2x2 stride 2, a
detector's upsampling head): one matrix product whose store writes the final layout.

Each input pixel (h, w) writes its own KH x 2 block of the output, so the op is the product

    C [M * KH * 2, H * W] = A [M * KH * 2, C] @ x [C, H * W],   A[(m, di, dj), c] = w[c, m, di, dj]

whose row (m, di, dj) holds output pixels (KH * h + di, 2 * w + dj) of channel m.  The
product's tiles run along input rows (gemm.emit_gemm's b_table: B is x read in place), and
MR is even, so the rows (m, di, 0) and (m, di, 1) of a tile are neighbours: their vectors
interleaved lane by lane are two contiguous vectors of output row KH * h + di, which go
through the bias and the fused epilogue to their place.  The 1x1 convolution to M * KH * 2
channels and the pixel-shuffle pass it replaced wrote and read an intermediate as large
as the output (det_fpn's 24 -> 24 at 160x160: 9.8 MB each way).
"""
from __future__ import annotations

from llvmlite import ir

from ..gemm import emit_gemm
from ..llvmutil import for_range, i64
from ..packing import pack_weights
from ..parallel import Work, parallel
from ..vectors import vstore
from .base import PRODUCT_SPACE, REPACK, STRATEGY, KernelArgs, hook, kernel
from .conv import conv_transpose_scatter, offsets_global

def interleaved_applies(node) -> bool:
    """A 2-D f32 ConvTranspose with a KH x 2 kernel equal to its strides, no pads, no
    dilation, one group (what convtranspose_nonoverlapping_to_conv leaves to backends)."""
    x, w = node.inputs[0].type, node.inputs[1].type
    return (len(x.shape) == 4 and node.outputs[0].type.dtype == "f32" and node.group == 1
            and w.shape[3] == 2 and tuple(node.strides) == tuple(w.shape[2:])
            and list(node.dilations) == [1, 1] and not any(node.pads) and not any(node.output_padding))


@hook(STRATEGY, "ConvTranspose")
def conv_transpose_strategy(ins, shape, packable, plan) -> str:
    """plan.CONV_TRANSPOSE_STRATEGIES."""
    return "interleaved" if interleaved_applies(ins.node) else "scatter"


@hook(REPACK, "ConvTranspose")
def conv_transpose_repack(prog, ins, shape, users) -> bool:
    """The filters as the product's A, [M * KH * 2, C] in MR-row blocks (packing.pack_rows)."""
    if ins.plan.strategy != "interleaved":
        return False
    c = ins.node.inputs[1].type.shape[0]
    return pack_weights(prog, ins, 2, "a", None, shape, users,
                        matrices=lambda data: data.reshape(1, c, -1).transpose(0, 2, 1))


@hook(PRODUCT_SPACE, "ConvTranspose")
def conv_transpose_product_space(ins, features: str = ""):
    """[batch, channels, output pixels]: the store hands whole vectors of an output row to
    the epilogue."""
    if ins.plan.strategy != "interleaved":
        return None
    n, m, oh, ow = ins.node.outputs[0].type.shape
    return (n, m, oh * ow)


@parallel("ConvTranspose")
def conv_transpose_work(node, shape, ins) -> Work:
    """Whole input rows (gemm.emit_gemm's b_table), each with all filters."""
    if shape is None or ins.plan.strategy != "interleaved":
        return Work(1)
    n, c, h, w = node.inputs[0].type.shape
    m = node.outputs[0].type.shape[1]
    kh, kw = node.inputs[1].type.shape[2:]
    return Work(h, flops=2.0 * n * c * h * w * m * kh * kw)


@kernel("ConvTranspose")
def conv_transpose(k: KernelArgs):
    if k.strategy == "interleaved":
        return emit_interleaved(k)
    return conv_transpose_scatter(k)


def emit_interleaved(k: KernelArgs) -> None:
    b, shape, node = k.b, k.gemm_shape, k.node
    (y, _), (x, _), (w, _) = k.outs[0], k.ins[0], k.ins[1]
    bias = k.ins[2]
    n_img, c, h, wd = node.inputs[0].type.shape
    m, kh, kw = node.outputs[0].type.shape[1], *node.inputs[1].type.shape[2:]
    oh, ow = node.outputs[0].type.shape[2:]
    taps, rows = kh * kw, m * kh * kw
    vw = shape.vw
    assert shape.mr % 2 == 0, "the rows of a tap pair must share a tile"
    # Lane i of the two halves: (a[0], b[0], a[1], b[1], ...) from a = row dj=0, b = row dj=1.
    low = [i // 2 + (vw if i % 2 else 0) for i in range(vw)]
    high = [vw // 2 + i for i in low]
    table = offsets_global(b.module, [ci * h * wd for ci in range(c)])

    def row_init(f):
        return b.load(b.gep(bias[0], [b.udiv(f, i64(taps))]))

    def store_tile(bb, tile_rows, m0, n0, valid: int):
        iy, ix0 = bb.udiv(n0, i64(wd)), bb.urem(n0, i64(wd))
        for i in range(0, len(tile_rows), 2):
            f = bb.add(m0, i64(i))
            chan, di = bb.udiv(f, i64(taps)), bb.urem(bb.udiv(f, i64(kw)), i64(kh))
            # Output pixel (KH * iy + di, 2 * ix0) of channel chan, in the [OH * OW] plane.
            pix0 = bb.add(bb.mul(bb.add(bb.mul(iy, i64(kh)), di), i64(ow)), bb.mul(ix0, i64(2)))
            for j, (a, c1) in enumerate(zip(tile_rows[i], tile_rows[i + 1])):
                lanes = 2 * min(valid - j * vw, vw)
                for half, order in enumerate((low, high)):
                    count = min(lanes - half * vw, vw)
                    if count <= 0:
                        continue
                    v = bb.shuffle_vector(a, c1, ir.Constant(ir.VectorType(ir.IntType(32), vw), order))
                    pix = bb.add(pix0, i64((2 * j + half) * vw))
                    if k.epilogue is not None:
                        k.epilogue(bb, v, img, chan, pix, count)
                    else:
                        out = bb.gep(y, [bb.add(bb.mul(bb.add(bb.mul(img, i64(m)), chan), i64(oh * ow)), pix)])
                        vstore(bb, v, out, vw, count if count < vw else None)

    with for_range(b, n_img, name="img") as img:
        xs = b.gep(x, [b.mul(img, i64(c * h * wd))])
        emit_gemm(b, shape, rows, h * wd, c, w, rows, xs, None, None, None,
                  row_init=row_init if bias is not None else None, name="ctg",
                  a_packed=k.packed == "a", a_transposed=k.packed != "a", split=k.split,
                  b_table=(table, h, wd, wd), store_tile=store_tile)
