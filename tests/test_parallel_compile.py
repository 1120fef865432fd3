"""A model's code emitted and compiled by several processes (parallel_compile.py): the same
bits as one process for any count, with threads, profiles and int8 kernels; a helper that
fails loses nothing; the options are checked; views of the whole module need one process."""
from __future__ import annotations

import os

import numpy as np
import pytest
from onnx import helper

import glowgen
from glowgen.backends.cpu import parallel_compile
from glowgen.errors import GlowgenError

from conftest import make_model, run_ort

RNG = np.random.default_rng(5)


def _w(*shape, scale=0.2):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _residual_cnn():
    """Two residual blocks of the same shapes (twin step functions), a pooling, a wider
    convolution, a global pooling and a classifier: more steps than MIN_STEPS."""
    nodes, inits, x = [], {}, "x"
    for k in range(2):
        for j in range(2):
            inits[f"w{k}{j}"], inits[f"b{k}{j}"] = _w(8, 8, 3, 3), _w(8)
            nodes.append(helper.make_node("Conv", [x if j == 0 else f"r{k}0", f"w{k}{j}", f"b{k}{j}"],
                                          [f"c{k}{j}"], pads=[1, 1, 1, 1]))
            if j == 0:
                nodes.append(helper.make_node("Relu", [f"c{k}0"], [f"r{k}0"]))
        nodes += [helper.make_node("Add", [f"c{k}1", x], [f"s{k}"]),
                  helper.make_node("Tanh", [f"s{k}"], [f"t{k}"])]
        x = f"t{k}"
    inits.update(wp=_w(16, 8, 3, 3), bp=_w(16), fc=_w(16, 10), fb=_w(10))
    nodes += [helper.make_node("MaxPool", [x], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
              helper.make_node("Conv", ["p", "wp", "bp"], ["q"], pads=[1, 1, 1, 1]),
              helper.make_node("Sigmoid", ["q"], ["g"]),
              helper.make_node("Mul", ["q", "g"], ["h"]),
              helper.make_node("GlobalAveragePool", ["h"], ["a"]),
              helper.make_node("Flatten", ["a"], ["f"]),
              helper.make_node("MatMul", ["f", "fc"], ["m"]),
              helper.make_node("Add", ["m", "fb"], ["y"]),
              helper.make_node("Softmax", ["y"], ["z"])]
    return make_model(nodes, {"x": np.zeros((1, 8, 18, 18), np.float32)}, ["y", "z"], inits)


MODEL = _residual_cnn()


def _feeds():
    return {"x": RNG.standard_normal((1, 8, 18, 18)).astype(np.float32)}


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.parametrize("threads", [1, 2])
def test_any_number_of_processes_gives_the_same_bits(threads):
    feeds = _feeds()
    one = glowgen.compile(MODEL, threads=threads, compile_processes=1)
    assert one._runner.compile_processes == 1
    want = one.run(feeds)
    ort = run_ort(MODEL, feeds)
    for name in want:
        np.testing.assert_allclose(want[name], ort[name], rtol=1e-4, atol=1e-5, err_msg=name)
    jobs = len(parallel_compile.jobs_of(one.program.plan.steps))
    for processes in (2, 3, 64):
        many = glowgen.compile(MODEL, threads=threads, compile_processes=processes)
        assert many._runner.compile_processes == min(processes, jobs) > 1
        assert many._runner.compile_failures == []
        _same(many.run(feeds), want)


def test_the_default_splits_only_large_programs(monkeypatch):
    import glowgen.backends.cpu as cpu
    monkeypatch.setattr(cpu, "machine_cores", lambda: 4)
    large = glowgen.compile(MODEL)
    functions = [s for s in large.program.plan.steps if not parallel_compile.is_control(s)]
    assert len(functions) >= parallel_compile.MIN_STEPS
    assert large._runner.compile_processes == min(4, len(parallel_compile.jobs_of(large.program.plan.steps)))
    small = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": np.zeros((4, 4), np.float32)}, ["y"])
    assert glowgen.compile(small)._runner.compile_processes == 1


def test_twin_steps_are_one_job():
    compiled = glowgen.compile(MODEL, compile_processes=1)
    steps = compiled.program.plan.steps
    jobs = parallel_compile.jobs_of(steps)
    assert sorted(i for job in jobs for i in job) == [i for i, s in enumerate(steps)
                                                      if not parallel_compile.is_control(s)]
    for job in jobs:
        assert len({parallel_compile.job_key(steps[i]) for i in job}) == 1
    # The residual blocks' steps repeat: some job holds more than one step.
    assert any(len(job) > 1 for job in jobs)


def _exits_at_once(builder, claims, compile_part, out_fd):
    for _ in claims:            # claims jobs, then dies without a word
        pass
    os._exit(3)


def _raises(builder, claims, compile_part, out_fd):
    next(iter(claims))
    raise RuntimeError("a helper's bug")


def _truncated(builder, claims, compile_part, out_fd):
    for _ in claims:
        pass
    os.write(out_fd, b"\x10\x00\x00\x00{\"steps\": [")     # half a header, exit status 0


def _hangs(builder, claims, compile_part, out_fd):
    for _ in claims:
        pass
    import time
    time.sleep(600)


@pytest.mark.parametrize("failure", [_exits_at_once, _raises, _truncated, _hangs])
def test_a_failed_helper_loses_nothing(monkeypatch, failure):
    feeds = _feeds()
    want = glowgen.compile(MODEL, compile_processes=1).run(feeds)
    monkeypatch.setattr(parallel_compile, "_helper", failure)
    monkeypatch.setattr(parallel_compile, "PATIENCE_S", 1.0)
    compiled = glowgen.compile(MODEL, compile_processes=3)
    assert len(compiled._runner.compile_failures) == 2
    _same(compiled.run(feeds), want)


def test_a_profile_counts_the_steps_of_every_process():
    compiled = glowgen.compile(MODEL, compile_processes=3, profile=True, threads=2)
    assert compiled._runner.compile_processes == 3
    compiled.run(_feeds())
    rows = compiled.profile()
    assert rows and all(cycles > 0 for _, cycles in rows), rows


def test_int8_kernels_in_processes_give_the_same_bits():
    samples = [_feeds() for _ in range(4)]
    profile = glowgen.profile(MODEL, samples, bins=64)
    feeds = _feeds()
    want = glowgen.compile(MODEL, quantize=profile, compile_processes=1).run(feeds)
    compiled = glowgen.compile(MODEL, quantize=profile, compile_processes=2)
    assert compiled._runner.compile_processes == 2
    assert any(ins.kind.startswith("Quantized") for ins in compiled.program.instrs)
    _same(compiled.run(feeds), want)


def test_the_environment_sets_the_default(monkeypatch):
    monkeypatch.setenv("GLOWGEN_COMPILE_PROCESSES", "1")
    assert glowgen.compile(MODEL)._runner.compile_processes == 1
    monkeypatch.setenv("GLOWGEN_COMPILE_PROCESSES", "3")
    assert glowgen.compile(MODEL)._runner.compile_processes == 3
    assert glowgen.compile(MODEL, compile_processes=2)._runner.compile_processes == 2
    monkeypatch.setenv("GLOWGEN_COMPILE_PROCESSES", "many")
    with pytest.raises(GlowgenError, match="GLOWGEN_COMPILE_PROCESSES must be a positive integer"):
        glowgen.compile(MODEL)


@pytest.mark.parametrize("value", [0, -2, True, 2.0, "2"])
def test_compile_processes_is_checked(value):
    with pytest.raises(GlowgenError, match="compile_processes must be a positive integer"):
        glowgen.compile(MODEL, compile_processes=value)


def test_whole_module_views_need_one_process(tmp_path, capsys):
    compiled = glowgen.compile(MODEL, compile_processes=2)
    for view in (compiled._runner.assembly, compiled._runner.llvm_ir):
        with pytest.raises(GlowgenError, match="compile_processes=1"):
            view()
    # `glowgen dump --stage llvm` compiles in one process: every step function is there.
    import onnx
    from glowgen.cli import main
    path = tmp_path / "m.onnx"
    onnx.save(MODEL, path)
    assert main(["dump", str(path), "--stage", "llvm"]) == 0
    text = capsys.readouterr().out
    steps = compiled.program.plan.steps
    assert text.count("define ") >= len(parallel_compile.jobs_of(steps))


@pytest.mark.skipif(__import__("shutil").which("gcc") is None, reason="gcc is not installed")
def test_a_bundle_compiled_by_processes_matches_the_jit(tmp_path, monkeypatch):
    """The helpers' bitcode is linked into the bundle's one object, whose only global
    functions are still the entry points; main.c runs it to the JIT's bits."""
    import subprocess
    from test_bundle import build, run_bundle
    codes = []
    objects = parallel_compile.ProcessesBuild.objects

    def counted(self):
        for code in objects(self):
            codes.append(code)
            yield code
        assert not self.failures
    monkeypatch.setattr(parallel_compile.ProcessesBuild, "objects", counted)
    bundle = glowgen.write_bundle(MODEL, tmp_path / "b", name="resid", threads=2, compile_processes=3)
    assert len(codes) == 2 and all(code.startswith(b"BC") for code in codes)     # bitcode
    exe = build(bundle)
    nm = subprocess.run(["nm", "--defined-only", str(bundle.directory / "resid.o")], capture_output=True, text=True)
    if nm.returncode == 0:
        exported = sorted(line.split()[-1] for line in nm.stdout.splitlines() if line.split()[1] == "T")
        assert exported == ["resid", "resid_io", "resid_parallel"]
    feeds = _feeds()
    want = glowgen.compile(MODEL, threads=2, compile_processes=1).run(feeds)
    for threads in ("2", "1"):
        _same(run_bundle(exe, bundle.program, feeds, tmp_path, extra=["--threads", threads]), want)
