"""Strided loop nests: one loop per (collapsed) dimension, each operand read or written
through an index map (element strides, 0 for a broadcast dimension, plus an offset).

Elementwise stacks, broadcasts, transposes, slices and concatenations are all this one
loop nest with different index maps, which is how XLA's elemental emitter sees them too.
"""
from __future__ import annotations

import math
import zlib
from typing import Callable, Iterable, Sequence

import numpy as np

from llvmlite import ir

from .llvmutil import for_range, i64
from .parallel import FLAT_ALIGN, WHOLE, Split, Work


class Indexed:
    """An index map entry that reads through a table: index i of the dimension is element
    `table[i] * stride` (a Gather with constant indices read by a stack, stacking.py).  Such
    a dimension is never merged with a neighbour, and its loop is never vectorized: with
    AVX-512, LLVM widened det_fpn's nearest-upsampling rows (Gather+Add [1, 96, 40, 40]: the
    40 columns fully unrolled, then the table's loop) into gathers and scatters, 17 times
    as slow as AVX2's row copies (0.455 against 0.027 Mcycles)."""

    def __init__(self, table: tuple, stride: int):
        self.table, self.stride = tuple(int(t) for t in table), int(stride)

    def __bool__(self):
        return True

    def __repr__(self):
        return f"Indexed({len(self.table)} entries, stride {self.stride})"

    def global_table(self, module: ir.Module) -> ir.GlobalVariable:
        """The table as an internal constant i32 array of `module` (one per distinct table)."""
        data = np.asarray(self.table, np.int32)
        name = f"gather_table_{len(self.table)}_{zlib.crc32(data.tobytes()):08x}"
        if name in module.globals:
            return module.globals[name]
        ty = ir.ArrayType(ir.IntType(32), len(self.table))
        g = ir.GlobalVariable(module, ty, name=name)
        g.initializer = ir.Constant(ty, [int(t) for t in self.table])
        g.global_constant = True
        g.linkage = "internal"
        return g

    def offset(self, b: ir.IRBuilder, idx: ir.Value) -> ir.Value:
        g = self.global_table(b.module)
        entry = b.load(b.gep(g, [ir.Constant(ir.IntType(32), 0), idx]))
        return b.mul(b.sext(entry, ir.IntType(64)), i64(self.stride))


def _step(b: ir.IRBuilder, off, idx, m):
    """An operand's offset advanced by index `idx` of a dimension with map entry `m`."""
    if isinstance(m, Indexed):
        return b.add(off, m.offset(b, idx))
    return b.add(off, b.mul(idx, i64(m))) if m else off


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


def broadcast_strides(shape: Sequence[int], out_shape: Sequence[int]) -> tuple[int, ...]:
    """Strides that read an operand of `shape` at the indices of `out_shape` (NumPy rules)."""
    own = contiguous_strides(shape)
    pad = len(out_shape) - len(shape)
    out = []
    for i, d in enumerate(out_shape):
        j = i - pad
        out.append(0 if j < 0 or shape[j] == 1 else own[j])
    return tuple(out)


def collapse(shape: Sequence[int], maps: Sequence[Sequence[int]]) -> tuple[list, list]:
    """Merge adjacent dimensions that every index map walks as one (fewer, longer loops,
    and a long contiguous innermost loop for the vectorizer)."""
    shape = list(shape)
    maps = [list(m) for m in maps]
    i = len(shape) - 2
    while i >= 0:
        outer, inner = shape[i], shape[i + 1]
        if inner == 1 or outer == 1 or all(
                not isinstance(m[i], Indexed) and not isinstance(m[i + 1], Indexed) and m[i] == m[i + 1] * inner
                for m in maps):
            for m in maps:
                m[i] = m[i] if inner == 1 else m[i + 1]
                del m[i + 1]
            shape[i] = outer * inner
            del shape[i + 1]
        i -= 1
    if not shape:
        shape, maps = [1], [[0] for _ in maps]
    return shape, maps


