#!/usr/bin/env python3
"""Differential fuzzing: random valid ONNX graphs, compiled by glowgen and run by onnxruntime
on the same inputs.

    tools/fuzz.py --count N --seed S [--backend cpu|interpreter] [--out DIR]

Graph i is built from seed (S, i), so any graph can be rebuilt alone (`--first i --count 1`).
Each one is checked with onnx.checker and strict shape inference and must load in
onnxruntime; glowgen compiles and runs it in a forked worker, so a crash of native code is
caught and counted.  A finding (a mismatch, an exception that is not a GlowgenError, a crash)
is shrunk -- outputs dropped, a value made the output, nodes bypassed, input dimensions cut,
inputs simplified, while it still fails -- and written to DIR (default .cache/fuzz/) as a
pytest file with the model (.onnx) and inputs (.npz) beside it.  A GlowgenError saying that
something is unsupported counts as skipped.  The last line is `N graphs, M mismatches, K
crashes`; the exit status is 1 when anything was found.
"""
from __future__ import annotations

import argparse
import collections
import os
import pickle
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzzgen  # noqa: E402
import fuzzops  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 120.0          # seconds for one compile and run (a hang is a crash)


# ---- building a case

@dataclass
class Case:
    model: onnx.ModelProto
    feeds: dict
    index: int = 0


def build(seed: int, index: int, max_tries=60) -> Case:
    """Graph `index` of seed `seed`: a chain of 1-6 ops."""
    rng = np.random.default_rng([seed, index])
    b = fuzzgen.Builder(rng, opset=int(rng.choice([13, 17, 17, 18, 19])))
    target = int(rng.integers(1, 7))
    weights = np.array([w for w, _ in fuzzops.GENERATORS])
    tries = 0
    while len(b.nodes) < target and tries < max_tries:
        tries += 1
        _, fn = fuzzops.GENERATORS[int(rng.choice(len(weights), p=weights / weights.sum()))]
        snapshot = (list(b.values), list(b.sources), list(b.consts), b.counter)
        try:
            fn(b)
        except (fuzzgen.Rejected, ValueError):       # ValueError: onnx.helper refused an attribute
            b.values, b.sources, b.consts, b.counter = snapshot
    if not b.nodes:
        raise fuzzgen.Rejected("no node could be built")
    model = b.model()
    feeds = {s.value.name: s.data for s in b.sources if not s.initializer}
    return Case(model, feeds, index)


def validate(model: onnx.ModelProto):
    onnx.checker.check_model(model, full_check=True)
    onnx.shape_inference.infer_shapes(model, strict_mode=True)


# ---- the two engines

def run_ort(model: onnx.ModelProto, feeds):
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 4
    # The model as written: onnxruntime's own fusions would change its numerics.
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds)))


def _glowgen_child(model_bytes, feeds, backend):
    import glowgen
    from glowgen.errors import GlowgenError, UnsupportedError
    try:
        compiled = glowgen.compile(onnx.load_from_string(model_bytes), backend=backend)
        out = compiled.run({k: v.copy() for k, v in feeds.items()})
        return ("ok", {k: np.array(v) for k, v in out.items()})
    except UnsupportedError as exc:
        return ("unsupported", f"{type(exc).__name__}: {exc}")
    except GlowgenError as exc:
        return ("refused", f"{type(exc).__name__}: {exc}")
    except Exception:
        return ("exception", traceback.format_exc())


