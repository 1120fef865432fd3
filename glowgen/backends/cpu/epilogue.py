"""Elementwise runs applied in a matrix product's store.

When a stack of elementwise instructions follows a Conv or BatchMatMul over the same
elements (bias, Relu, Clip, the Add of a residual...), the product's kernel applies the
stack to each result vector while it is still in registers, instead of a second pass over
memory.  The product sees its output as [batch, rows, columns]; every other operand of the
stack must be addressable in that space with a unit or zero column stride.

An int8 product (a QuantizedConv storing its runs straight into its output) hands over
runs of i8 lanes, a lane mask computed at run time where a run ends inside it, or single
i8 values: the stack (the QuantizedAdd of a residual) then reads and writes i8 operands
only, as the product's store does, and computes exactly what it computes as a loop of its
own.
"""
from __future__ import annotations

from typing import Optional

from llvmlite import ir

from ...engine.types import numpy_dtype
from ...lir.ir import slot
from .llvmutil import i64
from .kernels import PRODUCT_SPACE
from .loops import broadcast_strides
from .scalar import ScalarEmitter, Value, emit_stack
from ...scalars import SCALAR_FUNCTIONS
from .stacking import Step, has_gathers, stores_needed
from .vectors import masked_load, masked_store, prefetch, splat, vload, vstore

# Scalar functions that work unchanged on vectors (what an epilogue may compute).
VECTOR_SAFE = frozenset(f.name for f in SCALAR_FUNCTIONS.values() if f.vector_safe)


# The element types of products whose kernels store through an epilogue: a stack fused
# into one reads and writes only operands of its product's type.
PRODUCT_TYPES = ("f32", "i8")


def product_space(ins, features: str = "") -> Optional[tuple[int, int, int]]:
    """The [batch, rows, columns] view of a product's result, if its kernel (as its plan has
    it, on a target of these `features`) stores whole vectors of one row through an
    epilogue (kernels/base.PRODUCT_SPACE: GEMM kernels, depthwise convolutions, int8
    products storing straight into their output)."""
    space = PRODUCT_SPACE.get(ins.kind)
    if space is None or ins.plan is None or ins.node.outputs[0].type.dtype not in PRODUCT_TYPES:
        return None
    return space(ins, features)


def _group_strides(shape, strides, space) -> Optional[tuple]:
    """Strides of an operand (over `shape`) in the 3-D space, or None if its index map does
    not factor along the space's boundaries."""
    dims = [(d, s) for d, s in zip(shape, strides) if d != 1]
    out, i = [], 0
    for size in space:
        prod, group = 1, []
        while prod < size and i < len(dims):
            group.append(dims[i])
            prod *= dims[i][0]
            i += 1
        if prod != size:
            return None
        if not group:
            out.append(0)
            continue
        # The group must walk as one dimension: each stride = next stride * next size.
        for (d0, s0), (d1, s1) in zip(group, group[1:]):
            if s0 != s1 * d1:
                return None
        out.append(group[-1][1])
    return tuple(out) if i == len(dims) else None


def _tree_funcs(tree, scalars, seen=None) -> set:
    seen = set() if seen is None else seen
    if tree[0] == "call":
        seen.add(tree[1])
        if tree[1] in scalars:
            _tree_funcs(scalars[tree[1]]["body"], scalars, seen)
        for t in tree[2]:
            _tree_funcs(t, scalars, seen)
    return seen


def can_fuse(producer: Step, stack: Step, registry, features: str = "") -> bool:
    if producer.stacked or not stack.stacked or len(producer.instrs) != 1 or has_gathers(stack):
        return False
    prod = producer.instrs[0]
    space = product_space(prod, features)
    if space is None:
        return False
    size = space[0] * space[1] * space[2]
    shape = stack.shape
    if prod.node.outputs[0].type.size != size or _prod(shape) != size:
        return False
    result = slot(prod.writes()[0])
    if not any(slot(b) == result for ins in stack.instrs for b in ins.reads()):
        return False
    # The product reads its operands while it stores: a stack storing into one of them (a
    # loop's state the product reads, computed into the same buffer) would change what the
    # product reads next.
    read = {slot(b) for b in prod.reads()}
    if any(slot(b) in read for ins in stack.instrs for b in ins.writes()):
        return False
    written = {result}
    dtype = prod.node.outputs[0].type.dtype
    for ins in stack.instrs:
        kern = registry.kernels[ins.kind]
        if not _tree_funcs(kern["body"], registry.scalars) <= VECTOR_SAFE:
            return False
        if ins.node.outputs[0].type.dtype != dtype:
            return False
        for b in ins.reads():
            if slot(b) in written:
                if b.type.shape != shape and b.type.shape != prod.node.outputs[0].type.shape:
                    return False
                continue
            if b.type.dtype != dtype:
                return False
            strides = _group_strides(shape, broadcast_strides(b.type.shape, shape), space)
            if strides is None or strides[2] not in (0, 1):
                return False
        written.update(slot(b) for b in ins.writes())
    return True