def loop_work(shape: Sequence[int], maps: Sequence[Sequence[int]], cost: float = 1.0) -> Work:
    """What the loop nest strided_loops / blocked_loops runs offers a split (parallel.py):
    its outermost (collapsed) loop's iterations, or a flat loop's groups of FLAT_ALIGN."""
    shape, _ = collapse(shape, maps)
    elements = math.prod(shape)
    items = shape[0] if len(shape) > 1 else -(-shape[0] // FLAT_ALIGN)
    return Work(items, elements=elements * cost)


def _outer_range(b, extent: int, rank: int, split: Split, align: int):
    """The bounds of the outermost loop for `split`'s share: whole iterations of an outer
    dimension, or runs of `align` elements of a flat loop."""
    return split.range(b, extent, align if rank == 1 else 1)


def strided_loops(b: ir.IRBuilder, shape: Sequence[int], bases: Sequence, maps: Sequence[Sequence[int]],
                  offsets: Sequence[int], body: Callable[[ir.IRBuilder, list], None],
                  name: str = "d", split: Split = WHOLE) -> None:
    """Loop over `shape`; call `body(b, ptrs)` with each operand's element pointer.  With a
    `split`, only its share of the outermost loop."""
    shape, maps = collapse(shape, maps)

    def level(d: int, offs: list):
        if d == len(shape):
            body(b, [b.gep(base, [off]) for base, off in zip(bases, offs)])
            return
        lo, hi = ((0, shape[d]) if d or split.whole else
                  _outer_range(b, shape[0], len(shape), split, FLAT_ALIGN))
        # A dimension read through a table is not for the vectorizer (Indexed).
        gathered = any(isinstance(m[d], Indexed) for m in maps)
        with for_range(b, hi, start=lo, name=f"{name}{d}", vectorize=not gathered) as idx:
            level(d + 1, [_step(b, off, idx, m[d]) for off, m in zip(offs, maps)])

    level(0, [i64(o) for o in offsets])


def blocked_loops(b: ir.IRBuilder, shape: Sequence[int], bases: Sequence, maps: Sequence[Sequence[int]],
                  block: int, bodies: Iterable[Callable], name: str = "d", split: Split = WHOLE) -> None:
    """Loop over `shape` with the innermost (collapsed) dimension cut into blocks of
    `block` elements; within each block, run every body in turn over the block's elements:
    `body(b, ptrs, j)` with each operand's element pointer and j, the index in the block.
    `bodies` is consumed as the loops are emitted, so an iterator may choose a body from
    what emitting the ones before it found (handoffs.py).
    The caller checks the innermost dimension is at least one block long."""
    shape, maps = collapse(shape, maps)
    inner = shape[-1]

    def level(d: int, offs: list):
        if d < len(shape) - 1:
            lo, hi = (i64(0), i64(shape[d])) if d or split.whole else split.range(b, shape[0])
            with for_range(b, hi, start=lo, name=f"{name}{d}") as idx:
                level(d + 1, [b.add(off, b.mul(idx, i64(m[d]))) if m[d] else off
                              for off, m in zip(offs, maps)])
            return
        lo, hi = (i64(0), i64(inner)) if len(shape) > 1 or split.whole else split.range(b, inner, block)
        with for_range(b, hi, start=lo, step=block, name=f"{name}blk") as start:
            rest = b.sub(i64(inner), start)
            count = b.select(b.icmp_signed("<", rest, i64(block)), rest, i64(block))
            for k, body in enumerate(bodies):
                with for_range(b, count, name=f"{name}g{k}") as j:
                    idx = b.add(start, j)
                    ptrs = [b.gep(base, [b.add(off, b.mul(idx, i64(m[-1]))) if m[-1] else off])
                            for base, off, m in zip(bases, offs, maps)]
                    body(b, ptrs, j)

    level(0, [i64(0) for _ in bases])


def innermost_extent(shape: Sequence[int], maps: Sequence[Sequence[int]]) -> int:
    """The length of the innermost loop strided_loops / blocked_loops would run."""
    return collapse(shape, maps)[0][-1]
