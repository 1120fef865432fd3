"""int8 3x3 stride-1 convolutions by Winograd's F(2x2, 3x3), F(4x4, 3x3) and F(4x2, 3x3) on AVX2
(kernels/qwinograd.py): exact in integers, so held bit for bit to the exact NumPy reference
of test_int8_kernels at 1, 2 and 3 threads, with 8-bit and 7-bit weights and the extremes
(weights -128 and 127 against activations -128 and 127: the largest transformed values
there are).  Each case runs with each tile shape, forced (MAX_TILE_WASTE, TALL_TILES),
whatever the output's size.  Compiled for x86-64-v3, which every x86-64 host these tests run on can run."""
from __future__ import annotations

import numpy as np
import pytest

from glowgen import pipeline
from glowgen.backends.cpu.kernels import qwinograd
from glowgen.engine.registry import Registry
from glowgen.engine.textual import parse_function
from glowgen.backends.cpu.qgemm import QShape
from test_int8_kernels import _compile, conv_case

CPU = "x86-64-v3"
EXTREMES = dict(w_values=[-128, 127], x_values=[-128, 127])
SEVEN_BITS = dict(w_values=np.arange(-64, 64))

CONVS = [
    # n, c, h, w, m, pads (stride 1, 3x3)
    (1, 64, 56, 56, 64, (1, 1, 1, 1)),     # ResNet's: tile rows of 28, output rows stored whole
    (1, 32, 28, 28, 40, (1, 1, 1, 1)),     # 14 tiles a row: the last vector overlaps
    (1, 16, 14, 14, 20, (1, 1, 1, 1)),     # 7 tiles a row: through the staging block
    (1, 24, 7, 7, 13, (1, 1, 1, 1)),       # 7 x 7: odd rows and columns, 13 filters (ragged)
    (2, 8, 17, 15, 10, (1, 1, 1, 1)),      # two images, odd sizes
    (1, 8, 20, 23, 7, (0, 0, 0, 0)),       # no padding
    (1, 10, 20, 21, 7, (1, 0, 2, 1)),      # uneven padding
    (1, 6, 40, 44, 16, (1, 1, 1, 1)),      # 22 tiles a row, 21 tile rows: bands share unevenly
    (1, 192, 10, 10, 178, (1, 1, 1, 1)),   # weights streamed: a split shares out filters
    (1, 128, 28, 28, 128, (1, 1, 1, 1)),   # ... but V large against them (F(4x4)): bands
]
STREAMED = 8
STREAMED_LARGE_V = 9


STRATEGIES = {2: qwinograd.STRATEGY, 4: qwinograd.STRATEGY4, (4, 2): qwinograd.STRATEGY42}


@pytest.fixture(params=[2, 4, (4, 2)], ids=["F(2x2)", "F(4x4)", "F(4x2)"])
def tile(request, monkeypatch):
    """F(2x2), F(4x4) or F(4x2) wherever it applies: tiles may then waste any share of the
    output."""
    _force_tile(monkeypatch, request.param)
    return request.param


def _check(case, rng, tile, bounds=None, strategy=None, **values):
    n, c, h, w, m, pads = case
    text, feeds, want = conv_case(rng, n, c, h, w, m, 3, (1, 1), pads, (1, 1), bounds=bounds, **values)
    strategy = strategy or STRATEGIES[tile]
    results = []
    for threads in (1, 2, 3):
        model, _ = _compile(text, CPU, threads, winograd=True)
        (plan,) = [i.plan for i in model.program.instrs if i.kind == "QuantizedConv"]
        assert plan.strategy == strategy, plan
        results.append(model.run(feeds)["y"])
        np.testing.assert_array_equal(results[-1], want)
    assert results[0].tobytes() == results[1].tobytes() == results[2].tobytes()


def _force_tile(monkeypatch, tile) -> None:
    """F(4x4) wherever it applies (any waste), else F(4x2) where it applies, else F(2x2):
    the F(4x2) cases' shapes all make fewer products by F(4x2) than by F(2x2)."""
    monkeypatch.setattr(qwinograd, "MAX_TILE_WASTE", 100.0 if tile == 4 else 0.0)
    monkeypatch.setattr(qwinograd, "TALL_TILES", tile == (4, 2))


