#!/usr/bin/env python3
"""ResNet-18 written in PyTorch: latency of eager PyTorch, torch.compile(backend="inductor")
(if it works on this machine), torch.compile(backend="glowgen"), glowgen.from_torch, and
onnxruntime on the same ONNX export, all at the same thread count, measured side by side.

    .venv-torch/bin/python tools/torch_bench.py [--threads N] [--rounds 5] [--runs 10]
                                                [--no-inductor] [--batch 1] [--size 224]

Needs the `torch` extra (pip install -e '.[test,torch]').  torchvision is not used: the
network is written here, after torchvision's resnet18 (ResNet v1.5, BasicBlock [2, 2, 2, 2]),
with random weights and BatchNorm statistics (fixed seed) in eval mode.

The runners take turns: each round times `--runs` calls of every runner in turn and the median
per call of the best round is reported, so that a neighbour's load on a shared machine falls on
all of them alike.  Every runner's output is checked against eager PyTorch first.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

# PyTorch's OpenMP threads spin while they wait (OMP_WAIT_POLICY=active); on a machine other
# processes share, a descheduled spinner stalls every parallel region: ResNet-18 on 2 threads
# took 400-1300 ms instead of 110 ms at load 11 on 2 cores.  glowgen's workers spin briefly
# and then sleep; make PyTorch's wait passively too unless the caller chose.  (OpenMP reads
# this when torch is imported, so it must be set before.)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from torch import nn  # noqa: E402


class BasicBlock(nn.Module):
    def __init__(self, inp, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inp, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + identity)


class ResNet18(nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.inplanes = 64
        self.layer1 = self._layer(64, 1)
        self.layer2 = self._layer(128, 2)
        self.layer3 = self._layer(256, 2)
        self.layer4 = self._layer(512, 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes)

    def _layer(self, planes, stride):
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes, 1, stride, bias=False),
                                       nn.BatchNorm2d(planes))
        blocks = [BasicBlock(self.inplanes, planes, stride, downsample), BasicBlock(planes, planes)]
        self.inplanes = planes
        return nn.Sequential(*blocks)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(seed: int = 1234) -> nn.Module:
    torch.manual_seed(seed)
    model = ResNet18()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.1)
    return model.eval()


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def time_calls(fn, x, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(),
                    help="threads for every runner (default: torch.get_num_threads())")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=10, help="timed calls per runner per round")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--no-inductor", action="store_true", help="skip torch.compile(inductor)")
    args = ap.parse_args(argv)

    import glowgen
    from glowgen.frontend import torch_dynamo

    torch.set_num_threads(args.threads)
    model = resnet18()
    x = torch.randn(args.batch, 3, args.size, args.size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(x)

    runners: dict[str, object] = {"eager": model}
    compile_times: dict[str, float] = {}
    if not args.no_inductor:
        progress("compiling with torch.compile(backend='inductor') ...")
        try:
            t = time.perf_counter()
            inductor = torch.compile(model, backend="inductor")
            with torch.no_grad():
                inductor(x)
            compile_times["inductor"] = time.perf_counter() - t
            runners["inductor"] = inductor
        except Exception as e:              # no C++ compiler, unsupported platform, ...
            print(f"torch.compile(backend='inductor') does not work here: "
                  f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
    progress("compiling with torch.compile(backend='glowgen') ...")
    torch._dynamo.reset()
    t = time.perf_counter()
    gg = torch.compile(model, backend="glowgen", options={"threads": args.threads, "fallback": False})
    with torch.no_grad():
        gg(x)
    compile_times["glowgen (torch.compile)"] = time.perf_counter() - t
    runners["glowgen (torch.compile)"] = gg
    progress("compiling with glowgen.from_torch ...")
    t = time.perf_counter()
    ft = glowgen.from_torch(model, (x,), threads=args.threads)
    compile_times["glowgen.from_torch"] = time.perf_counter() - t
    runners["glowgen.from_torch"] = ft

    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    # Like PyTorch's OpenMP above: no spinning waits on a shared machine.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(ft.onnx.SerializeToString(), so, providers=["CPUExecutionProvider"])
    in_name = sess.get_inputs()[0].name
    runners["onnxruntime"] = lambda t: torch.from_numpy(sess.run(None, {in_name: t.numpy()})[0])

    with torch.no_grad():
        for name, fn in runners.items():
            got = fn(x)
            err = float((got - want).abs().max() / want.abs().max())
            if err > 1e-4:
                print(f"error: {name} differs from eager PyTorch (max relative error {err:.2e})")
                return 1
        assert torch_dynamo.stats["eager_calls"] == 0, "a glowgen graph ran eagerly"
        best = {name: float("inf") for name in runners}
        for r in range(args.rounds):
            progress(f"round {r + 1}/{args.rounds}")
            for name, fn in runners.items():
                best[name] = min(best[name], time_calls(fn, x, args.runs))

    print(f"ResNet-18, input {list(x.shape)}, {args.threads} thread(s), torch {torch.__version__} "
          f"(OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}); median of {args.runs} calls, "
          f"best of {args.rounds} rounds, runners interleaved")
    print(f"{'runner':<26}{'ms':>9}{'vs eager':>10}{'vs ort':>9}{'compile s':>11}")
    for name, sec in best.items():
        ct = f"{compile_times[name]:.1f}" if name in compile_times else "-"
        print(f"{name:<26}{sec * 1e3:9.2f}{best['eager'] / sec:9.2f}x{best['onnxruntime'] / sec:8.2f}x"
              f"{ct:>11}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
