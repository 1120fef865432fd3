"""How a split step shares out its items (backends/cpu/parallel.Split.range), compiled and
run: the tasks' shares cover [0, extent) once each, in order, and `short_first` puts the
short share first (where the last item is only partly work: with an alignment of 1) and
otherwise changes nothing.  Tasks claiming their items (parallel.for_claimed) take their own
share first and the others' from the back."""
from __future__ import annotations

import ctypes

import llvmlite.binding as llvm
import pytest
from llvmlite import ir

from glowgen.backends.cpu.jit import optimize, target_machine
from glowgen.backends.cpu.llvmutil import I64
from glowgen.backends.cpu.parallel import Split, for_claimed
from glowgen.backends.cpu.plan import claim_bytes


def _shares(extent: int, parts: int, align: int, short_first: bool) -> list[tuple[int, int]]:
    """[(lo, hi)] of each task, from the IR Split.range emits."""
    m = ir.Module("split_test")
    fn = ir.Function(m, ir.FunctionType(ir.VoidType(), [I64, I64.as_pointer()]), "share")
    index, out = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    lo, hi = Split(index, parts).range(b, extent, align, short_first=short_first)
    b.store(lo, out)
    b.store(hi, b.gep(out, [ir.Constant(I64, 1)]))
    b.ret_void()
    tm = target_machine()
    engine = llvm.create_mcjit_compiler(optimize(str(m), tm), tm)
    engine.finalize_object()
    share = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64))(engine.get_function_address("share"))
    result = []
    for i in range(parts):
        pair = (ctypes.c_int64 * 2)()
        share(i, pair)
        result.append((pair[0], pair[1]))
    return result


@pytest.mark.parametrize("parts", [2, 3, 5])
@pytest.mark.parametrize("align", [1, 4])
def test_shares_cover_every_item_once_in_order(parts, align):
    for extent in (1, 2, 7, 13, 25, 64):
        plain = _shares(extent, parts, align, False)
        assert all(lo % align == 0 for lo, hi in plain if hi > lo), (extent, plain)
        first = _shares(extent, parts, 1, True)
        for shares in (plain, first):
            items = [i for lo, hi in shares for i in range(lo, hi)]
            assert items == list(range(extent)), (extent, shares)
        sizes = [hi - lo for lo, hi in first]
        assert sizes == sorted(sizes), (extent, first)           # the short shares first
        if align == 1:
            assert sorted(sizes) == sorted(hi - lo for lo, hi in plain), (extent, plain, first)


def test_short_first_gives_the_ragged_last_item_to_the_task_with_fewest():
    # 25 blocks of rows (the last of half a block) between two tasks: 12 and 13, not 13 and 12.
    assert _shares(25, 2, 1, True) == [(0, 12), (12, 25)]
    assert _shares(25, 2, 1, False) == [(0, 13), (13, 25)]


def _claimer(total: int, parts: int):
    """claim(task, words, log): runs for_claimed's IR for task `task` of `parts` over
    [0, total), appending each run it claims, (lo, hi), to `log` (its first i64 the count)."""
    m = ir.Module("claim_test")
    p64 = I64.as_pointer()
    fn = ir.Function(m, ir.FunctionType(ir.VoidType(), [I64, p64, p64]), "claim")
    index, words, log = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))

    def body(lo, hi):
        count = b.load(log)
        at = b.add(b.mul(count, ir.Constant(I64, 2)), ir.Constant(I64, 1))
        b.store(lo, b.gep(log, [at]))
        b.store(hi, b.gep(log, [b.add(at, ir.Constant(I64, 1))]))
        b.store(b.add(count, ir.Constant(I64, 1)), log)
    for_claimed(b, words, total, Split(index, parts), body)
    b.ret_void()
    tm = target_machine()
    engine = llvm.create_mcjit_compiler(optimize(str(m), tm), tm)
    engine.finalize_object()
    fn_t = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64))
    claim = fn_t(engine.get_function_address("claim"))
    claim.engine = engine                       # kept alive with the function

    def run(task, words):
        log = (ctypes.c_int64 * (2 * total + 2))()
        claim(task, words, log)
        return [(log[1 + 2 * i], log[2 + 2 * i]) for i in range(log[0])]
    return run


@pytest.mark.parametrize("parts", [2, 3, 9])
def test_claims_take_the_own_share_first_then_steal_from_the_back(parts):
    """parallel.for_claimed: a task alone claims every item once: its own share (Split.range)
    from the front, halving, then every other share's items from the back; the tasks
    after it find nothing left; the claim words (zeroed) span whole cache lines."""
    for total in (1, 5, 13, 98):
        run = _claimer(total, parts)
        chunk = Split(None, parts).chunk(total)
        for first in range(parts):
            words = (ctypes.c_int64 * (claim_bytes(parts) // 8))()
            assert claim_bytes(parts) % 64 == 0 and claim_bytes(parts) >= 8 * parts
            runs = run(first, words)
            assert sorted(i for lo, hi in runs for i in range(lo, hi)) == list(range(total)), (total, runs)
            own_lo, own_hi = min(first * chunk, total), min((first + 1) * chunk, total)
            own = [r for r in runs if own_lo <= r[0] < own_hi]
            assert runs[:len(own)] == own, runs                             # own share first,
            assert [lo for lo, _ in own] == sorted(lo for lo, _ in own)     # from its front
            if own:
                assert own[0] == (own_lo, own_lo + (own_hi - own_lo + 1) // 2)
            stolen = runs[len(own):]                                        # then the others'
            for j, (lo, hi) in enumerate(stolen):                           # from their back
                assert not [r for r in stolen[j + 1:] if r[0] // chunk == lo // chunk and r[0] > lo], runs
            for other in range(parts):
                assert run(other, words) == []
