"""ONNX backend conformance: run ONNX's own backend test suite through glowgen.

The cases come from the installed `onnx` package alone, so a run is reproducible from the
project: the node cases are built in memory by `onnx.backend.test.case.node.collect_testcases`
(onnx >= 1.23 wheels ship their definitions, not their data), the model cases (`simple`,
`pytorch-converted`, `pytorch-operator`) are read from the data files the wheel ships.

Every case runs in a worker subprocess with a timeout, so a crash in native code or a hang
is recorded and the run goes on.  Outputs are compared as ONNX's runner compares them: the
same number of outputs, shape and element type exact, values with `numpy.testing.assert_allclose`
at the case's rtol / atol (NaN positions equal).

Expected failures live in one declarative file, `expected_failures.toml` next to this module:
each entry names cases, the reason they fail, and a regex the `GlowgenError` message must match.

    glowgen conformance [--backend interpreter] [--include REGEX] [--json FILE] [--jobs N]
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import sys
import time
import traceback
import warnings
from collections import Counter, defaultdict
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path
from typing import Iterable, Optional

import numpy as np

from ..errors import GlowgenError

CATEGORIES = ("node", "simple", "pytorch-converted", "pytorch-operator")
EXPECTED_FILE = Path(__file__).with_name("expected_failures.toml")

# Outcomes of one case.
PASS, MISMATCH, UNSUPPORTED, ERROR, CRASH, TIMEOUT = (
    "pass", "mismatch", "unsupported", "error", "crash", "timeout")
OUTCOMES = (PASS, MISMATCH, UNSUPPORTED, ERROR, CRASH, TIMEOUT)


@dataclass
class Case:
    name: str
    category: str
    model: object                          # onnx.ModelProto, or a path to model.onnx
    data_sets: list                        # [(inputs list, outputs list)] or [dir path]
    rtol: float = 1e-3
    atol: float = 1e-7


@dataclass
class Result:
    name: str
    category: str
    outcome: str
    message: str = ""
    seconds: float = 0.0
    frozen: bool = False                   # some inputs were bound as compile-time constants
    expected: Optional[str] = None         # the reason, when the case is an expected failure

    @property
    def passed(self) -> bool:
        return self.outcome == PASS


# ----------------------------------------------------------------------------- collecting
def _onnx_data_dir() -> Path:
    import onnx
    return Path(onnx.__file__).parent / "backend" / "test" / "data"


def collect(categories: Iterable[str] = CATEGORIES, include: Optional[str] = None) -> list[Case]:
    """Every conformance case of `categories` whose name matches `include` (a regex)."""
    pattern = re.compile(include) if include else None
    cases: list[Case] = []
    for category in categories:
        if category not in CATEGORIES:
            raise ValueError(f"unknown category {category!r}; categories: {', '.join(CATEGORIES)}")
        if category == "node":
            from onnx.backend.test.case import node
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with np.errstate(all="ignore"):
                    node_cases = node.collect_testcases(None)
            for c in node_cases:
                if pattern and not pattern.search(c.name):
                    continue
                cases.append(Case(c.name, "node", c.model, list(c.data_sets), c.rtol, c.atol))
            continue
        root = _onnx_data_dir() / category
        for case_dir in sorted(p for p in root.iterdir() if p.is_dir()):
            if pattern and not pattern.search(case_dir.name):
                continue
            rtol, atol = 1e-3, 1e-7
            meta = case_dir / "data.json"
            if meta.exists():
                data = json.loads(meta.read_text())
                rtol, atol = data.get("rtol", rtol), data.get("atol", atol)
            sets = sorted(case_dir.glob("test_data_set_*"))
            cases.append(Case(case_dir.name, category, case_dir / "model.onnx", sets, rtol, atol))
    return cases


def _read_pb(path: Path, proto_type: Optional[object]):
    """A tensor (or sequence / optional) stored as protobuf, as the ONNX runner reads it."""
    import onnx
    from onnx import numpy_helper
    data = path.read_bytes()
    if proto_type is not None and getattr(proto_type, "HasField", None) and proto_type.HasField("sequence_type"):
        seq = onnx.SequenceProto()
        seq.ParseFromString(data)
        return numpy_helper.to_list(seq)
    if proto_type is not None and getattr(proto_type, "HasField", None) and proto_type.HasField("optional_type"):
        opt = onnx.OptionalProto()
        opt.ParseFromString(data)
        return numpy_helper.to_optional(opt)
    t = onnx.TensorProto()
    t.ParseFromString(data)
    return numpy_helper.to_array(t)


def _load_data_set(set_dir: Path, model) -> tuple[list, list]:
    inits = {i.name for i in model.graph.initializer}
    ins = [vi for vi in model.graph.input if vi.name not in inits]
    outs = list(model.graph.output)
    n_in = len(list(set_dir.glob("input_*.pb")))
    n_out = len(list(set_dir.glob("output_*.pb")))
    inputs = [_read_pb(set_dir / f"input_{i}.pb", ins[i].type if i < len(ins) else None)
              for i in range(n_in)]
    outputs = [_read_pb(set_dir / f"output_{i}.pb", outs[i].type if i < len(outs) else None)
               for i in range(n_out)]
    return inputs, outputs


# ----------------------------------------------------------------------------- one case
def compare(expected: list, actual: list, rtol: float, atol: float) -> Optional[str]:
    """None when `actual` matches `expected` as ONNX's runner judges it, else why not."""
    if len(actual) != len(expected):
        return f"{len(actual)} outputs, expected {len(expected)}"
    for i, (e, a) in enumerate(zip(expected, actual)):
        if isinstance(e, (list, tuple)) or e is None:
            return f"output {i} is a {type(e).__name__}, which glowgen cannot produce"
        a = np.asarray(a)
        if a.shape != e.shape:
            return f"output {i}: shape {list(a.shape)}, expected {list(e.shape)}"
        if a.dtype != e.dtype:
            return f"output {i}: element type {a.dtype}, expected {e.dtype}"
        try:
            if e.dtype == object:
                np.testing.assert_array_equal(a, e)
            else:
                np.testing.assert_allclose(a, e, rtol=rtol, atol=atol)
        except AssertionError as err:
            lines = [ln for ln in str(err).strip().splitlines() if ln.strip()]
            return f"output {i}: " + " | ".join(lines[1:5])[:400]
    return None


