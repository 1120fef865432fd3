"""Differential fuzzing in CI: a couple of hundred random valid graphs (tools/fuzz.py, fixed
seed) on each backend, compared with onnxruntime: no mismatch and no crash.  A failure names
the shrunk test case written under the test's temporary directory; tools/fuzz.py replays a
graph alone with --seed 2026 --first INDEX --count 1."""
from __future__ import annotations

import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "tools"))
import fuzz  # noqa: E402

COUNT = 200


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_random_graphs_match_onnxruntime(backend, tmp_path):
    summary = fuzz.fuzz(COUNT, seed=2026, backend=backend, out=tmp_path)
    report = "\n".join(f"graph {i}: {o.kind}: {o.detail} ({p})" for i, o, p in summary.findings)
    assert summary.mismatches == 0 and summary.crashes == 0, report
    # The generator builds what both engines take: few graphs skipped or rejected.
    assert summary.graphs >= 0.9 * COUNT and summary.skipped <= 0.05 * COUNT, summary.reasons


def test_a_graph_is_rebuilt_the_same_from_its_seed_and_index():
    a, b = fuzz.build(7, 31), fuzz.build(7, 31)
    assert a.model.SerializeToString() == b.model.SerializeToString()
    assert a.feeds.keys() == b.feeds.keys()
