"""QuantizedMatMul with few rows (a classifier's last layer, an MLP at batch 1): the int8
product of qgemm.py turned around, so that vector lanes run over the output features.

The general product (qlinalg.py) puts the rows of x in the lanes and broadcasts weights: with
one row, 1 lane of 16 or 32 does work.  Here the weights are the vectors and the rows are
broadcast:

    Y[R, N] = X[R, K] @ W[K, N]     W: i8 constant, packed [K / G][Npad] elements of G values
                                    of k (s8 for VNNI, i16 for AVX2); X: the plane qlinalg
                                    builds for a product, [K / G][R] elements

and one tile is all R rows (R <= the product's MR) by NV vectors of output features.  With
VNNI the broadcast activations are the u8 operand of `vpdpbusd` and the weights the s8 one;
the +128 of the activations folds into a per-feature correction as in qgemm.pack_epilogue.
The packed constant: weights, then per feature the i32 correction and the f32 multiplier,
then the result's offset (f32) and the plane's padding element (i32).  Tasks split the
feature tiles, so every sum is computed whole by one task (identical for any thread count).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir

from ..llvmutil import F32, I8, I32, for_range, i64
from ..qgemm import QShape, emit_tile, pack_epilogue, requantize

_ceil = lambda a, b: -(-a // b)     # noqa: E731


def is_gemv(node, qs: QShape) -> bool:
    """A QuantizedMatMul whose rows fit in one tile's broadcast rows."""
    if node.OP != "QuantizedMatMul":
        return False
    rows = int(np.prod(node.inputs[0].type.shape[:-1], dtype=np.int64))
    return rows <= qs.mr


class GemvGeometry:
    def __init__(self, node, qs: QShape):
        self.qs = qs
        *batch, self.c = node.inputs[0].type.shape
        self.n = node.inputs[1].type.shape[1]
        self.rows = int(np.prod(batch, dtype=np.int64))
        self.groups = _ceil(self.c, qs.group)
        self.tiles = _ceil(self.n, qs.nr)
        self.npad = self.tiles * qs.nr
        self.b_bytes = self.groups * self.npad * 4
        self.plane_bytes = _ceil(4 * self.groups * self.rows, 64) * 64
        self.scratch = self.plane_bytes + _ceil(self.rows * self.npad, 64) * 64


def pack(node, w, ws, b, qs: QShape, pad_element: int) -> np.ndarray:
    """The packed constant of the module docstring, as bytes."""
    geo = GemvGeometry(node, qs)
    k, n = w.shape
    g = qs.group
    padded = np.zeros((geo.groups * g, geo.npad), np.int16 if qs.bits == 16 else np.int8)
    padded[:k, :n] = w
    # [KG, G, Npad] -> [KG, Npad, G]: the G values of k of one feature in one element.
    weights = np.ascontiguousarray(padded.reshape(geo.groups, g, geo.npad).transpose(0, 2, 1))
    corr, mult = pack_epilogue(np.ascontiguousarray(w.T).reshape(n, k, 1), ws, b,
                               node.inputs[0].type.quant, node.scale, qs)
    corr_p, mult_p = np.zeros(geo.npad, np.int32), np.zeros(geo.npad, np.float32)
    corr_p[:n], mult_p[:n] = corr[:n], mult[:n]
    tail = [np.array([node.offset], np.float32).view(np.int8), np.array([pad_element], np.int32).view(np.int8)]
    return np.concatenate([weights.view(np.int8).ravel(), corr_p.view(np.int8), mult_p.view(np.int8), *tail])


def emit(b, k, qs: QShape, build_plane):
    """The kernel: the plane of x, the tiles of this task's features, then their columns of
    the result block copied into y (R rows of N)."""
    node = k.node
    geo = GemvGeometry(node, qs)
    (y, _), (x, _), (packed, _) = k.outs[0], k.ins[0], k.ins[1]
    packed = b.bitcast(packed, I8.as_pointer())
    weights = b.bitcast(packed, I32.as_pointer())
    corr = b.bitcast(b.gep(packed, [i64(geo.b_bytes)]), I32.as_pointer())
    mult = b.bitcast(b.gep(packed, [i64(geo.b_bytes + 4 * geo.npad)]), F32.as_pointer())
    tail = geo.b_bytes + 8 * geo.npad
    y_offset = b.load(b.bitcast(b.gep(packed, [i64(tail)]), F32.as_pointer()))
    pad = b.load(b.bitcast(b.gep(packed, [i64(tail + 4)]), I32.as_pointer()))
    scratch = b.bitcast(k.scratch, I8.as_pointer())
    plane = b.bitcast(scratch, I32.as_pointer())
    ys = b.gep(scratch, [i64(geo.plane_bytes)])
    build_plane(b, geo, x, i64(0), plane, pad)
    lo, hi = k.split.range(b, geo.tiles)
    with for_range(b, hi, start=lo, name="gt") as tile:
        n0 = b.mul(tile, i64(qs.nr))

        def store(i, j, sums):
            n = b.add(n0, i64(j * qs.vw))
            cv = b.load(b.bitcast(b.gep(corr, [n]), sums.type.as_pointer()))
            cv.align = 4
            mv = b.load(b.bitcast(b.gep(mult, [n]), ir.VectorType(F32, qs.vw).as_pointer()))
            mv.align = 4
            v = requantize(b, sums, mv, y_offset, corr=cv)
            st = b.store(v, b.bitcast(b.gep(ys, [b.add(i64(i * geo.npad), n)]), v.type.as_pointer()))
            st.align = 1
        emit_tile(b, qs, geo.groups, [0], plane, b.gep(weights, [n0]), geo.npad, store,
                  name="gv", rows=geo.rows, broadcast_u8=True)
    n_lo = b.mul(lo, i64(qs.nr))
    n_hi = b.mul(hi, i64(qs.nr))
    n_hi = b.select(b.icmp_signed("<", n_hi, i64(geo.n)), n_hi, i64(geo.n))
    with for_range(b, geo.rows, name="gr") as r, for_range(b, n_hi, start=n_lo, name="gn") as n:
        v = b.load(b.gep(ys, [b.add(b.mul(r, i64(geo.npad)), n)]))
        b.store(v, b.gep(y, [b.add(b.mul(r, i64(geo.n)), n)]))