def _as_array(value):
    import onnx
    from onnx import numpy_helper
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, np.generic):
        return np.asarray(value)
    return value


def run_case(case: Case, backend: str, specialize: bool = False) -> tuple[str, str, bool]:
    """Compile and run one case in this process: (outcome, message, frozen).

    Values the compiler needs at compile time (Reshape's shape, reduction axes...) are
    sometimes graph inputs of the case; glowgen specializes the model to the case's data
    for those (`constant_inputs`), as an ahead-of-time user would, and `frozen` says so.
    With `specialize`, every input is given to run() and nothing is bound: glowgen.compile's
    default, which compiles per value of such inputs (`frozen` then says it did)."""
    import onnx
    import glowgen
    from glowgen.errors import CompileTimeInputError, GlowgenError
    frozen: set = set()
    try:
        model = case.model if not isinstance(case.model, (str, Path)) else onnx.load(str(case.model))
        inits = {i.name for i in model.graph.initializer}
        input_names = [vi.name for vi in model.graph.input if vi.name not in inits]
        compiled = None
        for data_set in case.data_sets:
            inputs, outputs = (_load_data_set(data_set, model) if isinstance(data_set, Path)
                               else data_set)
            inputs, outputs = [_as_array(v) for v in inputs], [_as_array(v) for v in outputs]
            named = dict(zip(input_names, inputs))
            if compiled is None or frozen:
                while True:
                    try:
                        compiled = glowgen.compile(
                            model, backend=backend, specialize=None if specialize else False,
                            constant_inputs={k: named[k] for k in sorted(frozen)})
                        break
                    except CompileTimeInputError as e:
                        more = set(e.inputs) - frozen
                        if not more or not all(isinstance(named.get(k), np.ndarray) for k in more):
                            raise
                        frozen |= more
            feeds = {}
            for name in compiled.input_names:
                value = named.get(name)
                if not isinstance(value, np.ndarray):
                    return UNSUPPORTED, (f"input {name!r} is a {type(value).__name__}; only "
                                         f"tensor inputs are supported"), bool(frozen)
                feeds[name] = value
            got = compiled.run(feeds)
            actual = [got[o.name] for o in model.graph.output]
            why = compare(list(outputs), actual, case.rtol, case.atol)
            if why:
                return MISMATCH, why, bool(frozen)
        if specialize:
            frozen = set(getattr(compiled, "deciding_inputs", ())) | set(
                getattr(compiled, "deciding_values", ()))
        return PASS, "", bool(frozen)
    except GlowgenError as e:
        return UNSUPPORTED, f"{type(e).__name__}: {e}", bool(frozen)
    except Exception as e:     # noqa: BLE001 - every other exception is a glowgen bug
        tb = traceback.extract_tb(e.__traceback__)
        where = f" at {Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
        return ERROR, f"{type(e).__name__}{where}: {e}"[:600], bool(frozen)


