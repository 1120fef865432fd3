"""The table of scalar functions (glowgen/scalars.py) is the one list: every row has a NumPy
semantics of its arity, the cpu backend emits every row, the spec language accepts exactly
these, and every `extern` primitive has a reference implementation."""
from __future__ import annotations

import inspect

import numpy as np

from glowgen.backends.cpu.scalar import ScalarEmitter
from glowgen.dsl.emit_kernels import KERNEL_FUNCS
from glowgen.engine.registry import Registry
from glowgen.reference.primitives import PRIMITIVES
from glowgen.scalars import SCALAR_FUNCTIONS


def test_every_scalar_function_has_a_cpu_emitter_of_its_arity():
    missing = [n for n in SCALAR_FUNCTIONS if not hasattr(ScalarEmitter, f"f_{n}")]
    assert not missing, f"ScalarEmitter lacks f_{', f_'.join(missing)}"
    for name, row in SCALAR_FUNCTIONS.items():
        params = list(inspect.signature(getattr(ScalarEmitter, f"f_{name}")).parameters)[1:]
        assert len(params) == row.arity, (name, params)


def test_the_spec_language_knows_exactly_the_table():
    assert KERNEL_FUNCS == {n: r.arity for n, r in SCALAR_FUNCTIONS.items()}


def test_increasing_functions_are_increasing_on_a_grid():
    x = np.linspace(-20.0, 20.0, 4001)
    for name, row in SCALAR_FUNCTIONS.items():
        if row.increasing:
            with np.errstate(all="ignore"):
                y = row.numpy(x)
            y = y[~np.isnan(y)]              # outside the function's domain
            assert y.size > 100 and np.all(np.diff(y) >= 0), name


def test_every_extern_primitive_has_a_reference_implementation():
    registry = Registry.default()
    missing = sorted(set(registry.extern) - set(PRIMITIVES))
    assert not missing, f"no reference (NumPy) implementation for extern ops {missing}"
