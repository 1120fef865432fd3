"""The PyTorch front door: glowgen.from_torch and torch.compile(backend="glowgen"), each
checked against eager PyTorch (the oracle) at rtol 1e-4.

The main test venv has no PyTorch: there this file is skipped, with the reason below.  CI runs
it in a venv of its own with the CPU wheel (.ci/run), with GLOWGEN_REQUIRE_TORCH=1: a missing
torch is then an error, not a skip."""
import os
import subprocess
import sys

import numpy as np
import pytest

SKIP_REASON = ("PyTorch front door: needs torch (pip install -e '.[test,torch]'; "
               "CI runs these in .venv-torch)")

if os.environ.get("GLOWGEN_REQUIRE_TORCH"):
    import torch
else:
    torch = pytest.importorskip("torch", reason=SKIP_REASON)

import glowgen  # noqa: E402
from glowgen.frontend import torch_dynamo  # noqa: E402

from torch_models import MODELS, build  # noqa: E402

RTOL, ATOL = 1e-4, 1e-5       # atol for the elements near zero


def assert_matches(got, want):
    got_leaves = got if isinstance(got, tuple) else (got,)
    want_leaves = want if isinstance(want, tuple) else (want,)
    assert type(got) is type(want) and len(got_leaves) == len(want_leaves)
    for g, w in zip(got_leaves, want_leaves):
        assert isinstance(g, torch.Tensor) and g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=RTOL, atol=ATOL)


def eager(module, inputs):
    with torch.no_grad():
        return module(*inputs)


@pytest.mark.parametrize("name", MODELS)
def test_torch_compile_backend(name):
    from torch._dynamo.utils import counters
    module, make_inputs, n_graphs = build(name)
    torch._dynamo.reset()
    before = dict(torch_dynamo.stats)
    compiled = torch.compile(module, backend="glowgen", options={"fallback": False})
    with torch.no_grad():
        first = compiled(*make_inputs(1))
    assert_matches(first, eager(module, make_inputs(1)))
    graphs = counters["stats"]["unique_graphs"]
    assert torch_dynamo.stats["compiled"] - before["compiled"] == n_graphs
    # A second call with the same shapes: no new dynamo graph, no new glowgen compilation.
    with torch.no_grad():
        second = compiled(*make_inputs(2))
    assert_matches(second, eager(module, make_inputs(2)))
    assert counters["stats"]["unique_graphs"] == graphs
    assert torch_dynamo.stats["compiled"] - before["compiled"] == n_graphs
    assert torch_dynamo.stats["eager_calls"] == before["eager_calls"]
    assert torch_dynamo.stats["fallbacks"] == before["fallbacks"]


@pytest.mark.parametrize("name", MODELS)
def test_from_torch(name):
    module, make_inputs, _ = build(name)
    compiled = glowgen.from_torch(module, make_inputs(1))
    assert isinstance(compiled.compiled, glowgen.CompiledModel)
    native = compiled.compiled
    for seed in (1, 2):
        assert_matches(compiled(*make_inputs(seed)), eager(module, make_inputs(seed)))
    assert compiled.compiled is native


def test_new_shapes_compile_once_each():
    """Dynamo makes the graph dynamic at the second shape (SymInt inputs), a graph that then
    serves the first shape too; glowgen compiles one native model per concrete shape of it
    and reuses them."""
    module, _, _ = build("mlp")
    torch._dynamo.reset()
    before = torch_dynamo.stats["compiled"]
    compiled = torch.compile(module, backend="glowgen", options={"fallback": False})
    counts = []
    with torch.no_grad():
        for batch in (3, 5, 3, 5, 3):
            x = torch.randn(batch, 20)
            assert_matches(compiled(x), eager(module, (x,)))
            counts.append(torch_dynamo.stats["compiled"] - before)
    # static graph for 3; dynamic graph: 5, then 3; then only cache hits.
    assert counts == [1, 2, 3, 3, 3]