# ----------------------------------------------------------------------------- workers
_CASES: list[Case] = []      # inherited by forked workers


def _worker(conn, backend: str, specialize: bool) -> None:
    # Native code may print; keep the parent's table clean.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    warnings.simplefilter("ignore")
    while True:
        try:
            index = conn.recv()
        except EOFError:
            return
        if index is None:
            return
        t0 = time.perf_counter()
        outcome, message, frozen = run_case(_CASES[index], backend, specialize)
        conn.send((index, outcome, message, time.perf_counter() - t0, frozen))


class _Slot:
    def __init__(self, ctx, backend, specialize):
        self.parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, backend, specialize), daemon=True)
        self.proc.start()
        child.close()
        self.index: Optional[int] = None
        self.started = 0.0

    def submit(self, index: int):
        self.index, self.started = index, time.perf_counter()
        self.parent.send(index)

    def kill(self):
        self.proc.kill()
        self.proc.join()
        self.parent.close()


def run_cases(cases: list[Case], backend: str = "cpu", jobs: Optional[int] = None,
              timeout: float = 60.0, progress=None, specialize: bool = False) -> list[Result]:
    """Run every case in worker subprocesses (forked, `jobs` of them) with a per-case timeout;
    `specialize`: see run_case."""
    global _CASES
    _CASES = cases
    ctx = mp.get_context("fork")
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(cases) or 1))
    results: dict[int, Result] = {}
    todo = list(range(len(cases)))[::-1]
    slots = [_Slot(ctx, backend, specialize) for _ in range(jobs)]

    def finish(i, outcome, message, seconds, frozen=False):
        results[i] = Result(cases[i].name, cases[i].category, outcome, message, seconds, frozen)
        if progress:
            progress(results[i], len(results), len(cases))

    try:
        for s in slots:
            if todo:
                s.submit(todo.pop())
        while any(s.index is not None for s in slots):
            busy = [s for s in slots if s.index is not None]
            now = time.perf_counter()
            left = min(s.started + timeout - now for s in busy)
            ready = wait([s.parent for s in busy] + [s.proc.sentinel for s in busy],
                         timeout=max(0.0, left))
            for k, s in enumerate(slots):
                if s.index is None:
                    continue
                if s.parent in ready or s.proc.sentinel in ready:
                    try:
                        if not s.parent.poll():
                            raise EOFError
                        finish(*s.parent.recv())
                        s.index = None
                    except (EOFError, OSError):
                        s.proc.join(timeout=5)
                        code = s.proc.exitcode if s.proc.exitcode is not None else "?"
                        finish(s.index, CRASH, f"the worker process died (exit code {code})",
                               time.perf_counter() - s.started)
                        s.kill()
                        slots[k] = s = _Slot(ctx, backend, specialize)
                elif time.perf_counter() - s.started > timeout:
                    finish(s.index, TIMEOUT, f"no result after {timeout:.0f} s",
                           time.perf_counter() - s.started)
                    s.kill()
                    slots[k] = s = _Slot(ctx, backend, specialize)
                if s.index is None and todo:
                    s.submit(todo.pop())
    finally:
        for s in slots:
            try:
                s.parent.send(None)
            except (OSError, BrokenPipeError):
                pass
            s.proc.join(timeout=1)
            if s.proc.is_alive():
                s.proc.kill()
    return [results[i] for i in range(len(cases))]


