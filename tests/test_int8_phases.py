"""A split int8 product over one image and one group runs in two phases (plan.Phases,
qlinalg.q_phases): its tasks build the plane together, each its share of the channel groups,
into scratch they share, then compute from it (but a small plane built in vectors each task
builds whole, in one phase: qlinalg.PHASED_PLANE_MIN_BYTES); or, when it is split over pixels, in one,
each task building the plane of its own pixels (qlinalg.owns_pixels): its input interleaved,
or the padded and strided plane's rows its pixels' taps read.  Exact against NumPy, bit for
bit across thread counts, on VNNI and AVX2 code, and with concurrent calls."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from glowgen.backends.cpu.kernels.qlinalg import PHASED_PLANE_MIN_BYTES, Geometry
from glowgen.backends.cpu.kernels.qplanes import builds_rows_in_vectors, interleaves_in_bands
from glowgen.backends.cpu.qgemm import QSHAPES, QShape
from test_int8_kernels import CPUS, RUNNABLE_CPUS, _compile, conv_case

CASES = [
    # n, c, h, w, m, k, strides, pads: products whose weights outweigh their plane, so that
    # they share out filters (qlinalg.splits_pixels): in the lanes, at stride 2, ragged groups
    (1, 192, 7, 7, 256, 1, (1, 1), (0, 0, 0, 0)),
    (1, 128, 14, 14, 192, 3, (2, 2), (1, 1, 1, 1)),     # 6 tiles of 32 features: 2 or 3 tasks
    (1, 20, 14, 14, 256, 3, (2, 2), (1, 0, 1, 2)),
    (2, 64, 28, 28, 64, 3, (1, 1), (1, 1, 1, 1)),        # batch 2: unphased
    (1, 256, 22, 22, 384, 3, (1, 1), (1, 1, 1, 1)),      # a plane of 144 KB: phased everywhere
]


def _shares_plane(model) -> bool:
    """Whether the product's plane is one its split builds in shares (else each task whole)."""
    ins = [i for i in model.program.instrs if i.kind == "QuantizedConv"][0]
    geo = Geometry(ins.node, QShape(ins.plan.strategy))
    return not builds_rows_in_vectors(geo) or geo.plane_bytes >= PHASED_PLANE_MIN_BYTES


@pytest.mark.parametrize("cpu", CPUS)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_phased_int8_product_is_exact_for_every_thread_count(case, cpu):
    n, c, h, w, m, k, s, p = CASES[case]
    text, feeds, want = conv_case(np.random.default_rng(case), n, c, h, w, m, k, s, p)
    for threads in (1, 2, 3):
        model, _ = _compile(text, cpu, threads)
        phases = [step.phases for step in model.program.plan.steps if step.instrs[0].kind == "QuantizedConv"]
        assert phases == [2 if threads > 1 and n == 1 and _shares_plane(model) else 1], model.program.plan.describe()
        if case == len(CASES) - 1 and threads > 1:
            assert phases == [2]
        np.testing.assert_array_equal(model.run(feeds)["y"], want)


def test_concurrent_calls_keep_their_shared_plane_apart():
    """The shared scratch lies in each call's own activation region."""
    rng = np.random.default_rng(7)
    cases = [conv_case(np.random.default_rng(9), 1, 64, 28, 28, 64, 3, (1, 1), (1, 1, 1, 1))]
    text = cases[0][0]
    model, _ = _compile(text, None, 2)
    xs = [rng.integers(-128, 128, (1, 64, 28, 28)).astype(np.int8) for _ in range(6)]
    want = [model.run({"x": x})["y"] for x in xs]
    with ThreadPoolExecutor(3) as pool:
        got = list(pool.map(lambda x: model.run({"x": x})["y"], xs * 5))
    for i, y in enumerate(got):
        np.testing.assert_array_equal(y, want[i % len(xs)])


OWN_PIXELS = [
    # n, c, h, w, m, k, strides, pads; whether 2 tasks build their own pixels' plane
    ((1, 16, 56, 56, 96, 1), True),                         # 1x1 at 56x56: panels of pixels
    ((1, 24, 30, 30, 40, 3, (1, 1), (0, 0, 0, 0)), True),   # 3x3 without padding: taps past a share
    # planes large against the weights (qlinalg.splits_pixels): each task builds the rows of
    # the padded plane (and at stride 2, of each phase) its pixels' taps read
    ((1, 64, 30, 30, 64, 3, (1, 1), (1, 1, 1, 1)), True),
    ((1, 20, 62, 54, 48, 3, (2, 2), (1, 0, 1, 2)), True),   # ragged channel groups
    ((1, 576, 14, 14, 96, 1), None),     # VNNI: 3 tiles of features in the lanes, split by rows
]


