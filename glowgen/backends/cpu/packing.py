"""Constant weights repacked at compile time into the layout the GEMM kernel reads.

The register-blocked kernel (gemm.py) computes an MR x NR tile from, at each k, MR scalars of
A (one per row) and NR floats of B.  Row-major A puts those MR scalars K floats apart: MR
cache lines and MR prefetch streams per k.  Packed, they are adjacent:

    A (M x K)  ->  [ceil(M / MR)][K][MR]     rows past M are zero
    B (K x N)  ->  [ceil(N / NR)][K][NR]     columns past N are zero (what im2col writes)

Conv weights are A (or, for a convolution computed transposed, B: conv_transposed.py); a
MatMul's constant right-hand side is B.  A product with fewer rows
than MR (a matrix-vector product) runs wide tiles, up to 16 vectors: its B is packed in
panels that wide, so each tile streams one contiguous panel (row-major, every k would start
a new page for the prefetcher).
The packed buffer replaces the weight in the instruction, which records the layout in
`Instr.packed` ("a" or "b"); the kernels take shapes from the graph node, not the buffer.
"""
from __future__ import annotations

import numpy as np

from ...engine.types import Type
from ...lir.ir import Instr, Program, WeightBuffer


def pack_rows(a: np.ndarray, mr: int) -> np.ndarray:
    """[M, K] -> [ceil(M/MR), K, MR]: for each block of MR rows, column k's MR values together."""
    m, k = a.shape
    blocks = -(-m // mr)
    padded = np.zeros((blocks * mr, k), a.dtype)
    padded[:m] = a
    return np.ascontiguousarray(padded.reshape(blocks, mr, k).transpose(0, 2, 1))


def pack_panels(b: np.ndarray, nr: int) -> np.ndarray:
    """[K, N] -> [ceil(N/NR), K, NR]: NR-wide column panels, each contiguous."""
    k, n = b.shape
    panels = -(-n // nr)
    padded = np.zeros((k, panels * nr), b.dtype)
    padded[:, :n] = b
    return np.ascontiguousarray(padded.reshape(k, panels, nr).transpose(1, 0, 2))


def gemv_panel_width(shape, m: int, n: int) -> int:
    """The width of B's panels for an M-row product: the tile's NR, or for fewer rows than
    MR the wide tile's (gemm.wide_nv), but no wider than N rounded up to a vector."""
    from .gemm import wide_nv
    if m >= shape.mr:
        return shape.nr
    vectors = min(wide_nv(shape, m % shape.mr or shape.mr), -(-n // shape.vw))
    return vectors * shape.vw


def _users(prog: Program) -> dict:
    users: dict[int, int] = {}
    for ins in prog.instrs:
        for _, buf in ins.operands:
            if buf is not None:
                users[id(buf.root())] = users.get(id(buf.root()), 0) + 1
    return users


def _packable(buf, users) -> bool:
    """A constant f32 weight that only this operand reads (so its layout is ours to choose)."""
    root = buf.root() if buf is not None else None
    return (isinstance(root, WeightBuffer) and root.region == "constant" and root.data is not None
            and root.type.dtype == "f32" and users.get(id(root)) == 1 and root.nbytes == buf.nbytes)


def _replace(prog: Program, ins: Instr, buf, data: np.ndarray, layout: str) -> None:
    root = buf.root()
    packed = WeightBuffer(f"{root.name}.packed", Type("f32", (data.size,)), "constant",
                          data=data.reshape(-1))
    prog.weights[prog.weights.index(root)] = packed
    ins.replace(buf, packed)
    ins.packed = layout


def pack_constant_weights(prog: Program, shape, conv_weight_layout) -> int:
    """Repack every constant GEMM operand the kernels can read packed; returns how many.
    `conv_weight_layout(node)` says how a Conv reads its weights: "a" (the GEMM's A, in
    MR-row blocks), "t" (transposed, as the B of a product vectorized along the filters:
    conv_transposed.py) or None (as they are)."""
    users = _users(prog)
    count = 0
    for ins in prog.instrs:
        node = ins.node
        if getattr(ins, "packed", None):            # packed by an earlier build
            continue
        layout = conv_weight_layout(node) if ins.kind == "Conv" else None
        if layout is not None:
            w = ins.operands[2][1]                     # operands: y, x, w[, b]
            if not _packable(w, users):
                continue
            m, cg, kh, kw = node.inputs[1].type.shape
            g = node.group
            data = w.root().data.reshape(g, m // g, cg * kh * kw)
            if layout == "t":
                packed = np.stack([pack_panels(a.T, shape.nr) for a in data])
            else:
                packed = np.stack([pack_rows(a, shape.mr) for a in data])
            _replace(prog, ins, w, packed, layout)
            count += 1
        elif ins.kind == "BatchMatMul" and node.outputs[0].type.dtype == "f32":
            nb, m, k = node.inputs[0].type.shape
            n = node.inputs[1].type.shape[2]
            rhs = ins.operands[2][1]
            if not _packable(rhs, users):
                continue
            width = gemv_panel_width(shape, m, n)
            data = rhs.root().data.reshape(-1, k, n)
            _replace(prog, ins, rhs, np.stack([pack_panels(bm, width) for bm in data]), "b")
            ins.packed_nr = width
            count += 1
    if count:
        prog.place_weights()
    return count