# ----------------------------------------------------------------------------- expected failures
@dataclass
class Expectation:
    reason: str
    match: str                   # regex the failure message must match
    cases: list
    backends: Optional[list] = None      # the backends the entry holds for (None: every one)
    outcome: str = UNSUPPORTED           # how the cases fail: a clear error, unless stated


def load_expected(path: Path = EXPECTED_FILE, backend: Optional[str] = None) -> dict[str, Expectation]:
    """case name -> its Expectation, from the declarative expected-failures file."""
    import tomllib
    if not path.exists():
        return {}
    data = tomllib.loads(path.read_text())
    out: dict[str, Expectation] = {}
    for entry in data.get("expected", []):
        exp = Expectation(entry["reason"], entry.get("match", ""), list(entry.get("cases", [])),
                          entry.get("backends"), entry.get("outcome", UNSUPPORTED))
        if backend is not None and exp.backends is not None and backend not in exp.backends:
            continue
        for name in exp.cases:
            out[name] = exp
    return out


def reason_of(result: Result) -> tuple[str, str]:
    """(reason, regex) summing up why a case fails, for the expected-failures file."""
    m = result.message
    if result.outcome != UNSUPPORTED:
        return f"{result.outcome}: glowgen bug, to fix", ""
    patterns = [
        (r"ONNX op (\w+) \(", "ONNX op {0} is not supported", r"ONNX op {0} \("),
        (r"ONNX element type (\w+) is not supported", "element type {0} is not supported",
         r"ONNX element type {0} is not supported"),
        (r"is in domain '([\w.]+)'", "ops of domain {0} are not supported", r"is in domain '{0}'"),
        (r"(is not a tensor|only tensor inputs are supported)",
         "sequences, maps and optionals are not supported", r"is not a tensor|only tensor inputs"),
        (r"(has a dynamic dimension)", "dynamic input shapes must be bound, and the case binds none",
         r"{0}"),
        (r"(ONNX shape inference rejects the model)", "ONNX shape inference rejects the model", r"{0}"),
    ]
    for pat, reason, regex in patterns:
        found = re.search(pat, m)
        if found:
            return reason.format(found.group(1)), regex.format(_escape(found.group(1)))
    text = re.sub(r" \[declared at [^\]]*\]", "", m)
    cut = max(text.rfind("): "), text.rfind("': "))
    fragment = (text[cut + 3:] if cut >= 0 else text.split(": ", 1)[-1]).strip()[:80]
    return fragment, _escape(fragment)


def _escape(text: str) -> str:
    return re.escape(text).replace("\\ ", " ")


def write_expected(results: list[Result], path: Path, backend: str) -> int:
    """Write every failing case into a fresh expected-failures file, grouped by reason."""
    groups: dict[tuple, list[str]] = defaultdict(list)
    for r in results:
        if not r.passed:
            groups[reason_of(r)].append(r.name)
    lines = [
        "# Expected failures of `glowgen conformance` (ONNX's backend test suite), one entry per",
        "# reason.  `match` is a regex the case's GlowgenError message must match; the default",
        "# test suite checks it (tests/test_conformance.py).  Every case not listed here must pass.",
        f"# Regenerate after adding ops: glowgen conformance --backend {backend} --write-expected FILE",
        "",
    ]
    for (reason, regex), names in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        lines += ["[[expected]]", f"reason = {json.dumps(reason)}", f"match = {json.dumps(regex)}"]
        lines += ["cases = ["] + [f"  {json.dumps(n)}," for n in sorted(names)] + ["]", ""]
    path.write_text("\n".join(lines))
    return len(groups)