# 7-bit weights take the same F(4x4) path as 8-bit ones; F(2x2) runs them.
@pytest.mark.parametrize("case", range(len(CONVS)))
@pytest.mark.parametrize("values, tile", [("eight bits", 2), ("seven bits", 2), ("extremes", 2),
                                          ("eight bits", 4), ("extremes", 4),
                                          ("eight bits", (4, 2)), ("seven bits", (4, 2)),
                                          ("extremes", (4, 2))])
def test_winograd_conv_exact(case, values, tile, monkeypatch):
    _force_tile(monkeypatch, tile)
    kwargs = {"eight bits": {}, "seven bits": SEVEN_BITS, "extremes": EXTREMES}[values]
    strategy = None
    if tile == 4 and case in (STREAMED, STREAMED_LARGE_V) and values == "extremes":
        # 64 x (192 x 9 x 255 x 128) leaves i32 (and of 128 channels): F(4x4)'s sums are out
        # of range, F(2x2)'s not.
        strategy = qwinograd.STRATEGY
    _check(CONVS[case], np.random.default_rng(400 + case), tile, strategy=strategy, **kwargs)


@pytest.mark.parametrize("size, strategy", [(56, "winograd4-madd16"), (28, "winograd4-madd16"),
                                            (14, "winograd4-madd16"), (10, "winograd42-madd16"),
                                            (9, "winograd42-madd16"), (7, "winograd42-madd16")])
def test_tile_size_follows_the_output(size, strategy):
    """F(4x4) where its tiles waste little of the output and make the fewest products
    (ResNet's sizes from 56 x 56 to 14 x 14: 16 x 16 computed for 14 x 14), F(4x2)
    otherwise: at 7 x 7, 24 products a vector of 8 tiles against F(4x4)'s 36 (a vector of
    4 tiles) and F(2x2)'s 2 x 16; at 10 x 10 (F(4x4) computing 12 x 12) 2 x 24 against
    F(2x2)'s 4 x 16."""
    text, _, _ = conv_case(np.random.default_rng(0), 1, 8, size, size, 8, 3, (1, 1), (1, 1, 1, 1), (1, 1))
    node = _node(text)
    w = np.ones((8, 8, 3, 3), np.int64)
    assert qwinograd.strategy(node, QShape("madd16"), True, w, np.zeros(8, np.int64)) == strategy


def test_streamed_weights_split_filters():
    n, c, h, w, m, _ = CONVS[STREAMED]
    text, _, _ = conv_case(np.random.default_rng(0), n, c, h, w, m, 3, (1, 1), (1, 1, 1, 1))
    node = _node(text)
    assert not qwinograd.QWinogradGeometry(node, 1).split_filters
    g = qwinograd.QWinogradGeometry(node, 2)
    assert g.split_filters
    # The first round transforms each task's channel pairs into a V they all read, after
    # the padded input in the scratch they share (the results at 1, 2 and 3 threads: test_winograd_conv_exact).
    assert qwinograd.phases(node, 2).shared == g.xp_bytes + g.v_bytes
    assert qwinograd.phases(node, 1).shared == g.xp_bytes


@pytest.mark.parametrize("case, tile, through_image", [(0, 4, False), (7, 2, False), (1, 4, True), (2, 2, True)])
def test_tasks_sharing_out_bands_build_their_own_rows(case, tile, through_image):
    """Split by bands, each task builds the rows of Xp its bands read in its own scratch
    (rows shorter than a vector step through its own padded image of the input rows they
    hold), in one round: no task reads what another wrote (the results at 1, 2 and 3
    threads: test_winograd_conv_exact)."""
    n, c, h, w, m, pads = CONVS[case]
    text, _, _ = conv_case(np.random.default_rng(0), n, c, h, w, m, 3, (1, 1), pads)
    node = _node(text)
    for parts in (2, 3):
        g = qwinograd.QWinogradGeometry(node, parts, tile)
        assert g.own_rows and not g.split_filters and g.bands >= parts
        assert g.through_image == through_image
        assert qwinograd.phases(node, parts, tile) is None


