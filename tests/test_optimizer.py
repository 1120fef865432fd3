"""The optimizer: generic passes shown on the textual form, the pipeline and its reports,
provenance, backend-aware lowering, and BatchNorm folding on ResNet-50."""
from __future__ import annotations

import json
from textwrap import dedent

import numpy as np
import onnx
import pytest
from onnx import helper

import glowgen
from glowgen import api, pipeline
from glowgen.cli import main as cli_main
from glowgen.engine.graph import Constant
from glowgen.engine.passes import Pass, PassContext, Phase, run_pipeline
from glowgen.engine.registry import Registry
from glowgen.engine.textual import parse_function, print_function
from glowgen.errors import UnsupportedError

from conftest import assert_close, make_model, require_bench_dir, run_ort

rng = np.random.default_rng(11)


def f32(*shape):
    return rng.uniform(-2, 2, size=shape).astype(np.float32)


def _run_passes(text: str, *names: str) -> str:
    """Parse `text`, run the named generic passes once each, print the result."""
    registry = Registry.default()
    fn = parse_function(dedent(text), registry)
    ctx = pipeline.make_context(registry)
    run_pipeline(fn, (Phase("test", tuple(Pass(n) for n in names)),), ctx)
    return print_function(fn)


# ----------------------------------------------------------------------------- generic passes
def test_cse_merges_two_identical_subgraphs():
    after = _run_passes("""\
        graph g {
          input %x: f32[2, 3]
          const %c: f32[3] = dense<[1.0, 2.0, 3.0]>
          const %d: f32[3] = dense<[1.0, 2.0, 3.0]>
          %a1 = Add(%x, %c) : f32[2, 3]
          %e1 = Exp(%a1) : f32[2, 3]
          %a2 = Add(%d, %x) : f32[2, 3]
          %e2 = Exp(%a2) : f32[2, 3]
          %y = Mul(%e1, %e2) : f32[2, 3]
          output "y" = %y
        }
        """, "cse")
    # %d equals %c, and Add is commutative: the second branch is the first.
    assert after == dedent("""\
        graph g {
          input %x: f32[2, 3]
          const %c: f32[3] = dense<[1.0, 2.0, 3.0]>
          %a1 = Add(%x, %c) : f32[2, 3]
          %e1 = Exp(%a1) : f32[2, 3]
          %y = Mul(%e1, %e1) : f32[2, 3]
          output "y" = %y
        }
        """)


def test_cse_keeps_operand_order_of_non_commutative_ops():
    text = """\
        graph g {
          input %x: f32[3]
          input %z: f32[3]
          %s1 = Sub(%x, %z) : f32[3]
          %s2 = Sub(%z, %x) : f32[3]
          %y = Mul(%s1, %s2) : f32[3]
          output "y" = %y
        }
        """
    assert _run_passes(text, "cse") == dedent(text)


def test_dce_removes_an_unused_branch():
    after = _run_passes("""\
        graph g {
          input %x: f32[4]
          const %unused: f32[4] = splat<2.0>
          %r = Relu(%x) : f32[4]
          %dead1 = Exp(%x) : f32[4]
          %dead2 = Mul(%dead1, %unused) : f32[4]
          output "y" = %r
        }
        """, "dce")
    assert after == dedent("""\
        graph g {
          input %x: f32[4]
          %r = Relu(%x) : f32[4]
          output "y" = %r
        }
        """)


def test_constant_folding_removes_a_subgraph_of_constants():
    after = _run_passes("""\
        graph g {
          input %x: f32[2]
          const %a: f32[2, 3] = dense<[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]>
          %t = Transpose(%a) {perm = [1, 0]} : f32[3, 2]
          %s = Slice(%t) {starts = [1, 0], stops = [3, 2], steps = [1, 1]} : f32[2, 2]
          %r = ReduceSum(%s) {axes = [0], keepdims = 0} : f32[2]
          %y = Add(%x, %r) : f32[2]
          output "y" = %y
        }
        """, "fold")
    assert after == dedent("""\
        graph g {
          input %x: f32[2]
          const %r: f32[2] = dense<[5.0, 11.0]>
          %y = Add(%x, %r) : f32[2]
          output "y" = %y
        }
        """)


def test_constant_folding_does_not_materialize_huge_broadcasts():
    text = """\
        graph g {
          input %x: f32[512, 512]
          %big = Splat() {dims = [512, 512], value = 3.0, dtype = "f32"} : f32[512, 512]
          %y = Mul(%x, %big) : f32[512, 512]
          output "y" = %y
        }
        """
    assert "Splat" in _run_passes(text, "fold")
    # A result no larger than a constant it reads does fold (scaled weights, for instance).
    after = _run_passes("""\
        graph g {
          input %x: f32[2]
          const %w: f32[300, 300] = splat<2.0>
          %n = Neg(%w) : f32[300, 300]
          %s = ReduceSum(%n) {axes = [], keepdims = 0} : f32[]
          %y = Add(%x, %s) : f32[2]
          output "y" = %y
        }
        """, "fold")
    assert "Neg" not in after and "const %s: f32[] = dense<[-180000.0]>" in after


# ----------------------------------------------------------------------------- the pipeline
def _conv_bn_model():
    x = f32(1, 3, 6, 6)
    consts = {"w": f32(4, 3, 3, 3), "s": rng.uniform(0.5, 2, 4).astype(np.float32), "b": f32(4),
              "m": f32(4), "v": rng.uniform(0.5, 2, 4).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"], name="bn1"),
             helper.make_node("Relu", ["n"], ["y"], name="relu1")]
    return make_model(nodes, {"x": x}, ["y"], consts), {"x": x}


