"""Adding an elementwise op takes one line in specs/ops.glowdef, its kernel expression in
specs/cpu_kernels.glowdef, and no Python."""
from __future__ import annotations

import shutil

import numpy as np
from onnx import helper

import glowgen
from glowgen.dsl.regen import DEFAULT_SPEC_DIR, regen
from glowgen.engine.registry import Registry

from conftest import assert_close, make_model, run_ort

# One template line: the op's operand, result, traits come from the Unary template.
SOFTSIGN_OP = '\nop Softsign = Unary(F, "Elementwise x / (1 + |x|).") { onnx Softsign }\n'
SOFTSIGN_KERNEL = "\nkernel Softsign(x) = x / (1 + abs(x))\n"


def test_new_elementwise_op_from_specs_only(tmp_path):
    specs = tmp_path / "specs"
    shutil.copytree(DEFAULT_SPEC_DIR, specs)
    with open(specs / "ops.glowdef", "a") as f:
        f.write(SOFTSIGN_OP)
    with open(specs / "cpu_kernels.glowdef", "a") as f:
        f.write(SOFTSIGN_KERNEL)
    out = tmp_path / "generated"
    regen(specs, out)
    registry = Registry.from_dir(out)
    assert "Softsign" in registry.ops and "Softsign" in registry.kernels

    op = registry.ops["Softsign"]
    assert {"elementwise", "primitive"} <= set(op.TRAITS) and op.INPLACE == (("y", "x"),)

    x = np.random.default_rng(3).uniform(-5, 5, (3, 7)).astype(np.float32)
    model = make_model([helper.make_node("Softsign", ["x"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
                       {"x": x}, ["y"])
    for engine in ("cpu", "interpreter"):
        actual = glowgen.compile(model, registry=registry, backend=engine).run({"x": x})
        # NumPy oracle of the definition, and onnxruntime's Softsign.
        np.testing.assert_allclose(actual["y"], np.maximum(x / (1 + np.abs(x)), 0), rtol=1e-6, atol=1e-7)
        assert_close(actual, run_ort(model, {"x": x}))
    # The built-in registry does not know the op: the temporary specs really were used.
    assert "Softsign" not in Registry.default().ops


def test_rules_that_undo_each_other_are_named(tmp_path):
    from glowgen.errors import RewriteError
    specs = tmp_path / "specs"
    shutil.copytree(DEFAULT_SPEC_DIR, specs)
    with open(specs / "lowerings.glowdef", "a") as f:
        f.write("\nrule exp_to_neg [canonicalize]:\n  Exp(x) => Neg(Neg(Exp(x)))\n"
                "\nrule neg_neg [canonicalize]:\n  Neg(Neg(y)) => y\n")
    out = tmp_path / "generated"
    regen(specs, out)
    registry = Registry.from_dir(out)
    x = np.ones((2,), np.float32)
    model = make_model([helper.make_node("Exp", ["x"], ["y"])], {"x": x}, ["y"])
    import pytest
    with pytest.raises(RewriteError) as e:
        glowgen.compile(model, registry=registry)
    assert "did not converge" in str(e.value) and "exp_to_neg" in str(e.value)
