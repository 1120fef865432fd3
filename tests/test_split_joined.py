"""Joined steps (backends/cpu/joining.py): a split step that reads only the channels the same
task of the step before computed runs in that step's round of tasks, task p right after
task p, with no wait between them.  MobileNetV2's inverted residual block: the expansion
(pointwise, or transposed at small planes) shares out its filters as the depthwise
convolution after it shares out its channels.  Against onnxruntime, and bit for bit across
thread counts."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import glowgen
from conftest import assert_close, make_model, run_ort

CASES = {
    # name: (channels in, expanded channels, plane, depthwise stride)
    "pointwise expansion @28": (32, 192, 28, 1),
    "pointwise expansion @56, stride 2": (24, 144, 56, 2),
    "transposed expansion @14": (64, 384, 14, 1),
    "transposed expansion @7": (160, 960, 7, 1),
}


def _block(cin, mid, size, stride, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, cin, size, size)).astype(np.float32)
    weights = {
        "we": (rng.standard_normal((mid, cin, 1, 1)) * 0.1).astype(np.float32),
        "be": rng.standard_normal(mid).astype(np.float32),
        "wd": (rng.standard_normal((mid, 1, 3, 3)) * 0.3).astype(np.float32),
        "bd": rng.standard_normal(mid).astype(np.float32),
        "wp": (rng.standard_normal((cin, mid, 1, 1)) * 0.1).astype(np.float32),
        "lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32),
    }
    nodes = [helper.make_node("Conv", ["x", "we", "be"], ["e"]),
             helper.make_node("Clip", ["e", "lo", "hi"], ["er"]),
             helper.make_node("Conv", ["er", "wd", "bd"], ["d"], group=mid, pads=[1, 1, 1, 1],
                              strides=[stride, stride]),
             helper.make_node("Clip", ["d", "lo", "hi"], ["dr"]),
             helper.make_node("Conv", ["dr", "wp"], ["y"])]
    return make_model(nodes, {"x": x}, ["y"], weights), x


def _joined(compiled) -> list[str]:
    from glowgen.backends.cpu.stacking import describe_step
    return [describe_step(step) for step in compiled.program.plan.steps if step.joined]


@pytest.mark.parametrize("case", list(CASES))
def test_joined_depthwise_matches_onnxruntime_and_every_thread_count(case):
    model, x = _block(*CASES[case])
    two = glowgen.compile(model, threads=2)
    if two.program.plan.gemm_shape.vw == 16:      # the splits the cases were chosen for
        assert len(_joined(two)) == 1 and "groups" in _joined(two)[0], two.program.plan.describe()
    y2 = two.run({"x": x})["y"]
    assert_close({"y": y2}, run_ort(model, {"x": x}), rtol=1e-4, atol=1e-4)
    for threads in (1, 3):
        np.testing.assert_array_equal(glowgen.compile(model, threads=threads).run({"x": x})["y"], y2)


def test_a_depthwise_convolution_is_not_joined_to_a_split_by_pixels():
    """An expansion that shares out its pixels (or columns) gives a task no whole channels:
    the depthwise convolution after it waits for every task."""
    model, x = _block(4, 24, 56, 1)        # 24 filters: three blocks of 8, split by columns
    two = glowgen.compile(model, threads=2)
    assert _joined(two) == [], two.program.plan.describe()
    np.testing.assert_array_equal(two.run({"x": x})["y"], glowgen.compile(model, threads=1).run({"x": x})["y"])


def test_profile_of_joined_steps_times_each_task():
    model, x = _block(*CASES["pointwise expansion @28"])
    compiled = glowgen.compile(model, threads=2, profile=True)
    compiled.run({"x": x})
    steps = compiled.program.plan.steps
    tasks = compiled.task_profile()
    for i, step in enumerate(steps):
        if step.joined:
            assert all(c > 0 for c in tasks[i]) and all(c > 0 for c in tasks[i - 1])


def test_bench_profile_shows_a_joined_step_in_the_round_before(tmp_path, capsys):
    """`glowgen bench --profile`: a joined step has no time of its own (it runs in the round
    of the step before, whose time covers both), so it is marked joined with its tasks' times,
    and the step before says it includes it -- not a step of 0.000 ms."""
    import re
    import onnx
    from glowgen.cli import main
    model, _ = _block(*CASES["pointwise expansion @28"])
    path = tmp_path / "block.onnx"
    onnx.save(model, path)
    assert main(["bench", str(path), "--threads", "2", "--runs", "3", "--warmup", "1", "--profile",
                 "--compare", "none"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^ +joined +Conv\+Clip \[1, 192, 28, 28\] 3x3 .*\[[\d.]+ [\d.]+\] \(in the round of the "
                     r"step before", out, re.M), out
    assert re.search(r"ms +Conv\+Clip \[1, 192, 28, 28\] 1x1 .*\(\+ the joined step after it\)", out), out
    assert not re.search(r" 0\.000 ms", out), out