def test_conv_batchnorm_folds_and_keeps_both_origins(tmp_path, capsys):
    model, feeds = _conv_bn_model()
    fn = api.load(model)
    api.optimize(fn, stage="optimized")
    assert [n.OP for n in fn.nodes] == ["Conv", "Relu"]
    conv = fn.nodes[0]
    assert conv.origin == ("conv1", "bn1")
    assert conv.rules == ("conv_bias_zero", "conv_batchnorm_fold")
    assert_close(glowgen.compile(model).run(feeds), run_ort(model, feeds), rtol=1e-4, atol=1e-5)

    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    assert cli_main(["dump", str(path), "--stage", "optimized", "--trace"]) == 0
    assert "# from conv1, bn1 via conv_bias_zero, conv_batchnorm_fold" in capsys.readouterr().out


def test_dump_rules_counts_each_rule(tmp_path, capsys):
    model, _ = _conv_bn_model()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    assert cli_main(["dump", str(path), "--stage", "optimized", "--rules"]) == 0
    counts = dict(line.rsplit(None, 1) for line in capsys.readouterr().out.splitlines())
    assert counts == {"conv_bias_zero": "1", "conv_batchnorm_fold": "1", "total": "2"}


def test_dump_passes_prints_the_pipeline(tmp_path, capsys):
    model, _ = _conv_bn_model()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    assert cli_main(["dump", str(path), "--passes"]) == 0
    out = capsys.readouterr().out
    assert "1. canonicalize (to a fixpoint): rules [canonicalize], dead-code elimination, " \
           "common-subexpression elimination, constant folding" in out
    assert "2. quantize (to a fixpoint): rules [quantize]" in out
    assert "3. lower (once): rules [lower] (except ops the backend implements)" in out
    assert "canonicalize-lowered" in out and "nodes 3 -> 2" in out


def test_passes_and_rules_need_a_stage_that_runs_the_pipeline(tmp_path, capsys):
    model, _ = _conv_bn_model()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    assert cli_main(["dump", str(path), "--stage", "loaded", "--rules"]) == 2
    assert "use them with --stage optimized or --stage lowered" in capsys.readouterr().err


# ----------------------------------------------------------------------------- backend-aware lowering
def _lower_for(model, backend_ops):
    """The full pipeline for a backend that implements `backend_ops`."""
    registry = Registry.default()
    fn = api.load(model)
    ctx = PassContext(registry, frozenset(backend_ops), pipeline.make_context(registry).evaluate)
    run_pipeline(fn, pipeline.PIPELINE, ctx)
    return fn, ctx


def test_ops_the_backend_implements_are_not_lowered():
    x = f32(2, 5) * 4
    model = make_model([helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["s", "x"], ["m"]),
                        helper.make_node("Clip", ["m", "lo", "hi"], ["y"])],
                       {"x": x}, ["y"], {"lo": np.float32(-0.5), "hi": np.float32(2.0)})
    expected = run_ort(model, {"x": x})
    interpreter = pipeline.backend_ops("interpreter", Registry.default())
    assert {"Clip", "Swish"} <= interpreter

    fn, ctx = _lower_for(model, interpreter)
    assert [n.OP for n in fn.nodes] == ["Swish", "Clip"] and ctx.fired["swish_fuse"] == 1
    fn_without, ctx = _lower_for(model, interpreter - {"Clip", "Swish"})
    assert [n.OP for n in fn_without.nodes] == ["Sigmoid", "Mul", "Max", "Min"]
    assert ctx.fired["clip_to_max_min"] == 1 and "swish_fuse" not in ctx.fired
    from glowgen.reference import evaluate
    for f in (fn, fn_without):
        assert_close(evaluate(f, {"x": x}, Registry.default()), expected)


def test_an_op_neither_implemented_nor_lowered_is_named():
    model, _ = _conv_bn_model()
    interpreter = pipeline.backend_ops("interpreter", Registry.default())
    with pytest.raises(UnsupportedError, match="no lowering rule applies to Conv here and the backend "
                                               "does not implement it"):
        _lower_for(model, interpreter - {"Conv"})


# ----------------------------------------------------------------------------- ResNet-50
def _next_to_conv(fn):
    """Nodes that read a Conv's result and are BatchNormalization, or Mul/Add by a constant."""
    bad = []
    for n in fn.nodes:
        for v in n.flat_inputs():
            if v.producer is None or v.producer.OP != "Conv":
                continue
            if n.OP == "BatchNormalization" or (
                    n.OP in ("Mul", "Add", "Sub", "Div") and any(isinstance(o, Constant) for o in n.flat_inputs())):
                bad.append(f"{n.OP} {n.name!r}")
    return bad


@pytest.mark.bench_models
def test_resnet50_keep_bn_optimizes_to_no_more_nodes_than_the_folded_export():
    counts = {}
    for bn in (True, False):
        directory = require_bench_dir(bn)
        manifest = json.loads((directory / "manifest.json").read_text())["resnet50"]
        fn = api.load(directory / manifest["file"])
        loaded = len(fn.nodes)
        api.optimize(fn, stage="optimized")
        ops = {n.OP for n in fn.nodes}
        assert "BatchNormalization" not in ops
        assert not _next_to_conv(fn), _next_to_conv(fn)
        counts[bn] = (loaded, len(fn.nodes))
    print(f"\nResNet-50 nodes, loaded -> optimized: keep-bn {counts[True][0]} -> {counts[True][1]}, "
          f"folded-bn export {counts[False][0]} -> {counts[False][1]}")
    assert counts[True][1] <= counts[False][1]
