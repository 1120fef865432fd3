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
The weight-packing pass (passes.py) asks each kernel which operand it reads packed and how
(kernels/base.PACKING); the packed buffer replaces the weight in the instruction, whose plan
records the layout; the kernels take shapes from the graph node, not the buffer.
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


def weight_users(prog: Program) -> dict:
    """How many operands read each buffer (by the id of its root)."""
    users: dict[int, int] = {}
    for ins in prog.instrs:
        for _, buf in ins.operands:
            if buf is not None:
                users[id(buf.root())] = users.get(id(buf.root()), 0) + 1
    return users


def packable(buf, users) -> bool:
    """A constant f32 weight that only this operand reads (so its layout is ours to choose)."""
    root = buf.root() if buf is not None else None
    return (isinstance(root, WeightBuffer) and root.region == "constant" and root.data is not None
            and root.type.dtype == "f32" and users.get(id(root)) == 1 and root.nbytes == buf.nbytes)


def packed_data(data: np.ndarray, layout: str, shape, nr) -> np.ndarray:
    """`data` ([batch, rows, columns] matrices) in `layout`: "a" in MR-row blocks, "b" in
    `nr`-wide panels, "t" transposed then in NR-wide panels."""
    if layout == "a":
        return np.stack([pack_rows(a, shape.mr) for a in data])
    if layout == "t":
        return np.stack([pack_panels(a.T, shape.nr) for a in data])
    return np.stack([pack_panels(bm, nr) for bm in data])


def pack_weights(prog: Program, ins: Instr, index: int, layout: str, nr, shape, users,
                 matrices=None) -> bool:
    """Replace operand `index` of `ins`, a constant weight, by its packed copy (the
    instruction's plan records the layout); False if the weight cannot be repacked.
    `matrices(data)`: the weight's data as the [batch, rows, columns] matrices to pack, when
    they are not the operand's own view (a convolution's filters, or matrices)."""
    buf = ins.operands[index][1]
    if not packable(buf, users):
        return False
    root = buf.root()
    view = ins.node.inputs[index - len(ins.node.outputs)].type.shape
    if matrices is not None:
        data = matrices(root.data)
    elif len(view) == 4:             # a convolution's filters, group by group: [g, m/g, K]
        m, cg, kh, kw = view
        data = root.data.reshape(ins.node.group, m // ins.node.group, cg * kh * kw)
    else:                            # matrices: [batch, K, N]
        data = root.data.reshape((-1,) + tuple(view[-2:]))
    packed = packed_data(data, layout, shape, nr)
    new = WeightBuffer(f"{root.name}.packed", Type("f32", (packed.size,)), "constant", data=packed.reshape(-1))
    prog.weights[prog.weights.index(root)] = new
    ins.replace(buf, new)
    ins.plan.packed, ins.plan.packed_nr = layout, nr
    return True