def test_weights_changed_in_place_recompile():
    """The backend freezes the weights; writing to one must not leave a stale model."""
    module, make_inputs, _ = build("mlp")
    torch._dynamo.reset()
    before = torch_dynamo.stats["compiled"]
    compiled = torch.compile(module, backend="glowgen", options={"fallback": False})
    x = make_inputs(1)
    with torch.no_grad():
        compiled(*x)
        module.net[0].weight.mul_(-1.0)
        assert_matches(compiled(*x), eager(module, x))
    assert torch_dynamo.stats["compiled"] - before == 2


def test_call_needing_gradients_runs_eagerly():
    module, make_inputs, _ = build("mlp")
    torch._dynamo.reset()
    compiled = torch.compile(module, backend="glowgen")
    before = torch_dynamo.stats["eager_calls"]
    out = compiled(*make_inputs(1))
    assert out.requires_grad                       # autograd still works through it
    out.sum().backward()
    assert module.net[0].weight.grad is not None
    assert torch_dynamo.stats["eager_calls"] == before + 1
    assert_matches(out.detach(), eager(module, make_inputs(1)))


@pytest.fixture(scope="module")
def mlp_from_torch():
    module, make_inputs, _ = build("mlp")
    return module, make_inputs, glowgen.from_torch(module, make_inputs(1))


def test_outputs_share_memory_with_the_runner_arrays(mlp_from_torch):
    """No copies on the way out: the returned tensor is the array the native code wrote."""
    module, make_inputs, compiled = mlp_from_torch
    a = compiled(*make_inputs(1))
    b = compiled(*make_inputs(2))
    assert a.data_ptr() != b.data_ptr()           # a is alive: b did not reuse its memory
    assert_matches(a, eager(module, make_inputs(1)))


def test_from_torch_wrong_input_is_a_glowgen_error(mlp_from_torch):
    module, make_inputs, compiled = mlp_from_torch
    with pytest.raises(glowgen.GlowgenError, match="shape"):
        compiled(torch.zeros(5, 20))
    with pytest.raises(glowgen.GlowgenError, match="takes 1 tensors"):
        compiled(*make_inputs(1), *make_inputs(1))
    with pytest.raises(glowgen.GlowgenError, match="bfloat16"):
        compiled(make_inputs(1)[0].bfloat16())


class Unsupported(torch.nn.Module):
    """Singular values: neither ONNX exporter converts them."""

    def forward(self, x):
        return torch.linalg.svdvals(x) + 1


def test_graph_glowgen_cannot_compile_runs_eagerly():
    module, x = Unsupported(), torch.randn(4, 4)
    torch._dynamo.reset()
    before = dict(torch_dynamo.stats)
    with torch.no_grad():
        out = torch.compile(module, backend="glowgen")(x)
    assert_matches(out, eager(module, (x,)))
    assert torch_dynamo.stats["fallbacks"] == before["fallbacks"] + 1
    torch._dynamo.reset()
    strict = torch.compile(module, backend="glowgen", options={"fallback": False})
    with torch.no_grad(), pytest.raises(glowgen.GlowgenError, match="linalg_svd"):
        strict(x)
    with pytest.raises(glowgen.GlowgenError, match="could not export Unsupported to ONNX"):
        glowgen.from_torch(module, x)


class BranchOnValue(torch.nn.Module):
    """A branch on a tensor's value: torch.export refuses it (data-dependent control flow),
    the TorchScript tracer records the branch the example takes."""

    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x - 1


def test_torchscript_exporter_when_dynamo_export_fails(caplog):
    module, x = BranchOnValue(), torch.ones(2, 3)
    with caplog.at_level("WARNING", logger="glowgen.torch"):
        compiled = glowgen.from_torch(module, x)
    assert compiled.exporter == "torchscript"
    assert "TorchScript exporter" in caplog.text
    assert "may not hold for other inputs" in caplog.text     # the tracer's branch warning
    assert_matches(compiled(x * 3), eager(module, (x * 3,)))


def test_backend_registered_by_entry_point():
    assert "glowgen" in torch._dynamo.list_backends()


def test_import_glowgen_does_not_import_torch():
    code = ("import sys, glowgen; glowgen.compile; glowgen.from_torch; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