def test_streamed_weights_with_a_large_v_split_bands():
    """ResNet-50's 128 @28 by F(4x4): U is 1.2 MB, but the V each task would read whole is
    0.44x that (parallel.shares_pixels): one band of half the tile rows a task, every filter,
    each its own rows of Xp and V (the results at 1, 2 and 3 threads: test_winograd_conv_exact)."""
    n, c, h, w, m, _ = CONVS[STREAMED_LARGE_V]
    text, _, _ = conv_case(np.random.default_rng(0), n, c, h, w, m, 3, (1, 1), (1, 1, 1, 1))
    node = _node(text)
    g = qwinograd.QWinogradGeometry(node, 2, 4)
    assert g.streamed and not g.split_filters and g.rows == 4 and g.bands == 2
    assert g.own_rows and qwinograd.phases(node, 2, 4) is None
    assert qwinograd.work(node, 4).items == g.th


def test_scratch_holds_every_split():
    """A task's bands depend on how many tasks share them; the scratch the kernel is given
    (computed without knowing) holds the largest."""
    for n, c, h, w, m, pads in CONVS + [(1, 64, 28, 56, 64, (1, 1, 1, 1)), (1, 32, 56, 56, 48, (1, 1, 1, 1))]:
        text, _, _ = conv_case(np.random.default_rng(0), n, c, h, w, m, 3, (1, 1), pads)
        node = _node(text)
        for tile in (2, 4, (4, 2)):
            most = qwinograd.QWinogradGeometry(node, m=tile).most_scratch()
            for parts in range(1, 9):
                g = qwinograd.QWinogradGeometry(node, parts, tile)
                assert g.v_bytes + g.m_bytes + g.z_bytes <= most, (node, parts, tile)


def test_requantization_out_of_i32_range(tile):
    """A result scale so small that the requantized sums leave the i32 range: the output
    transform's requantization runs in f32 and saturates (qgemm.requantize), as the direct
    product's."""
    n, c, h, w, m, pads = CONVS[2]
    text, feeds, want = conv_case(np.random.default_rng(460), n, c, h, w, m, 3, (1, 1), pads, ys=1e-9)
    assert np.any(want == 127) and np.any(want == -128)
    for threads in (1, 2):
        model, _ = _compile(text, CPU, threads, winograd=True)
        (plan,) = [i.plan for i in model.program.instrs if i.kind == "QuantizedConv"]
        assert plan.strategy == STRATEGIES[tile], plan
        assert plan.packed == "a", plan
        np.testing.assert_array_equal(model.run(feeds)["y"], want)


def test_winograd_conv_saturates_to_its_bounds(tile):
    """A fused ReLU's bounds (the result's low and high) saturate as the direct product's."""
    _check(CONVS[1], np.random.default_rng(420), tile, bounds=(-3, 90))


@pytest.mark.parametrize("change, why", [
    (dict(c=9), "odd channels: no whole pairs"),
    (dict(strides=(2, 2)), "stride 2"),
    (dict(k=5), "5x5"),
    (dict(h=6, w=6), "36 output pixels"),
    (dict(group=2), "grouped"),
])
def test_winograd_only_where_it_applies(change, why):
    args = dict(n=1, c=8, h=16, w_=16, m=8, k=3, strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), group=1)
    args.update({("w_" if key == "w" else key): v for key, v in change.items()})
    text, feeds, want = conv_case(np.random.default_rng(430), **args)
    model, _ = _compile(text, CPU, 1, winograd=True)
    (plan,) = [i.plan for i in model.program.instrs if i.kind == "QuantizedConv"]
    assert plan.strategy not in qwinograd.TILES, why
    np.testing.assert_array_equal(model.run(feeds)["y"], want)


