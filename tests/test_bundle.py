"""Ahead-of-time bundles (`glowgen compile`): the object, weights, header and main.c build with
gcc alone and compute, bit for bit, what the JIT computes; the header describes the Program.
Also `glowgen bench` and `glowgen dump --stage llvm|asm` on a tiny model, and the guarantee
that bad inputs never reach native code."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

import glowgen
from glowgen.api import write_bundle
from glowgen.cli import main
from glowgen.errors import InputError
from conftest import ONNX_DATA, REPO, make_model, require_bench_dir

TINY = REPO / "examples" / "tiny_cnn.onnx"

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")


def build(bundle) -> Path:
    """Exactly the command `glowgen compile` prints."""
    cmd = ["gcc", "-O2", "-pthread", "main.c", f"{bundle.name}.o", "-lm", "-o", bundle.name]
    assert bundle.build_command == " ".join(cmd)
    done = subprocess.run(cmd, cwd=bundle.directory, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return bundle.directory / bundle.name


def run_bundle(exe: Path, prog, feeds: dict, tmp: Path, extra=()) -> dict:
    files = []
    for i, (name, w) in enumerate(prog.inputs.items()):
        f = tmp / f"in{i}.bin"
        np.ascontiguousarray(feeds[name]).astype(w.type.np_dtype.newbyteorder("<")).tofile(f)
        files.append(f)
    outs = [tmp / f"out{i}.bin" for i in range(len(prog.outputs))]
    done = subprocess.run([str(exe), *extra] + [str(f) for f in files + outs], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return {name: np.fromfile(f, w.type.np_dtype.newbyteorder("<")).astype(w.type.np_dtype)
            .reshape(w.type.shape) for (name, w), f in zip(prog.outputs.items(), outs)}


def assert_bitwise_equal(actual: dict, expected: dict):
    assert list(actual) == list(expected)
    for k in expected:
        a, e = actual[k], expected[k]
        assert a.shape == e.shape and a.dtype == e.dtype, (k, a.shape, e.shape, a.dtype, e.dtype)
        assert a.tobytes() == e.tobytes(), f"{k}: bundle and JIT differ (max diff " \
                                           f"{np.nanmax(np.abs(a.astype(float) - e.astype(float)))})"


def random_feeds(model, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {}
    for n, t in model.input_types.items():
        if t.dtype.startswith(("i", "u")):
            feeds[n] = rng.integers(-5, 5, t.shape).astype(t.np_dtype)
        else:
            feeds[n] = rng.standard_normal(t.shape).astype(t.np_dtype)
    return feeds


def check_bundle_matches_jit(path, tmp_path, **kw):
    bundle = write_bundle(path, tmp_path / "bundle", **kw)
    exe = build(bundle)
    jit = glowgen.compile(path, backend="cpu", input_shapes=kw.get("input_shapes"))
    feeds = random_feeds(jit)
    assert_bitwise_equal(run_bundle(exe, bundle.program, feeds, tmp_path), jit.run(feeds))
    return bundle, jit


# --------------------------------------------------------------------------- bundle runs
@needs_gcc
@pytest.mark.parametrize("path", [TINY, ONNX_DATA / "light" / "light_squeezenet.onnx"],
                         ids=["tiny_cnn", "light_squeezenet"])
def test_bundle_matches_jit_bit_for_bit(path, tmp_path):
    bundle, _ = check_bundle_matches_jit(path, tmp_path)
    names = sorted(p.name for p in bundle.directory.iterdir())
    assert names == sorted(["main.c", f"{bundle.name}.h", f"{bundle.name}.o",
                            f"{bundle.name}.weights.bin", bundle.name])


@needs_gcc
def test_bench_mlp_bundle_matches_jit_bit_for_bit(tmp_path):
    directory = require_bench_dir()
    manifest = json.loads((directory / "manifest.json").read_text())["mlp"]
    bundle, jit = check_bundle_matches_jit(directory / manifest["file"], tmp_path)
    assert bundle.name == "mlp"
    assert jit.input_types[manifest["input"]].shape == tuple(manifest["input_shape"])


@needs_gcc
def test_bundle_on_threads_matches_the_jit_bit_for_bit(tmp_path):
    """A bundle compiled for 2 threads, run by main.c's POSIX-thread pool with --threads 2
    (and 3, and 1: the entry without a pool), computes what the JIT computes on 2 threads."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 16, 48, 48)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Tanh", ["c"], ["t"]),
             helper.make_node("MaxPool", ["t"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    model = make_model(nodes, {"x": x}, ["y"], {"w": (rng.standard_normal((48, 16, 3, 3)) * 0.1).astype(np.float32),
                                               "b": rng.standard_normal(48).astype(np.float32)})
    bundle = glowgen.write_bundle(model, tmp_path / "b", name="convs", threads=2)
    exe = build(bundle)
    jit = glowgen.compile(model, threads=2)
    assert jit._runner.split_steps, "nothing was split: the test would show nothing"
    expected = jit.run({"x": x})
    for threads in ("2", "3", "1"):
        got = run_bundle(exe, bundle.program, {"x": x}, tmp_path, extra=["--threads", threads])
        assert_bitwise_equal(got, expected)
    done = subprocess.run([str(exe), "--threads", "0"], capture_output=True, text=True)
    assert done.returncode == 1 and "--threads takes a number" in done.stderr


@needs_gcc
@pytest.mark.parametrize("strategy", ["winograd-madd16", "winograd4-madd16", "winograd42-madd16"])
def test_int8_winograd_bundle_on_threads_matches_the_jit(tmp_path, monkeypatch, strategy):
    """A quantized bundle for x86-64-v3 whose 3x3 convolution runs int8 Winograd, F(2x2),
    F(4x4) or F(4x2) (kernels/qwinograd.py: its padded input built in a phase the tasks
    share), computes on main.c's threads what the JIT computes."""
    from glowgen.backends.cpu.kernels import qwinograd
    if strategy != qwinograd.STRATEGY4:
        monkeypatch.setattr(qwinograd, "MAX_TILE_WASTE", 0.0)
    monkeypatch.setattr(qwinograd, "TALL_TILES", strategy == qwinograd.STRATEGY42)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 32, 48, 48)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    model = make_model(nodes, {"x": x}, ["y"], {"w": (rng.standard_normal((64, 32, 3, 3)) * 0.1).astype(np.float32),
                                               "b": rng.standard_normal(64).astype(np.float32)})
    profile = glowgen.profile(model, [{"x": rng.standard_normal(x.shape).astype(np.float32)} for _ in range(4)])
    bundle = glowgen.write_bundle(model, tmp_path / "b", name="qconv", threads=2, cpu="x86-64-v3", quantize=profile)
    assert [i.plan.strategy for i in bundle.program.instrs if i.kind == "QuantizedConv"] == [strategy]
    exe = build(bundle)
    jit = glowgen.compile(model, threads=2, cpu="x86-64-v3", quantize=profile)
    assert jit._runner.split_steps, "nothing was split: the test would show nothing"
    expected = jit.run({"x": x})
    for threads in ("2", "1"):
        assert_bitwise_equal(run_bundle(exe, bundle.program, {"x": x}, tmp_path, extra=["--threads", threads]), expected)


def _odd_names_model():
    """Inputs and outputs whose names are not C identifiers (and collide once made so),
    of two element types."""
    a = np.zeros((2, 3), np.float32)
    n = np.zeros((2, 3), np.int64)
    nodes = [helper.make_node("Add", ["x:0", "x/0"], ["sum.out"]),
             helper.make_node("Mul", ["sum.out", "x:0"], ["y-1"]),
             helper.make_node("Add", ["n", "n"], ["2n"])]
    return make_model(nodes, {"x:0": a, "x/0": a, "n": n}, ["sum.out", "y-1", "2n"])


@needs_gcc
def test_bundle_with_odd_tensor_names_and_integer_tensors(tmp_path):
    model = _odd_names_model()
    path = tmp_path / "odd model.onnx"
    onnx.save(model, path)
    bundle, _ = check_bundle_matches_jit(path, tmp_path)
    assert bundle.name == "odd_model"
    header = (bundle.directory / "odd_model.h").read_text()
    for macro in ("ODD_MODEL_INPUT_x_0_OFFSET", "ODD_MODEL_INPUT_x_0_1_OFFSET", "ODD_MODEL_INPUT_n_OFFSET",
                  "ODD_MODEL_OUTPUT_sum_out_OFFSET", "ODD_MODEL_OUTPUT_y_1_OFFSET",
                  "ODD_MODEL_OUTPUT_2n_OFFSET"):
        assert f"#define {macro} " in header
    assert '#define ODD_MODEL_INPUT_n_ELEM_TYPE "i64"' in header


# --------------------------------------------------------------------------- the header
def _defines(header: str) -> dict[str, str]:
    return dict(re.findall(r"^#define (\w+) (.*?)(?: /\*.*\*/)?$", header, re.M))


def test_header_matches_program(tmp_path):
    bundle = write_bundle(TINY, tmp_path)
    prog = bundle.program
    header = (tmp_path / "tiny_cnn.h").read_text()
    d = _defines(header)
    assert "int tiny_cnn(uint8_t *constant_weights, uint8_t *mutable_weights, uint8_t *activations);" in header
    assert int(d["TINY_CNN_ALIGNMENT"]) == 64
    assert int(d["TINY_CNN_CONSTANT_MEM_SIZE"]) == prog.region_sizes["constant"]
    assert int(d["TINY_CNN_MUTABLE_MEM_SIZE"]) == prog.region_sizes["mutable"]
    assert int(d["TINY_CNN_ACTIVATIONS_MEM_SIZE"]) == prog.region_sizes["activation"]
    assert int(d["TINY_CNN_NUM_INPUTS"]) == len(prog.inputs) == 1
    assert int(d["TINY_CNN_NUM_OUTPUTS"]) == len(prog.outputs) == 1
    for kind, table in (("INPUT", prog.inputs), ("OUTPUT", prog.outputs)):
        for name, w in table.items():
            m = f"TINY_CNN_{kind}_{name}"
            assert int(d[m + "_OFFSET"]) == w.offset
            assert int(d[m + "_SIZE"]) == w.nbytes
            assert int(d[m + "_RANK"]) == len(w.type.shape)
            assert d[m + "_DIMS"] == "{" + ", ".join(map(str, w.type.shape)) + "}"
            assert d[m + "_ELEM_TYPE"] == f'"{w.type.dtype}"'
            assert int(d[m + "_ELEM_SIZE"]) == w.type.np_dtype.itemsize
            assert w.offset % 64 == 0
    # The same layout as the JIT's: one compiler, two ways out.
    jit = glowgen.compile(TINY, backend="cpu")
    assert jit.program.region_sizes == prog.region_sizes
    assert {n: w.offset for n, w in jit.program.inputs.items()} == {n: w.offset for n, w in prog.inputs.items()}
    assert {n: w.offset for n, w in jit.program.outputs.items()} == {n: w.offset for n, w in prog.outputs.items()}
    # The weights file is the JIT's constant region, byte for byte.
    weights = (tmp_path / "tiny_cnn.weights.bin").read_bytes()
    assert weights == jit._runner.constant.tobytes()


@needs_gcc
def test_header_tables_compile_and_agree_with_the_macros(tmp_path):
    bundle = write_bundle(_odd_names_model(), tmp_path, name="odd")
    (tmp_path / "t.c").write_text(r"""
#include <stdio.h>
#include "odd.h"
int main(void) {
  const glowgen_tensor_info *t;
  printf("%d %d %d\n", ODD_CONSTANT_MEM_SIZE, ODD_MUTABLE_MEM_SIZE, ODD_ACTIVATIONS_MEM_SIZE);
  for (t = odd_inputs; t->name; t++) printf("in %s %zu %zu %s %d %lld\n", t->name, t->offset, t->size, t->elem_type, t->rank, (long long)t->dims[0]);
  for (t = odd_outputs; t->name; t++) printf("out %s %zu %zu %s %d %lld\n", t->name, t->offset, t->size, t->elem_type, t->rank, (long long)t->dims[0]);
  return 0;
}
""")
    done = subprocess.run(["gcc", "-Wall", "-Wextra", "-Werror", "-std=c11", "-pedantic", "t.c", "-o", "t"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    out = subprocess.run([str(tmp_path / "t")], capture_output=True, text=True).stdout.splitlines()
    prog = bundle.program
    s = prog.region_sizes
    expected = [f"{s['constant']} {s['mutable']} {s['activation']}"]
    for kind, table in (("in", prog.inputs), ("out", prog.outputs)):
        expected += [f"{kind} {n} {w.offset} {w.nbytes} {w.type.dtype} {len(w.type.shape)} {w.type.shape[0]}"
                     for n, w in table.items()]
    assert out == expected


@needs_gcc
def test_main_c_help_and_bad_files(tmp_path):
    bundle = write_bundle(TINY, tmp_path)
    exe = build(bundle)
    source = (tmp_path / "main.c").read_text()
    assert "gcc -O2 -pthread main.c tiny_cnn.o -lm -o tiny_cnn" in source.split("*/")[0]
    assert "image" in source.split("*/")[0] and "little-endian" in source.split("*/")[0]
    done = subprocess.run([str(exe), "--help"], capture_output=True, text=True)
    assert done.returncode == 0
    assert "image" in done.stdout and "f32[1, 3, 8, 8]" in done.stdout and "768 bytes" in done.stdout
    done = subprocess.run([str(exe)], capture_output=True, text=True)
    assert done.returncode == 1 and "expected 1 input files and 1 output files" in done.stderr
    (tmp_path / "short.bin").write_bytes(b"\0" * 10)
    done = subprocess.run([str(exe), str(tmp_path / "short.bin"), str(tmp_path / "o.bin")],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "needs exactly 768" in done.stderr


# --------------------------------------------------------------------------- the command
def test_compile_command_prints_files_and_build_command(tmp_path, capsys):
    assert main(["compile", str(TINY), "-o", str(tmp_path / "out"), "--name", "net"]) == 0
    out = capsys.readouterr().out
    for f in ("net.o", "net.weights.bin", "net.h", "main.c"):
        assert str(tmp_path / "out" / f) in out
        assert (tmp_path / "out" / f).exists()
    assert "gcc -O2 -pthread main.c net.o -lm -o net" in out


def test_compile_for_another_target_writes_its_object(tmp_path, capsys):
    assert main(["compile", str(TINY), "-o", str(tmp_path), "--target", "aarch64-linux-gnu"]) == 0
    obj = (tmp_path / "tiny_cnn.o").read_bytes()
    assert obj[:4] == b"\x7fELF" and int.from_bytes(obj[18:20], "little") == 183   # EM_AARCH64
    out = capsys.readouterr().out
    assert "aarch64-linux-gnu" in out


@pytest.mark.parametrize("argv, message", [
    (["--target", "no-such-triple"], "unknown target triple 'no-such-triple'"),
    (["--cpu", "bogus"], "--cpu 'bogus' is not a CPU LLVM knows"),
    (["--name", "main"], "would clash with C"),
    (["--name", "9lives"], "is not a C identifier"),
    (["--input-shape", "image=1xq"], "bad shape"),
])
def test_compile_bad_arguments(tmp_path, capsys, argv, message):
    assert main(["compile", str(TINY), "-o", str(tmp_path / "b")] + argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").iterdir())


def test_big_endian_target_gets_big_endian_weights(tmp_path):
    little = write_bundle(TINY, tmp_path / "le", cpu="x86-64-v2")
    big = write_bundle(TINY, tmp_path / "be", triple="powerpc64-linux-gnu")
    le = np.frombuffer((little.directory / "tiny_cnn.weights.bin").read_bytes(), "<f4")
    be = np.frombuffer((big.directory / "tiny_cnn.weights.bin").read_bytes(), ">f4")
    np.testing.assert_array_equal(le, be)
    assert "big-endian" in (big.directory / "tiny_cnn.h").read_text()
    obj = (big.directory / "tiny_cnn.o").read_bytes()
    assert obj[:4] == b"\x7fELF" and obj[5] == 2            # ELFDATA2MSB


def test_compile_to_an_unwritable_place(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert main(["compile", str(TINY), "-o", str(tmp_path / "file")]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err
    assert main(["compile", str(TINY), "-o", str(tmp_path / "file" / "sub")]) == 2
    assert "cannot create output directory" in capsys.readouterr().err


def test_default_name_avoids_c_names(tmp_path):
    from glowgen.backends.cpu.bundle import default_name
    assert default_name("models/resnet-50.v2.onnx") == "resnet_50_v2"
    assert default_name("3net.onnx") == "m_3net"
    assert default_name("main.onnx") == "main_model"
    assert default_name("exp.onnx") == "exp_model"


# --------------------------------------------------------------------------- bench, dump
def test_bench_prints_latencies(capsys):
    assert main(["bench", str(TINY), "--runs", "3", "--warmup", "1", "--threads", "2"]) == 0
    out = capsys.readouterr().out
    assert "compiled in" in out
    assert re.search(r"latency +median [\d.]+ ms +min [\d.]+ ms +p90 [\d.]+ ms", out)
    assert re.search(r"glowgen +backend cpu, .*2 threads", out)
    pytest.importorskip("onnxruntime")
    assert len(re.findall(r"latency +median", out)) == 2
    assert re.search(r"onnxruntime .*2 threads", out)
    assert re.search(r"glowgen / onnxruntime = [\d.]+ .*; fastest runs [\d.]+", out)
    assert "in 3 blocks an engine taken in turn" in out      # --rounds 4, capped at --runs 3
    assert re.search(r"by round +glowgen / onnxruntime = [\d.]+ \(median of 3 rounds' ratios of medians; "
                     r"[\d.]+ to [\d.]+\)", out)


def test_round_ratios_pair_each_block_with_the_one_after_it():
    """The ratio round by round: our block's median over theirs of the same round, sorted; a
    slow stretch of the machine that takes both blocks of a round leaves its ratio alone."""
    from glowgen import cli_bench
    ours = [[1.0, 3.0, 2.0], [10.0, 12.0], [2.0]]
    theirs = [[4.0, 4.0, 5.0], [20.0, 40.0, 30.0], [2.5]]
    want = sorted(np.median(g) / np.median(o) for g, o in zip(ours, theirs))
    assert cli_bench._round_ratios(ours, theirs) == pytest.approx(want)
    assert cli_bench._round_ratios(ours, theirs) == pytest.approx([11 / 30, 2 / 4, 2 / 2.5])


def test_bench_alternates_blocks_of_runs(monkeypatch):
    """`_alternating`: each engine's runs in blocks taken in turn, each engine warmed up before
    its first block, a short warm-up before each later one; every timed run counted once."""
    from glowgen import cli_bench
    monkeypatch.setattr(cli_bench, "BLOCK_PAUSE", 0.0)
    calls = []
    engines = [lambda: calls.append("g"), lambda: calls.append("o")]
    g, o = cli_bench._alternating(engines, runs=10, rounds=3, warmup=1)
    assert [len(block) for block in g] == [len(block) for block in o] == [4, 3, 3]
    assert len(cli_bench._all_runs(g)) == 10
    # warm-up 1 + block of 4; later blocks: BLOCK_WARMUP (capped by --warmup 1) + 3
    assert "".join(calls) == "g" * 5 + "o" * 5 + ("g" * 4 + "o" * 4) * 2
    calls.clear()
    blocks = []
    cli_bench._alternating(engines, runs=2, rounds=5, warmup=0,      # at most one block a run
                           progress=lambda engine, block: blocks.append((engine, block)))
    assert "".join(calls) == "gogo"
    assert blocks == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert cli_bench._block_progress(4) is None          # stderr is no terminal here: quiet


def test_bench_interpreter_without_comparison(capsys):
    assert main(["bench", str(TINY), "--backend", "interpreter", "--compare", "none", "--runs", "3"]) == 0
    out = capsys.readouterr().out
    assert "backend interpreter" in out and "onnxruntime" not in out


def test_bench_bad_arguments(capsys):
    assert main(["bench", str(TINY), "--runs", "0"]) == 2
    assert main(["bench", str(TINY), "--rounds", "0"]) == 2
    assert main(["bench", str(TINY), "--backend", "interpreter", "--no-stacking"]) == 2
    err = capsys.readouterr().err
    assert "--runs must be at least 1" in err and "--no-stacking applies to the cpu backend" in err
    assert "--rounds must be at least 1" in err


@pytest.mark.parametrize("stage, needle", [("asm", r"(?m)^tiny_cnn:\n(.|\n)*\tret"), ("llvm", r"define .*i32 @tiny_cnn\(")])
def test_dump_native_code(stage, needle, capsys):
    assert main(["dump", str(TINY), "--stage", stage]) == 0
    assert re.search(needle, capsys.readouterr().out)
    assert main(["dump", str(TINY), "--stage", stage, "--backend", "interpreter"]) == 2
    assert "only the cpu backend" in capsys.readouterr().err


# --------------------------------------------------------------------------- bad inputs
def test_bad_inputs_never_reach_native_code():
    model = glowgen.compile(TINY, backend="cpu")
    runner = model._runner
    real, calls = runner.jit.fn_io, []

    def native(*args):          # (constant, mutable, activations, io pointer table)
        calls.append(list(args[3]))
        return real(*args)
    runner.jit.fn_io = native
    good = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    bad = [({"image": good[:, :2]}, r"has shape \[1, 2, 8, 8\], expected \[1, 3, 8, 8\]"),
           ({"image": good.reshape(1, 3, 64)}, "has shape"),
           ({"image": good.astype(np.float64)}, r"element type f64 \(float64\), expected f32"),
           ({"image": good.astype(np.int32)}, "expected f32"),
           ({"image": good.astype(np.complex64)}, "element type complex64"),
           ({}, "missing input 'image'"),
           ({"image": good, "extra": good}, "unknown input 'extra'"),
           ([good], "takes a dict")]
    for feeds, message in bad:
        with pytest.raises(InputError, match=message):
            model.run(feeds)
    assert calls == [], "a bad input reached native code"
    expected = model.run({"image": good})
    assert len(calls) == 1
    assert calls[0][0] == good.ctypes.data, "a C-contiguous, aligned input is passed by pointer"
    # Unaligned and strided arrays are copied into contiguous aligned ones, never passed through.
    raw = np.frombuffer(b"\0" + good.tobytes(), np.uint8)[1:].view(np.float32).reshape(good.shape)
    assert raw.ctypes.data % 4 != 0
    strided = np.ascontiguousarray(good[..., ::-1])[..., ::-1]
    for x in (raw, strided, np.asfortranarray(good)):
        assert model.run({"image": x})["probs"].tobytes() == expected["probs"].tobytes()
        assert calls[-1][0] != x.ctypes.data


@needs_gcc
def test_bfloat16_bundle_matches_jit(tmp_path):
    """bf16 tensors cross the C interface as their 16 bits (the header's ELEM_TYPE bf16)."""
    import ml_dtypes
    x = np.zeros((3, 4), ml_dtypes.bfloat16)
    c = np.linspace(-1, 1, 4).astype(ml_dtypes.bfloat16)
    nodes = [onnx.helper.make_node("Add", ["x", "c"], ["s"]), onnx.helper.make_node("Sigmoid", ["s"], ["y"]),
             onnx.helper.make_node("Cast", ["y"], ["z"], to=onnx.TensorProto.FLOAT)]
    path = tmp_path / "bf16.onnx"
    onnx.save(make_model(nodes, {"x": x}, ["y", "z"], {"c": c}), path)
    bundle, _ = check_bundle_matches_jit(path, tmp_path)
    assert '#define BF16_INPUT_x_ELEM_TYPE "bf16"' in (bundle.directory / "bf16.h").read_text()


@needs_gcc
def test_quantized_bundle_matches_jit_bit_for_bit(tmp_path):
    """A bundle compiled with --quantize runs the same int8 program as the JIT."""
    jit = glowgen.compile(TINY, backend="cpu")
    rng = np.random.default_rng(3)
    samples = [{n: rng.standard_normal(t.shape).astype(t.np_dtype) for n, t in jit.input_types.items()}
               for _ in range(4)]
    profile = glowgen.profile(TINY, samples, bins=64)
    profile.save(tmp_path / "p.json")
    bundle = write_bundle(TINY, tmp_path / "bundle", quantize=tmp_path / "p.json")
    quantized = glowgen.compile(TINY, backend="cpu", quantize=profile)
    feeds = random_feeds(quantized)
    got = run_bundle(build(bundle), bundle.program, feeds, tmp_path)
    assert_bitwise_equal(got, quantized.run(feeds))
    assert any(np.abs(got[k] - jit.run(feeds)[k]).max() > 0 for k in got)    # really quantized


# --------------------------------------------------------------------------- shape variants
def _dynamic_batch_model(path: Path) -> Path:
    """Conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm over a batch of dim_param N."""
    rng = np.random.default_rng(11)
    inits = [onnx.numpy_helper.from_array((rng.standard_normal((6, 3, 3, 3)) * 0.3).astype(np.float32), "w"),
             onnx.numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "b"),
             onnx.numpy_helper.from_array(rng.standard_normal((6, 4)).astype(np.float32), "g"),
             onnx.numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "gb")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "g", "gb"], ["y"])]
    graph = helper.make_graph(nodes, "dyn", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 4])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def _run_files(exe: Path, inputs: list, n_outputs: int, tmp: Path, extra=()):
    files = []
    for i, x in enumerate(inputs):
        files.append(tmp / f"vin{i}.bin")
        np.ascontiguousarray(x).astype(x.dtype.newbyteorder("<")).tofile(files[-1])
    outs = [tmp / f"vout{i}.bin" for i in range(n_outputs)]
    done = subprocess.run([str(exe), *extra] + [str(f) for f in files + outs], capture_output=True,
                          text=True, timeout=120)
    return done, outs


@needs_gcc
def test_bundle_of_shape_variants_matches_onnxruntime(tmp_path, capsys):
    """`--input-shape x=.. --input-shape x=..` names the input again: one bundle, one entry per
    batch size, weights shared; main.c picks the variant from the input file's size (or
    --shape) and runs it on 1 or 2 threads; a batch size not in the bundle is refused."""
    import onnxruntime as ort
    path = _dynamic_batch_model(tmp_path / "dyn.onnx")
    batches = (1, 2, 5)
    argv = ["compile", str(path), "-o", str(tmp_path / "b"), "--threads", "2"]
    for n in batches:
        argv += ["--input-shape", f"x={n}x3x8x8"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "3 shape variants" in out and "dyn_v2  x f32[5, 3, 8, 8]" in out
    d = tmp_path / "b"
    cmd = ["gcc", "-O2", "-pthread", "main.c", "dyn.o", "-lm", "-o", "dyn"]
    built = subprocess.run(cmd, cwd=d, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    exe = d / "dyn"
    session = ort.InferenceSession(str(path))
    rng = np.random.default_rng(5)
    for n in batches:
        x = rng.standard_normal((n, 3, 8, 8)).astype(np.float32)
        expected = session.run(None, {"x": x})[0]
        for extra in ([], ["--threads", "2"], ["--shape", f"x={n}x3x8x8"]):
            done, outs = _run_files(exe, [x], 1, tmp_path, extra)
            assert done.returncode == 0, done.stderr
            got = np.fromfile(outs[0], "<f4").reshape(n, 4)
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    # Constants are the same for every batch size: stored once, as in a bundle of one.
    single = write_bundle(path, tmp_path / "one", input_shapes={"x": (1, 3, 8, 8)})
    assert (d / "dyn.weights.bin").stat().st_size == single.program.region_sizes["constant"]
    # A batch the bundle was not compiled for.
    x3 = rng.standard_normal((3, 3, 8, 8)).astype(np.float32)
    done, _ = _run_files(exe, [x3], 1, tmp_path)
    assert done.returncode == 4 and "no variant of dyn takes an input 'x' of that size" in done.stderr
    assert "f32[5, 3, 8, 8]" in done.stderr                     # it lists what the bundle has
    done, _ = _run_files(exe, [x3], 1, tmp_path, ["--shape", "x=3x3x8x8"])
    assert done.returncode == 4 and "no variant of dyn was compiled for the input shapes x[3, 3, 8, 8]" in done.stderr
    done, _ = _run_files(exe, [x3], 1, tmp_path, ["--shape", "y=3x3x8x8"])
    assert done.returncode == 1 and "names no input of dyn" in done.stderr
    done, _ = _run_files(exe, [x3], 1, tmp_path, ["--shape", "x=5x3x8x8"])     # the wrong size for it
    assert done.returncode == 2 and "needs exactly" in done.stderr
    done = subprocess.run([str(exe), "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "variant 2" in done.stdout and "--shape NAME=DIMS" in done.stdout


@needs_gcc
def test_variant_picker_of_a_two_input_model(tmp_path):
    """Two inputs bound together (x=..,mask=..) per variant; NAME_select_variant and NAME_run
    from the header, called by a strict C11 program, against onnxruntime."""
    import onnxruntime as ort
    nodes = [helper.make_node("Mul", ["x", "mask"], ["m"]), helper.make_node("ReduceSum", ["m"], ["y"], keepdims=0)]
    graph = helper.make_graph(nodes, "two", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["B", "T"]),
                                             helper.make_tensor_value_info("mask", onnx.TensorProto.FLOAT, ["B", "T"])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [])])
    path = tmp_path / "two.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    assert main(["compile", str(path), "-o", str(tmp_path), "--input-shape", "x=1x8,mask=1x8",
                 "--input-shape", "x=2,4,mask=2,4", "--input-shape", "x=4x2", "--input-shape", "mask=4x2"]) == 0
    header = (tmp_path / "two.h").read_text()
    assert "#define TWO_NUM_VARIANTS 3" in header and "two_select_variant" in header
    (tmp_path / "t.c").write_text(r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "two.h"
int main(int argc, char **argv) {
  int64_t x_dims[2], mask_dims[2];
  const int64_t *dims[2] = {x_dims, mask_dims};
  int ranks[2] = {2, 2}, v, i, n;
  uint8_t *c = aligned_alloc(64, 64 + TWO_CONSTANT_MEM_SIZE), *m = aligned_alloc(64, TWO_MUTABLE_MEM_SIZE),
          *a = aligned_alloc(64, 64 + TWO_ACTIVATIONS_MEM_SIZE);
  float *x, *mask;
  x_dims[0] = mask_dims[0] = atoi(argv[1]);
  x_dims[1] = atoi(argv[2]);
  mask_dims[1] = atoi(argv[3]);
  v = two_select_variant(ranks, dims);
  if (v == TWO_NO_VARIANT) { printf("none\n"); return two_run(TWO_NUM_VARIANTS, c, m, a) == TWO_NO_VARIANT ? 0 : 1; }
  n = (int)(x_dims[0] * x_dims[1]);
  x = (float *)(m + two_variants[v].inputs[0].offset);
  mask = (float *)(m + two_variants[v].inputs[1].offset);
  for (i = 0; i < n; i++) { x[i] = (float)i * 0.5f - 1.0f; mask[i] = (float)(i % 3); }
  if (two_run(v, c, m, a) != 0) return 1;
  printf("%d %.6f\n", v, *(float *)(m + two_variants[v].outputs[0].offset));
  (void)argc;
  return 0;
}
""")
    built = subprocess.run(["gcc", "-Wall", "-Wextra", "-Werror", "-std=c11", "-pedantic", "-O2", "t.c", "two.o",
                            "-lm", "-o", "t"], cwd=tmp_path, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    session = ort.InferenceSession(str(path))
    for k, (b, t) in enumerate([(1, 8), (2, 4), (4, 2)]):
        done = subprocess.run([str(tmp_path / "t"), str(b), str(t), str(t)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        v, y = done.stdout.split()
        i = np.arange(b * t, dtype=np.float32)
        expected = session.run(None, {"x": (i * 0.5 - 1).reshape(b, t), "mask": (i % 3).reshape(b, t)})[0]
        assert int(v) == k and float(y) == pytest.approx(float(expected), rel=1e-6)
    for b, t, tm in [(3, 8, 8), (1, 8, 4)]:             # no such variant; mismatched inputs
        done = subprocess.run([str(tmp_path / "t"), str(b), str(t), str(tm)], capture_output=True, text=True)
        assert done.returncode == 0 and done.stdout == "none\n"


def test_shape_variants_of_the_command_line():
    from glowgen.cli import shape_variants
    assert shape_variants(["x=1x8,mask=1,8", "x=2x8", "mask=2x8"]) == [
        {"x": (1, 8), "mask": (1, 8)}, {"x": (2, 8), "mask": (2, 8)}]
    assert shape_variants(["x=1x8", "mask=1x8"]) == [{"x": (1, 8), "mask": (1, 8)}]
    assert shape_variants(["x=1x8", "x=2x8"]) == [{"x": (1, 8)}, {"x": (2, 8)}]
    assert shape_variants(None) == []


@pytest.mark.parametrize("argv, message", [
    (["--input-shape", "image=1x3x8x8", "--input-shape", "image=1x3x8x8"], "shape variant 2 repeats variant 1"),
    (["--input-shape", "image=1x3x8x8,k=1", "--input-shape", "image=2x3x8x8"],
     "every variant must bind the same inputs"),
    (["--input-shape", "image=1x3x8x8,image=2x3x8x8"], "binds 'image' twice"),
    (["--input-shape", "image=1x3x8x8,=2"], "takes NAME=DIMS"),
    (["--input-shape", "image=1x3x8x8", "--input-shape", "image=2x3x8"], "shape variant 2 (image=2x3x8): input 'image' has rank 4"),
])
def test_compile_bad_shape_variants(tmp_path, capsys, argv, message):
    assert main(["compile", str(TINY), "-o", str(tmp_path / "b")] + argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").iterdir())


def test_only_compile_takes_several_shape_variants(capsys):
    assert main(["run", str(TINY), "--input-shape", "image=1x3x8x8", "--input-shape", "image=2x3x8x8"]) == 2
    err = capsys.readouterr().err
    assert "only `glowgen compile` writes several" in err and "Traceback" not in err


def test_write_bundle_of_shape_variants_shares_constants(tmp_path):
    """The Python API: a list of input shapes is a bundle of variants; a constant both
    variants hold with the same bytes lies at one offset, read by both."""
    from glowgen.backends.cpu.bundle import constant_bytes
    path = _dynamic_batch_model(tmp_path / "dyn.onnx")
    bundle = write_bundle(path, tmp_path / "b", input_shapes=[{"x": (1, 3, 8, 8)}, {"x": (3, 3, 8, 8)}])
    first, second = bundle.variants
    assert bundle.program is first and first.inputs["x"].type.shape == (1, 3, 8, 8)
    offsets = {constant_bytes(w): w.offset for w in first.constant_weights()}
    shared = [w for w in second.constant_weights() if constant_bytes(w) in offsets]
    assert shared and all(w.offset == offsets[constant_bytes(w)] for w in shared)
    weights = (tmp_path / "b" / "dyn.weights.bin").read_bytes()
    for prog in bundle.variants:                     # each variant finds its constants in the file
        for w in prog.constant_weights():
            assert weights[w.offset:w.offset + w.nbytes] == constant_bytes(w)
    d = _defines((tmp_path / "b" / "dyn.h").read_text())
    assert d["DYN_NUM_VARIANTS"] == "2" and d["DYN_V1_INPUT_x_DIMS"] == "{3, 3, 8, 8}"
    assert int(d["DYN_MUTABLE_MEM_SIZE"]) == max(p.region_sizes["mutable"] for p in bundle.variants)
    with pytest.raises(InputError, match="empty list"):
        write_bundle(path, tmp_path / "c", input_shapes=[])