# ----------------------------------------------------------------------------- reporting
def table(results: list[Result]) -> str:
    rows = []
    head = ("category", "cases", "passed", "(frozen)", "mismatch", "unsupported", "error", "crash",
            "timeout")
    by_cat: dict[str, Counter] = defaultdict(Counter)
    for r in results:
        by_cat[r.category][r.outcome] += 1
        by_cat[r.category]["frozen"] += r.passed and r.frozen
    total = Counter()
    for cat in CATEGORIES:
        if cat not in by_cat:
            continue
        c = by_cat[cat]
        total.update(c)
        rows.append((cat, sum(c[o] for o in OUTCOMES), c[PASS], c["frozen"], c[MISMATCH],
                     c[UNSUPPORTED], c[ERROR], c[CRASH], c[TIMEOUT]))
    c = total
    rows.append(("total", sum(c[o] for o in OUTCOMES), c[PASS], c["frozen"], c[MISMATCH],
                 c[UNSUPPORTED], c[ERROR], c[CRASH], c[TIMEOUT]))
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    fmt = lambda r: "  ".join(str(v).ljust(widths[0]) if i == 0 else str(v).rjust(widths[i])  # noqa: E731
                              for i, v in enumerate(r))
    lines = [fmt(head), "  ".join("-" * w for w in widths)]
    lines += [fmt(r) for r in rows[:-1]] + ["  ".join("-" * w for w in widths), fmt(rows[-1])]
    return "\n".join(lines)


def main(args) -> int:
    """`glowgen conformance`: run, print the table, the surprises, and `N passed, M failed`."""
    from glowgen.backends.base import get_backend
    get_backend(args.backend)          # an unknown name is an error naming the available ones
    categories = args.category or CATEGORIES
    t0 = time.perf_counter()
    cases = collect(categories, args.include)
    if not cases:
        raise GlowgenError(f"no conformance case matches --include {args.include!r}")
    expected = load_expected(Path(args.expected) if args.expected else EXPECTED_FILE, args.backend)
    stream = sys.stderr

    def progress(r, done, total):
        if not args.quiet and (done % 100 == 0 or done == total):
            print(f"  {done}/{total} cases ({time.perf_counter() - t0:.0f} s)", file=stream, flush=True)

    specialize = getattr(args, "specialize", False)
    results = run_cases(cases, args.backend, args.jobs, args.timeout, progress, specialize)
    for r in results:
        exp = expected.get(r.name)
        r.expected = exp.reason if exp else None
    print(f"ONNX backend conformance, backend {args.backend}, onnx "
          f"{__import__('onnx').__version__}, {len(results)} cases in {time.perf_counter() - t0:.0f} s"
          + ("; every input given at run time, (frozen): passes compiled per input value"
             if specialize else ""))
    print(table(results))
    unexpected = [r for r in results if not r.passed and r.expected is None]
    stale = [r for r in results if r.passed and r.expected is not None]
    if args.verbose:
        for r in results:
            if not r.passed:
                print(f"  {r.outcome:11s} {r.name}: {r.message[:300]}")
    else:
        for r in unexpected[:50]:
            print(f"  unexpected {r.outcome}: {r.name}: {r.message[:300]}")
        if len(unexpected) > 50:
            print(f"  ... and {len(unexpected) - 50} more unexpected failures (see --json)")
        for r in stale[:50]:
            print(f"  now passes (remove it from {EXPECTED_FILE.name}): {r.name}")
    slow = sorted(results, key=lambda r: -r.seconds)[:5]
    if args.verbose:
        print("slowest: " + ", ".join(f"{r.name} {r.seconds:.1f}s" for r in slow))
    if args.write_expected:
        n = write_expected(results, Path(args.write_expected), args.backend)
        print(f"wrote {n} reasons for {sum(not r.passed for r in results)} failing cases to {args.write_expected}")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"backend": args.backend, "results": [r.__dict__ for r in results]}, indent=1))
    n_pass = sum(r.passed for r in results)
    print(f"{n_pass} passed, {len(results) - n_pass} failed")
    return 1 if unexpected else 0