def test_winograd_off_and_on_vnni():
    """winograd=False keeps the direct product; so does a target with VNNI, whose 64 products
    an instruction beat 2.25x fewer at 16 an instruction."""
    text, feeds, want = conv_case(np.random.default_rng(440), 1, 16, 16, 16, 16, 3, (1, 1), (1, 1, 1, 1))
    assert not qwinograd.covers(_node(text), QShape("vnni"))
    assert qwinograd.covers(_node(text), QShape("madd16")) and qwinograd.covers(_node(text), QShape("ubsw"))
    model, _ = _compile(text, CPU, 1, winograd=False)
    (plan,) = [i.plan for i in model.program.instrs if i.kind == "QuantizedConv"]
    assert plan.strategy == "madd16", plan


def _node(text):
    """The lowered graph's QuantizedConv (not compiled: its geometry needs only the node)."""
    registry = Registry.default()
    fn = parse_function(text, registry)
    pipeline.run(fn, registry, pipeline.PIPELINE, "cpu")
    (node,) = [n for n in fn.nodes if n.OP == "QuantizedConv"]
    return node


def test_sums_out_of_range_stay_direct():
    """POW2 (sum + bias) must fit i32 (the output transform computes it exactly): 4 x for
    F(2x2), 64 x for F(4x4), 16 x for F(4x2)."""
    w = np.full((2, 8, 3, 3), 127, np.int8)
    assert qwinograd.sums_in_range(w, np.array([5000, -5000]))
    assert not qwinograd.sums_in_range(w, np.array([2 ** 29, 0]))
    assert qwinograd.sums_in_range(w, np.array([2 ** 24, 0]), 2)
    assert not qwinograd.sums_in_range(w, np.array([2 ** 25, 0]), 4)
    assert qwinograd.sums_in_range(w, np.array([2 ** 24, 0]), 4)
    assert qwinograd.sums_in_range(w, np.array([2 ** 26, 0]), (4, 2))
    assert not qwinograd.sums_in_range(w, np.array([2 ** 27, 0]), (4, 2))


def test_transformed_weights_are_scaled_g_g_gt():
    """U = (S G) g (S G)^T is S (G g G^T) S (S: 2 for every row of F(2x2)'s G; 4, 6, 6, 24,
    24, 1 for F(4x4)'s), within i16 for any int8 filter."""
    from glowgen.backends.cpu.kernels.conv_winograd import TRANSFORMS
    g = np.random.default_rng(450).integers(-128, 128, (3, 2, 3, 3))
    for m, scales, largest in ((2, [2, 2, 2, 2], 9 * 128), (4, [4, 6, 6, 24, 24, 1], 49 * 128)):
        _, gt, _ = TRANSFORMS[m]
        s = np.array(scales, np.float64)
        want = np.einsum("i,ik,mckl,jl,j->ijmc", s, gt, g.astype(np.float64), gt, s).reshape((m + 2) ** 2, 3, 2)
        np.testing.assert_allclose(qwinograd.transformed_weights(g, m), want, atol=1e-9)
        worst = qwinograd.transformed_weights(np.full((1, 1, 3, 3), -128), m)
        assert np.abs(worst).max() == largest < 2 ** 15
    # F(4x2): F(4)'s rows of G down the filter, F(2)'s across it
    (_, g4, _), (_, g2, _) = TRANSFORMS[4], TRANSFORMS[2]
    s4, s2 = np.array([4, 6, 6, 24, 24, 1], np.float64), np.full(4, 2.0)
    want = np.einsum("i,ik,mckl,jl,j->ijmc", s4, g4, g.astype(np.float64), g2, s2).reshape(24, 3, 2)
    np.testing.assert_allclose(qwinograd.transformed_weights(g, (4, 2)), want, atol=1e-9)
    assert np.abs(qwinograd.transformed_weights(np.full((1, 1, 3, 3), -128), (4, 2))).max() == 21 * 128


