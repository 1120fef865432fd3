"""How a split step shares out its items (backends/cpu/parallel.Split.range), compiled and
run: the tasks' shares cover [0, extent) once each, in order, and `short_first` puts the
short share first (where the last item is only partly work: with an alignment of 1) and
otherwise changes nothing."""
from __future__ import annotations

import ctypes

import llvmlite.binding as llvm
import pytest
from llvmlite import ir

from glowgen.backends.cpu.jit import optimize, target_machine
from glowgen.backends.cpu.llvmutil import I64
from glowgen.backends.cpu.parallel import Split


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