def run_glowgen(model: onnx.ModelProto, feeds, backend: str, fork=True):
    """("ok", outputs) | ("unsupported" | "refused" | "exception" | "crash", message)."""
    model_bytes = model.SerializeToString()
    if not fork:
        return _glowgen_child(model_bytes, feeds, backend)
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:                                   # the worker: compile, run, report, exit
        try:
            os.close(rfd)
            data = pickle.dumps(_glowgen_child(model_bytes, feeds, backend))
            with os.fdopen(wfd, "wb") as w:
                w.write(data)
        finally:
            os._exit(0)
    os.close(wfd)
    chunks, deadline = [], time.monotonic() + TIMEOUT
    with os.fdopen(rfd, "rb") as r:
        import select
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([r], [], [], max(left, 0))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return ("crash", f"timed out after {TIMEOUT:.0f} s")
            chunk = os.read(r.fileno(), 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return ("crash", f"killed by {signal.Signals(os.WTERMSIG(status)).name}")
    try:
        return pickle.loads(b"".join(chunks))
    except Exception:
        return ("crash", f"worker exited with status {os.waitstatus_to_exitcode(status)} "
                         "and no result")


# ---- comparing

# Relative error allowed per element type, for one op; a graph gets (1 + nodes) / 2 times it,
# errors of a chain adding up.  float32: a few ulps (2^-23 = 1.2e-7) for correctly rounded ops,
# plus the cpu backend's polynomial transcendentals (2e-7, tests/test_transcendentals.py) and
# onnxruntime's own (MLAS: about the same), plus sums in another order (Conv, MatMul and
# reductions accumulate K terms: K * 2^-24 relative to the sum of magnitudes): 1e-4 covers
# K up to several hundred.  float64 is computed in double by both: 1e-9.  float16 has an ulp
# of 2^-10 = 1e-3; onnxruntime computes some f16 ops in f16 and others in f32 where glowgen
# always widens to f32, so a result may differ by an ulp or two: 4e-3.
RTOL = {"float32": 1e-4, "float64": 1e-9, "float16": 4e-3}
# Absolute error, as a fraction of the largest finite magnitude of the tensor: a sum of terms
# that cancel keeps the error of its large terms (catastrophic cancellation), so small
# elements of a tensor are held to the error of its large ones.
ATOL_OF_MAX = {"float32": 1e-5, "float64": 1e-10, "float16": 2e-3}


def compare(actual: dict, expected: dict, n_nodes: int) -> list[str]:
    problems = []
    if set(actual) != set(expected):
        return [f"outputs {sorted(actual)} != {sorted(expected)}"]
    for name, e in expected.items():
        a = np.asarray(actual[name])
        e = np.asarray(e)
        if a.shape != e.shape or a.dtype != e.dtype:
            problems.append(f"{name}: {a.dtype}{list(a.shape)} != {e.dtype}{list(e.shape)}")
            continue
        if a.dtype.kind != "f":
            bad = a != e
            if bad.any():
                i = tuple(np.argwhere(bad)[0])
                problems.append(f"{name}: {int(bad.sum())} of {a.size} differ, at {list(i)}: "
                                f"{a[i]} != {e[i]}")
            continue
        rtol = RTOL[a.dtype.name] * (1 + n_nodes) / 2
        a64, e64 = a.astype(np.float64), e.astype(np.float64)
        nan_a, nan_e = np.isnan(a64), np.isnan(e64)
        finite = np.isfinite(e64)
        scale = float(np.abs(e64[finite]).max()) if finite.any() else 0.0
        atol = ATOL_OF_MAX[a.dtype.name] * scale * (1 + n_nodes) / 2
        with np.errstate(invalid="ignore"):
            close = np.abs(a64 - e64) <= atol + rtol * np.abs(e64)
        close |= (a64 == e64)                       # equal infinities
        close |= nan_a & nan_e
        bad = ~close
        if bad.any():
            i = tuple(np.argwhere(bad)[0])
            problems.append(f"{name}: {int(bad.sum())} of {a.size} differ, at {list(i)}: "
                            f"glowgen {a[i]!r} onnxruntime {e[i]!r} (rtol {rtol:.2g}, atol {atol:.2g})")
    return problems


# ---- one case

@dataclass
class Outcome:
    kind: str               # ok | skipped | mismatch | crash
    detail: str = ""


def check(model: onnx.ModelProto, feeds, backend: str, fork=True) -> Outcome:
    try:
        validate(model)
        expected = run_ort(model, feeds)
    except Exception as exc:
        return Outcome("invalid", f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    status, payload = run_glowgen(model, feeds, backend, fork)
    if status == "ok":
        problems = compare(payload, expected, len(model.graph.node))
        return Outcome("mismatch", "; ".join(problems)) if problems else Outcome("ok")
    if status == "refused" and "internal error" in payload:
        return Outcome("crash", "internal error: " + payload.splitlines()[0][:300])
    if status in ("unsupported", "refused"):
        return Outcome("skipped", payload.splitlines()[0][:200])
    if status == "exception":
        return Outcome("crash", "Python exception: " + payload.strip().splitlines()[-1][:300])
    return Outcome("crash", payload)


# ---- shrinking

def _with_outputs(model, names):
    """The model computing only `names`, dead nodes, inputs and initializers removed."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    needed, keep = set(names), []
    for node in reversed(list(g.node)):
        if any(o in needed for o in node.output):
            keep.append(node)
            needed.update(i for i in node.input if i)
    del g.node[:]
    g.node.extend(reversed(keep))
    for coll in (g.input, g.initializer):
        kept = [x for x in coll if x.name in needed]
        del coll[:]
        coll.extend(kept)
    del g.output[:]
    for n in names:
        g.output.append(onnx.helper.make_empty_tensor_value_info(n))
    return _typed(m)


def _typed(m):
    """Give outputs their inferred types, drop stale value_info."""
    del m.graph.value_info[:]
    for o in m.graph.output:
        o.ClearField("type")
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    known = {vi.name: vi for vi in list(inferred.graph.value_info) + list(inferred.graph.input)
             + list(inferred.graph.output)}
    for o in m.graph.output:
        o.CopyFrom(known[o.name])
    for vi in known.values():    # an empty tensor is another failure than the one shrunk
        if any(d.HasField("dim_value") and d.dim_value == 0 for d in vi.type.tensor_type.shape.dim):
            raise ValueError("empty tensor")
    return m


def _feeds_for(model, feeds):
    return {i.name: feeds[i.name] for i in model.graph.input}


def shrink(model, feeds, backend, kind, budget=150, fork=True):
    """A smaller model and simpler inputs that still fail the same way (`kind`)."""
    tries = [0]

    def fails(m, f):
        if tries[0] >= budget:
            return False
        tries[0] += 1
        try:
            return check(m, _feeds_for(m, f), backend, fork).kind == kind
        except Exception:
            return False

    def attempt(make):
        try:
            return make()
        except Exception:
            return None

    # 1. One output, then the earliest value that still fails as the output.
    for out in [o.name for o in model.graph.output]:
        m = attempt(lambda: _with_outputs(model, [out]))
        if m is not None and len(model.graph.output) > 1 and fails(m, feeds):
            model = m
            break
    changed = True
    while changed and tries[0] < budget:
        changed = False
        for node in list(model.graph.node):
            for out in node.output:
                if out == model.graph.output[0].name:
                    continue
                m = attempt(lambda: _with_outputs(model, [out]))
                if m is not None and len(m.graph.node) < len(model.graph.node) and fails(m, feeds):
                    model, changed = m, True
                    break
            if changed:
                break
        # 2. Bypass a node whose first operand has its result's type.
        for k, node in enumerate(model.graph.node):
            if changed or not node.input or not node.input[0]:
                continue
            m = attempt(lambda: _bypass(model, k))
            if m is not None and fails(m, feeds):
                model, changed = m, True
        # 3. Cut input dimensions to 1.
        for inp in list(model.graph.input):
            if changed:
                break
            for axis, d in enumerate(feeds[inp.name].shape):
                if d > 1:
                    f = dict(feeds)
                    f[inp.name] = np.take(feeds[inp.name], [0], axis=axis)
                    m = attempt(lambda: _reshape_input(model, inp.name, f[inp.name].shape))
                    if m is not None and fails(m, f):
                        model, feeds, changed = m, f, True
                        break
    # 4. Simpler inputs: all zeros, all ones, then halves of the elements zeroed.
    for inp in [i.name for i in model.graph.input]:
        x = feeds[inp]
        for simple in (np.zeros_like(x), np.ones_like(x)):
            f = dict(feeds)
            f[inp] = simple
            if not np.array_equal(simple, x) and fails(model, f):
                feeds = f
                break
        else:
            flat = feeds[inp].reshape(-1).copy()
            chunk = max(1, flat.size // 2)
            while chunk >= 1 and tries[0] < budget:
                for start in range(0, flat.size, chunk):
                    trial = flat.copy()
                    trial[start:start + chunk] = 0
                    if np.array_equal(trial, flat):
                        continue
                    f = dict(feeds)
                    f[inp] = trial.reshape(feeds[inp].shape)
                    if fails(model, f):
                        flat, feeds = trial, f
                chunk //= 2
    return model, _feeds_for(model, feeds)


def _bypass(model, k):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    node = m.graph.node[k]
    src, dst = node.input[0], node.output[0]
    del m.graph.node[k]
    for n in m.graph.node:
        for i, name in enumerate(n.input):
            if name == dst:
                n.input[i] = src
    outs = [src if o.name == dst else o.name for o in m.graph.output]
    return _with_outputs(m, outs)


def _reshape_input(model, name, shape):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for i in m.graph.input:
        if i.name == name:
            dims = i.type.tensor_type.shape.dim
            for d, s in zip(dims, shape):
                d.dim_value = int(s)
    return _with_outputs(m, [o.name for o in m.graph.output])


# ---- writing a finding as a test

TEST_TEMPLATE = '''"""Differential fuzzing finding {stem} ({kind} on the {backend} backend), shrunk by
tools/fuzz.py --seed {seed} --first {index} --count 1 --backend {backend}:
    {detail}

The model is {stem}.onnx, its inputs {stem}.npz; glowgen must match onnxruntime."""
from pathlib import Path
import sys

import numpy as np
import onnx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, {tools!r})
import fuzz  # noqa: E402


def test_{stem}():
    model = onnx.load(str(HERE / "{stem}.onnx"))
    feeds = dict(np.load(HERE / "{stem}.npz"))
    expected = fuzz.run_ort(model, feeds)
    status, actual = fuzz.run_glowgen(model, feeds, "{backend}")
    assert status == "ok", actual
    assert not fuzz.compare(actual, expected, len(model.graph.node))
'''


def write_finding(out_dir: Path, model, feeds, backend, seed, index, outcome):
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"fuzz_{backend}_{seed}_{index}"
    onnx.save(model, str(out_dir / f"{stem}.onnx"))
    np.savez(out_dir / f"{stem}.npz", **feeds)
    (out_dir / f"test_{stem}.py").write_text(TEST_TEMPLATE.format(
        stem=stem, kind=outcome.kind, backend=backend, seed=seed, index=index,
        detail=outcome.detail.replace('"""', "'''")[:500], tools=str(Path(__file__).resolve().parent)))
    return out_dir / f"test_{stem}.py"


# ---- the driver

@dataclass
class Summary:
    graphs: int = 0
    mismatches: int = 0
    crashes: int = 0
    skipped: int = 0
    invalid: int = 0
    findings: list = field(default_factory=list)        # (index, outcome, path)
    reasons: collections.Counter = field(default_factory=collections.Counter)
    ops: collections.Counter = field(default_factory=collections.Counter)

    def line(self):
        return f"{self.graphs} graphs, {self.mismatches} mismatches, {self.crashes} crashes"


def fuzz(count, seed, backend="cpu", out=None, first=0, fork=True, shrink_findings=True,
         progress=None, log=None) -> Summary:
    import glowgen  # noqa: F401  (imported once, before forking, so workers start warm)
    from glowgen.engine.registry import Registry
    Registry.default()
    summary = Summary()
    out = Path(out) if out else REPO / ".cache" / "fuzz"
    for index in range(first, first + count):
        try:
            case = build(seed, index)
        except fuzzgen.Rejected:
            summary.invalid += 1
            continue
        outcome = check(case.model, case.feeds, backend, fork)
        summary.graphs += outcome.kind != "invalid"
        if outcome.kind == "invalid":
            summary.invalid += 1
            summary.reasons["invalid: " + outcome.detail[:90]] += 1
        elif outcome.kind == "skipped":
            summary.skipped += 1
            summary.reasons["skipped: " + outcome.detail[:90]] += 1
        else:
            summary.ops.update(n.op_type for n in case.model.graph.node)
        if outcome.kind in ("mismatch", "crash"):
            summary.mismatches += outcome.kind == "mismatch"
            summary.crashes += outcome.kind == "crash"
            model, feeds = case.model, case.feeds
            if shrink_findings:
                model, feeds = shrink(model, feeds, backend, outcome.kind, fork=fork)
                final = check(model, feeds, backend, fork)
                outcome = final if final.kind == outcome.kind else outcome
            path = write_finding(out, model, feeds, backend, seed, index, outcome)
            summary.findings.append((index, outcome, path))
            if log:
                ops = " ".join(n.op_type for n in model.graph.node)
                log(f"graph {index}: {outcome.kind} [{ops}] {outcome.detail}\n  -> {path}")
        if progress:
            progress(index - first + 1, count, summary)
    return summary


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--first", type=int, default=0, help="index of the first graph (to replay one)")
    ap.add_argument("--backend", choices=("cpu", "interpreter"), default="cpu")
    ap.add_argument("--out", default=None, help="where findings go (default .cache/fuzz/)")
    ap.add_argument("--no-shrink", action="store_true")
    ap.add_argument("--stats", action="store_true", help="print skip reasons and op counts")
    args = ap.parse_args(argv)
    tty = sys.stderr.isatty()

    def progress(done, total, s):
        if tty:
            sys.stderr.write(f"\r{done}/{total}: {s.mismatches} mismatches, {s.crashes} crashes, "
                             f"{s.skipped} skipped")
            sys.stderr.flush()

    def log(msg):
        if tty:
            sys.stderr.write("\r\033[K")
        print(msg, flush=True)

    summary = fuzz(args.count, args.seed, args.backend, args.out, args.first,
                   shrink_findings=not args.no_shrink, progress=progress, log=log)
    if tty:
        sys.stderr.write("\r\033[K")
    if args.stats:
        for reason, n in summary.reasons.most_common(30):
            print(f"{n:6d}  {reason}")
        print("ops run:", ", ".join(f"{k} {v}" for k, v in sorted(summary.ops.items())))
    print(f"{summary.skipped} skipped (unsupported by glowgen), {summary.invalid} not built or "
          f"rejected by onnxruntime")
    print(summary.line())
    return 1 if summary.mismatches or summary.crashes else 0


if __name__ == "__main__":
    sys.exit(main())