@pytest.mark.parametrize("m", [2, 4, (4, 2)], ids=["F(2x2)", "F(4x4)", "F(4x2)"])
def test_integer_transforms_give_the_scaled_direct_sum(m):
    """(L_h A_h^T S_h^-1) [U .* V] (L_w A_w^T S_w^-1)^T is L_h L_w x the direct sum, and
    ODD's inverse modulo 2^32 leaves POW2 x it, in wrapping i32 arithmetic (NumPy, int64
    reduced)."""
    t = qwinograd.INTEGER[m]
    h, w = m if isinstance(m, tuple) else (m, m)
    rng = np.random.default_rng(470 + h + w)
    d = rng.integers(-255, 256, (16, h + 2, w + 2))
    g = rng.integers(-128, 128, (16, 3, 3))
    v = np.einsum("ij,cjk,lk->cil", t.down.b_t, d, t.across.b_t)
    u = np.einsum("ij,cjk,lk->cil", t.down.kt, g, t.across.kt)
    assert np.abs(v).max() <= t.v_max and np.abs(u).max() <= t.u_max
    wrap = lambda a: (a + 2 ** 31) % 2 ** 32 - 2 ** 31      # noqa: E731
    y = wrap(t.down.a_t @ wrap((u * v).sum(0)) @ t.across.a_t.T)
    direct = np.array([[(d[:, i:i + 3, j:j + 3] * g).sum() for j in range(w)] for i in range(h)])
    assert t.pow2 * t.odd == {2: 4, 4: 576, (4, 2): 48}[m]
    np.testing.assert_array_equal(wrap(y * t.inverse), t.pow2 * direct)


class _NumpyBuilder:
    """An IRBuilder's add, sub and mul over NumPy int64 arrays (integer_forms' only
    instructions), counting them."""

    def __init__(self):
        self.count = 0

    def add(self, a, b):
        self.count += 1
        return _Vec(a.v + b.v)

    def sub(self, a, b):
        self.count += 1
        left = np.zeros_like(b.v) if not isinstance(a, _Vec) else a.v
        return _Vec(left - b.v)

    def mul(self, c, a):
        self.count += 1
        return _Vec(np.array([k.constant for k in c.constant], np.int64) * a.v)


class _Vec:
    def __init__(self, v):
        from llvmlite import ir
        self.v, self.type = v, ir.VectorType(ir.IntType(64), len(v))


def _transform_cases():
    rng = np.random.default_rng(7)
    cases = [qwinograd.INTEGER[m].b_t for m in (2, 4)] + [qwinograd.INTEGER[m].a_t for m in (2, 4)]
    for _ in range(40):
        rows, cols = rng.integers(1, 8, size=2)
        m = rng.choice([-8, -4, -2, -1, 0, 0, 0, 1, 2, 3, 4, 5, 24], size=(rows, cols))
        m[:, 0] = np.where((m == 0).all(1), 1, m[:, 0])       # no empty row
        cases.append(m)
    return cases


@pytest.mark.parametrize("matrix", _transform_cases())
def test_integer_forms_compute_the_matrix_product(matrix):
    """combine_integer's shared groups and paired rows (integer_forms.py) give matrix @ xs,
    for the transforms and random integer matrices."""
    from glowgen.backends.cpu.kernels.integer_forms import combine_integer
    xs = np.random.default_rng(1).integers(-1000, 1000, size=(matrix.shape[1], 8))
    out = combine_integer(_NumpyBuilder(), matrix, [_Vec(x) for x in xs])
    np.testing.assert_array_equal(np.array([o.v for o in out]), np.asarray(matrix, np.int64) @ xs)


def test_integer_forms_share_terms():
    """F(4x4)'s transforms in fewer instructions than a product a coefficient: 18 for
    B^T's six rows (28 term by term), 20 for the output's four (30)."""
    from glowgen.backends.cpu.kernels.integer_forms import combine_integer
    for matrix, most in ((qwinograd.INTEGER[4].b_t, 18), (qwinograd.INTEGER[4].a_t, 20)):
        b = _NumpyBuilder()
        combine_integer(b, matrix, [_Vec(np.arange(8)) for _ in range(matrix.shape[1])])
        assert b.count <= most