def _prod(xs):
    p = 1
    for x in xs:
        p *= x
    return p


def fuse_epilogues(steps: list[Step], registry, features: str = "") -> list[Step]:
    out: list[Step] = []
    for step in steps:
        if out and can_fuse(out[-1], step, registry, features):
            prev = out.pop()
            out.append(Step(prev.instrs + step.instrs, False, epilogue=step))
        else:
            out.append(step)
    return out


class EpilogueEmitter:
    """Builds the `epilogue(b, vec, batch, row, col, valid)` callback of a fused step: `vec`
    holds the product's results for columns col.. of row `row` (a vector, or from an int8
    product a single value), of which `valid` are real: an int (the first `valid` lanes), an
    i1 vector computed at run time (an int8 product's run ending inside it: AVX-512's masked
    loads and stores), or None (all)."""

    def __init__(self, step: Step, prog, life, registry, ptr: dict, vw: int):
        self.step, self.registry, self.ptr, self.vw = step, registry, ptr, vw
        self.prod = step.instrs[0]
        self.stack = step.instrs[1:]
        self.space = product_space(self.prod, prog.plan.features)
        self.shape = step.epilogue.shape
        self.needed = stores_needed(step, prog, life)
        self.dtype = self.prod.node.outputs[0].type.dtype

    def __call__(self, b: ir.IRBuilder, vec, batch, row, col, valid=None) -> None:
        vw = vec.type.count if isinstance(vec.type, ir.VectorType) else None
        em = ScalarEmitter(b, self.registry.scalars, vw)
        _, rows, cols = self.space
        flat = b.add(b.mul(b.add(b.mul(batch, i64(rows)), row), i64(cols)), col)
        if isinstance(valid, int):
            valid = valid if vw is not None and valid < vw else None
        current = {slot(self.prod.writes()[0]): Value(vec, self.dtype)}
        loaded = {}

        def load(buf):
            if id(buf) not in loaded:
                loaded[id(buf)] = self._load(b, buf, batch, row, col, vw, valid)
            return loaded[id(buf)][0]

        streams = {}             # the runs this call reads and writes along a row: base -> (at, written)
        emit_stack(em, self.stack, self.registry.kernels, current, load)
        for key, (_, p) in loaded.items():
            if p is not None:
                streams[id(self.ptr[key])] = (p, False)
        for ins, need in zip(self.step.instrs, self.needed):
            if need:
                buf = ins.writes()[0]
                p = b.gep(self.ptr[id(buf)], [flat])
                streams[id(self.ptr[id(buf)])] = (p, True)
                self._store(b, current[slot(buf)].v, p, vw, valid)
        if vw is not None:
            ahead = i64(PREFETCH_AHEAD * 4 // numpy_dtype(self.dtype).itemsize)
            for p, written in streams.values():
                prefetch(b, b.gep(p, [ahead]), written)

    def _load(self, b, buf, batch, row, col, vw, valid):
        """(the vector (or value) of `buf` at (batch, row, col), its address if it runs along
        the row)"""
        sb, sm, sn = _group_strides(self.shape, broadcast_strides(buf.type.shape, self.shape), self.space)
        off = b.add(b.add(b.mul(batch, i64(sb)), b.mul(row, i64(sm))), b.mul(col, i64(sn)))
        p = b.gep(self.ptr[id(buf)], [off])
        if sn == 0 or vw is None:
            v = b.load(p)
            return Value(splat(b, v, vw) if vw is not None else v, self.dtype), (p if sn else None)
        if self.dtype == "f32":
            return Value(vload(b, p, vw, valid), "f32"), p
        vty = ir.VectorType(p.type.pointee, vw)
        if valid is None:
            ld = b.load(b.bitcast(p, vty.as_pointer()))
            ld.align = 1
            return Value(ld, self.dtype), p
        return Value(masked_load(b, p, valid, ir.Constant(vty, [0] * vw)), self.dtype), p

    def _store(self, b, v, p, vw, valid) -> None:
        if vw is None:
            b.store(v, p)
        elif self.dtype == "f32":
            vstore(b, v, p, vw, valid)
        elif valid is None:
            st = b.store(v, b.bitcast(p, v.type.as_pointer()))
            st.align = 1
        else:
            masked_store(b, v, p, valid)


# Floats ahead of each row run an epilogue reads or writes that it prefetches (4 cache lines):
# a product's tiles store a few vectors of each of MR rows, MR or more runs at once, which
# the hardware prefetcher followed badly.  ResNet-50's 64 -> 256 1x1 convolutions at 56 x 56
# with the residual Add (written over the residual, lir.passes.reuse_in_place): 1.12 -> 0.97,
# 0.97 -> 0.94, 1.09 -> 0.94 ms, as fast as the one without the Add (0.96); 256 -> 128 with
# a Relu only 1.92 -> 1.85 ms (Zen 4, 1 thread, each its fastest of 150 runs); MobileNetV2,
# tiny_bert and ResNet-18, no change.  128 and 256 floats ahead measured no better.
PREFETCH_AHEAD = 64
