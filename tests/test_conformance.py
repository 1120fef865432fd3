"""ONNX's backend conformance suite through glowgen (see glowgen/conformance/).

Every case not in glowgen/conformance/expected_failures.toml must pass; every listed case must
fail with a GlowgenError whose message matches the entry's `match` (a clear error naming the op
or feature, never an unexplained exception).  By default a deterministic half of the cases
runs (every other case by name); `pytest --conformance` runs all of them.  The cases run in
worker subprocesses, so a crash is a failure here, not the end of the test run.
"""
from __future__ import annotations

import re

import pytest

from glowgen import conformance as C


@pytest.fixture(scope="module")
def cases():
    return C.collect()


def test_expected_failures_file_is_well_formed(cases):
    import tomllib
    data = tomllib.loads(C.EXPECTED_FILE.read_text())
    names = {c.name for c in cases}
    seen: dict[str, str] = {}
    for entry in data["expected"]:
        assert entry["reason"].strip() and entry["match"].strip(), entry
        assert entry.get("outcome", C.UNSUPPORTED) in C.OUTCOMES, entry
        assert set(entry.get("backends", [])) <= {"interpreter", "cpu"}, entry
        re.compile(entry["match"])
        for name in entry["cases"]:
            assert name in names, f"{name} (reason {entry['reason']!r}) is not a conformance case"
            assert name not in seen, f"{name} is listed under two reasons"
            seen[name] = entry["reason"]


# Every n-th case by name runs by default (`pytest --conformance` runs all), and at least
# this many of them must pass: the interpreter on half the cases, the cpu backend (which
# compiles every case) on a representative eighth.
SAMPLE = {"interpreter": 2, "cpu": 8}
MIN_PASSED = {"interpreter": (1670, 840), "cpu": (1670, 210)}    # measured: 1674 (842, 211)


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_conformance_cases(cases, request, backend):
    full = request.config.getoption("--conformance")
    chosen = sorted(cases, key=lambda c: c.name)
    if not full:
        chosen = chosen[::SAMPLE[backend]]
    expected = C.load_expected(backend=backend)
    results = C.run_cases(chosen, backend, jobs=2, timeout=60)
    problems = []
    for r in results:
        exp = expected.get(r.name)
        if exp is None:
            if not r.passed:
                problems.append(f"{r.name}: {r.outcome}: {r.message[:200]}")
        elif r.passed:
            problems.append(f"{r.name} passes now: remove it from {C.EXPECTED_FILE.name}")
        elif r.outcome != exp.outcome or not re.search(exp.match, r.message):
            problems.append(f"{r.name} should fail ({exp.outcome}) with a message matching {exp.match!r} "
                            f"({exp.reason}), got {r.outcome}: {r.message[:200]}")
    assert not problems, f"{len(problems)} conformance problems:\n" + "\n".join(problems[:40])
    assert sum(r.passed for r in results) >= MIN_PASSED[backend][0 if full else 1]


class _Exploding(str):
    """A model 'path' whose use kills (or stalls) the worker process."""

    def __str__(self):
        import os
        import time
        if self.startswith("crash"):
            os._exit(3)
        time.sleep(30)
        return ""


def test_runner_records_crashes_and_timeouts_and_goes_on():
    cases = [C.Case("crash", "node", _Exploding("crash"), []),
             C.Case("hang", "node", _Exploding("hang"), []),
             C.Case("after", "node", _Exploding("crash"), [])]
    results = C.run_cases(cases, "interpreter", jobs=2, timeout=2)
    assert [r.outcome for r in results] == [C.CRASH, C.TIMEOUT, C.CRASH]
    assert "exit code 3" in results[0].message