@pytest.mark.parametrize("cpu", RUNNABLE_CPUS)
@pytest.mark.parametrize("case", range(len(OWN_PIXELS)))
def test_tasks_building_their_own_pixels_plane_are_exact(case, cpu):
    args, owns = OWN_PIXELS[case]
    text, feeds, want = conv_case(np.random.default_rng(500 + case), *args)
    results = []
    for threads in (1, 2, 3):
        model, _ = _compile(text, cpu, threads)
        steps = [s for s in model.program.plan.steps if s.instrs[0].kind == "QuantizedConv"]
        if threads == 2 and owns is not None:
            assert (steps[0].parts, steps[0].phases) == (2, 1 if owns else 2), model.program.plan.describe()
        results.append(model.run(feeds)["y"])
        np.testing.assert_array_equal(results[-1], want, err_msg=f"{cpu} {threads} threads")
    assert all(r.tobytes() == results[0].tobytes() for r in results)


CLAIMED = [
    # n, c, h, w, m, k, strides, pads: split by filters, claimed as the tasks go
    (1, 256, 22, 22, 384, 3, (1, 1), (1, 1, 1, 1)),     # a plane of 144 KB built in shares
    (1, 128, 14, 14, 192, 3, (2, 2), (1, 1, 1, 1)),     # a small plane each task builds whole
    (1, 192, 7, 7, 256, 1, (1, 1), (0, 0, 0, 0)),       # features in the lanes
    # split by pixels, claimed in runs of panels, each run building its plane rows first
    (1, 20, 62, 54, 48, 3, (2, 2), (1, 0, 1, 2)),       # stride 2, asymmetric pads
    (1, 16, 56, 56, 96, 1, (1, 1), (0, 0, 0, 0)),       # the input interleaved
    (1, 64, 30, 30, 576, 3, (1, 1), (1, 1, 1, 1)),      # at nine tasks, claim words on two lines
]
_VBMI2 = "avx512_vbmi2" in open("/proc/cpuinfo").read()


@pytest.mark.parametrize("case", range(len(CLAIMED)))
def test_tasks_claiming_work_compute_each_once_every_run(case):
    """Tasks claiming their blocks of filters (features' tiles), or runs of panels, from a
    counter as they go (qlinalg.claims_work, parallel.for_claimed): every one once, in
    every run (the claim words zeroed before each) and in concurrent calls (each its own);
    more tasks than vCPUs (stealing from each other's shares), and than a cache line of
    claim words holds."""
    n, c, h, w, m, k, s, p = CLAIMED[case]
    text, feeds, want = conv_case(np.random.default_rng(700 + case), n, c, h, w, m, k, s, p)
    for threads in (2, 3, 9):
        model, _ = _compile(text, None, threads)
        ins = [i for i in model.program.instrs if i.kind == "QuantizedConv"][0]
        if _VBMI2 and (threads < 9 or case == len(CLAIMED) - 1):
            assert ins.plan.phases is not None and ins.plan.phases.claims, model.program.plan.describe()
            assert ins.plan.phases.claim_bytes == (128 if threads == 9 else 64)
        for _ in range(3):
            np.testing.assert_array_equal(model.run(feeds)["y"], want, err_msg=f"{threads} threads")
        xs = [np.random.default_rng(i).integers(-128, 128, (n, c, h, w)).astype(np.int8) for i in range(4)]
        alone = [model.run({"x": x})["y"] for x in xs]
        with ThreadPoolExecutor(3) as pool:
            together = list(pool.map(lambda x: model.run({"x": x})["y"], xs * 3))
        for i, y in enumerate(together):
            np.testing.assert_array_equal(y, alone[i % len(xs)])


BANDED = [
    # n, c, h, w, m, k: 1x1s whose interleaved plane (>= INTERLEAVE_BANDS_MIN_BYTES) is
    # built a band of panels at a time, each band's tiles computed before the next
    (1, 128, 46, 47, 64, 1),        # 2,162 pixels: a last band of 50 (one step of 16, then 2)
    (2, 160, 40, 41, 40, 1),        # two images; 40 filters, the last block of 8 ragged
]


@pytest.mark.parametrize("cpu", RUNNABLE_CPUS)
@pytest.mark.parametrize("case", range(len(BANDED)))
def test_interleaved_plane_in_bands_is_exact(case, cpu):
    """A 1x1's plane, its input interleaved, built band by band into the task's own
    scratch (qplanes.interleaves_in_bands): exact against NumPy at 1-3 threads (at two
    and three each task's bands over its own pixels, or over every pixel for its filters)."""
    text, feeds, want = conv_case(np.random.default_rng(800 + case), *BANDED[case])
    for threads in (1, 2, 3):
        model, _ = _compile(text, cpu, threads)
        ins = [i for i in model.program.instrs if i.kind == "QuantizedConv"][0]
        if threads == 1 and ins.plan.strategy in QSHAPES:
            geo = Geometry(ins.node, QShape(ins.plan.strategy))
            assert interleaves_in_bands(geo), model.program.plan.describe()
            assert ins.plan.scratch < geo.plane_bytes / 8          # a band's scratch, not the plane's
        np.testing.assert_array_equal(model.run(feeds)["y"], want, err_msg=f"{cpu} {threads} threads")
