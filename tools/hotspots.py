#!/usr/bin/env python3
"""Where a compiled model spends its time, down to the loops inside each kernel: Linux
`perf` samples the process while it runs the model, and each sample is charged to the
JIT-compiled function it fell in, and within it to the straight run of code between two
jumps (in a kernel, its hottest such run is its inner loop).

    python tools/hotspots.py MODEL [--quantize PROFILE.json] [--threads N] [--seconds S]
                             [--top N] [--annotate NAME_PART]

For each of the busiest functions: its share of the samples, the share of its own samples
in its hottest run ("loop"), and what lies outside that run as a share of all samples
("rest": planes, epilogues, transforms, the edges of images).  A kernel whose loop is near
its peak and whose rest is small has nothing left but its algorithm; ResNet-50 int8 on Zen 3
showed its 1x1 and stride-2 convolutions at 86-96% in their product loops, the 64 -> 256
1x1s at 56x56 at 79% (requantization after 16 steps of products).  `--annotate` prints the disassembly of the
first function whose name holds NAME_PART, each instruction with its share of that
function's samples (samples land on the instruction after the one that stalled).

Needs `perf` (sampling the cpu-clock event, so it works where a VM hides the hardware
counters) and `objdump`.  The whole model is compiled in this process, in one module
($GLOWGEN_COMPILE_PROCESSES=1), so that every function's address is known.  Inputs are
random, as `glowgen run` makes them, of the compiled model's input types.
"""
from __future__ import annotations

import argparse
import bisect
import collections
import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

os.environ["GLOWGEN_COMPILE_PROCESSES"] = "1"
import glowgen  # noqa: E402
from glowgen.cli import _random_input  # noqa: E402

JUMP = re.compile(r"\tj[a-z]+ ")
ADDRESS = re.compile(r"\s*([0-9a-f]+):")
STEP = re.compile(r"_s(\d+)(?:p\d+)?_")


def fail(message: str) -> None:
    print(f"hotspots: {message}", file=sys.stderr)
    sys.exit(2)


def random_feeds(model) -> dict:
    rng = np.random.default_rng(0)
    try:
        return {name: _random_input(ty, rng) for name, ty in model.input_types.items()}
    except (TypeError, ValueError):
        fail("an input has a dimension without a size "
             f"({', '.join(f'{n}: {t}' for n, t in model.input_types.items())}); export the model with static shapes")


def function_spans(jit) -> list[tuple[int, int, str]]:
    """(address, bytes, name) of every function of the JIT's module, in address order (a
    function's end is the next one's start; the last one's, the end of its page, the code
    mapped for certain)."""
    names = re.findall(r"^([A-Za-z_][\w.$]*):\s*$", jit.assembly(), re.M)
    found = sorted((jit.engine.get_function_address(n), n) for n in names)
    found = [(a, n) for a, n in found if a]
    ends = [a for a, _ in found[1:]] + [(found[-1][0] | 4095) + 1] if found else []
    return [(a, end - a, n) for (a, n), end in zip(found, ends)]


def sample(model, feeds, seconds: float, work_dir: str) -> tuple[list[int], int]:
    """Instruction addresses perf sampled in this process while the model ran for `seconds`."""
    data = os.path.join(work_dir, "perf.data")
    recorder = subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock", "-F", "10000",
                                 "-p", str(os.getpid()), "-o", data, "--", "sleep", str(seconds)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    runs, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        model.run(feeds)
        runs += 1
    _, err = recorder.communicate()
    if recorder.returncode != 0 or not os.path.exists(data):
        fail(f"perf record failed ({err.strip() or recorder.returncode}); "
             "is /proc/sys/kernel/perf_event_paranoid at most 2?")
    script = subprocess.run(["perf", "script", "-i", data, "-F", "ip"], capture_output=True, text=True)
    return [int(w, 16) for w in script.stdout.split()], runs


def disassemble(address: int, size: int, work_dir: str) -> list[tuple[int, str]]:
    path = os.path.join(work_dir, "code.bin")
    with open(path, "wb") as f:
        f.write(ctypes.string_at(address, size))
    text = subprocess.run(["objdump", "-D", "-b", "binary", "-mi386:x86-64", f"--adjust-vma={address:#x}", path],
                          capture_output=True, text=True).stdout
    return [(int(m[1], 16), line) for line in text.splitlines() if (m := ADDRESS.match(line))]


def hottest_run(lines, per_ip) -> int:
    """The most samples in a straight run of code between two jumps."""
    best = current = 0
    for address, line in lines:
        current += per_ip.get(address, 0)
        if JUMP.search(line):
            best, current = max(best, current), 0
    return max(best, current)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--quantize", metavar="PROFILE.json", help="compile int8 from this profile")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=5.0, help="how long to sample (default 5)")
    ap.add_argument("--top", type=int, default=25, help="functions to list (default 25)")
    ap.add_argument("--annotate", metavar="NAME_PART", help="print this function's samples per instruction")
    args = ap.parse_args()
    if not sys.platform.startswith("linux"):
        fail("needs Linux perf")
    for tool in ("perf", "objdump"):
        if shutil.which(tool) is None:
            fail(f"`{tool}` is not on PATH (install linux-tools / binutils)")

    try:
        model = glowgen.compile(args.model, threads=args.threads, quantize=args.quantize)
    except glowgen.GlowgenError as e:
        fail(str(e))
    jit = model._runner.jit
    spans = function_spans(jit)
    feeds = random_feeds(model)
    for _ in range(3):
        model.run(feeds)
    with tempfile.TemporaryDirectory() as work_dir:
        ips, runs = sample(model, feeds, args.seconds, work_dir)
        starts = [a for a, _, _ in spans]
        per_function, per_ip = collections.Counter(), collections.Counter()
        for ip in ips:
            k = bisect.bisect_right(starts, ip) - 1
            if k >= 0 and ip < starts[k] + spans[k][1]:
                per_function[spans[k][2]] += 1
                per_ip[ip] += 1
            else:
                per_function["(outside the model's code)"] += 1
        total = max(len(ips), 1)
        print(f"{runs} runs, {len(ips)} samples")
        print(f"{'share':>7} {'loop':>6} {'rest':>6}  function")
        by_name = {n: (a, s) for a, s, n in spans}
        steps = model._runner.step_names

        def described(name):        # main_graph_s17_QuantizedConv: step 17, as profile() names it
            m = STEP.search(name)
            return f"{name}  {steps[int(m[1])]}" if m and int(m[1]) < len(steps) else name
        for name, count in per_function.most_common(args.top):
            if name not in by_name:
                print(f"{100 * count / total:6.2f}% {'':>6} {'':>6}  {name}")
                continue
            hot = hottest_run(disassemble(*by_name[name], work_dir), per_ip)
            print(f"{100 * count / total:6.2f}% {100 * hot / count:5.1f}% {100 * (count - hot) / total:5.2f}%  "
                  f"{described(name)}")
        if args.annotate:
            match = next((n for _, _, n in spans if args.annotate in n), None)
            if match is None:
                fail(f"no function's name holds {args.annotate!r}")
            own = max(per_function[match], 1)
            print(f"\n{described(match)}: {per_function[match]} samples")
            for address, line in disassemble(*by_name[match], work_dir):
                print(f"{100 * per_ip.get(address, 0) / own:6.2f} {line}")


if __name__ == "__main__":
    main()
