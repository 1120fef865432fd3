"""The runtime's command line: `glowgen partition` (the plan of a model over devices) and
`glowgen bench MODEL --devices N --concurrency C` (serving throughput against onnxruntime).
cli.py registers these (the runtime itself knows nothing of the command line)."""
from __future__ import annotations

import sys
import threading
import time

import numpy as np

from .errors import GlowgenError, InputError


# ---------------------------------------------------------------------------- partition
def add_partition_parser(sub, shape_help: str) -> None:
    p = sub.add_parser(
        "partition", help="print how a model is cut over devices",
        description="Partition MODEL over the devices given (as glowgen.runtime.Host does, "
                    "without compiling): each partition, its device, its estimated memory "
                    "(weights + inputs + peak activations), its work, and the tensors that cross "
                    "between partitions; --format dot draws the DAG.")
    p.add_argument("model", help="path to an .onnx file")
    p.add_argument("--device", action="append", metavar="KIND[:memory=SIZE,threads=N,name=NAME]",
                   help="a device (repeatable; default one cpu device with the machine's memory), "
                        "e.g. cpu:memory=64MB")
    p.add_argument("--format", default="text", choices=["text", "dot"], help="text (default) or dot")
    p.add_argument("--replicas", type=int, default=1, help="copies of the network (default 1)")
    p.add_argument("--map", action="append", metavar="NODE=DEVICE",
                   help="put a node (an ONNX node name) on a device by its name (repeatable)")
    p.add_argument("--input-shape", action="append", metavar="NAME=DIMS", help=shape_help)
    p.set_defaults(func=cmd_partition)


def _devices(specs):
    from .runtime.devices import Device, name_devices, parse_device_spec
    return name_devices([parse_device_spec(s) for s in specs] if specs else [Device("cpu")])


def cmd_partition(args) -> int:
    from . import api
    from .cli import _input_shapes, _parse_assignments
    from .engine.registry import Registry
    from .runtime.partitioner import partition
    devices = _devices(args.device)
    mapping = _parse_assignments(args.map, "--map")
    registry = Registry.default()
    function = api.load(args.model, _input_shapes(args), registry)
    api.optimize(function, registry, stage="optimized", backend=devices[0].kind)
    plan = partition(function, registry, devices, _network_name(args.model), mapping or None,
                     args.replicas)
    sys.stdout.write(plan.to_dot() if args.format == "dot" else plan.to_text())
    return 0


def _network_name(path) -> str:
    from pathlib import Path
    return Path(str(path)).stem or "network"


# ---------------------------------------------------------------------------- bench
def add_bench_arguments(bn) -> None:
    g = bn.add_argument_group("serving (glowgen.runtime.Host)")
    g.add_argument("--devices", type=int, default=None, metavar="N",
                   help="serve MODEL from a Host of N cpu devices (the machine's cores shared "
                        "among them) to --concurrency clients, against one onnxruntime session "
                        "with as many threads serving the same clients: requests/s, p50, p99")
    g.add_argument("--concurrency", type=int, default=4, metavar="C",
                   help="clients sending requests at once, each waiting for its answer (default 4)")
    g.add_argument("--replicas", type=int, default=None, metavar="R",
                   help="copies of the network (default: one per device when it fits one)")
    g.add_argument("--device-memory", default=None, metavar="SIZE",
                   help="memory of each device, e.g. 64MB (default: the machine's)")
    g.add_argument("--seconds", type=float, default=5.0,
                   help="how long each engine serves, after a warm-up (default 5)")


def _serve(call, clients: int, seconds: float, warmup: float = 1.0):
    """`clients` threads calling `call()` back to back: (requests/s, sorted latencies)."""
    lat: list[list[float]] = [[] for _ in range(clients)]
    errors: list = []
    start = threading.Barrier(clients + 1)
    state = {"timing": False, "stop": False}

    def client(i):
        start.wait()
        try:
            while not state["stop"]:
                t0 = time.perf_counter()
                call()
                if state["timing"]:
                    lat[i].append(time.perf_counter() - t0)
        except BaseException as e:      # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    time.sleep(warmup)
    state["timing"] = True
    t0 = time.perf_counter()
    time.sleep(seconds)
    state["timing"] = False
    elapsed = time.perf_counter() - t0
    state["stop"] = True
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    all_lat = sorted(x for per in lat for x in per)
    return len(all_lat) / elapsed, all_lat


def _pct(values, q) -> float:
    return float(np.percentile(np.asarray(values), q)) * 1e3 if values else float("nan")


def cmd_bench_serving(args) -> int:
    from .backends.cpu.backend import machine_cores
    from .cli import _feeds, _input_shapes
    from .runtime.devices import Device, parse_memory
    from .runtime.host import Host
    args.rounds = 1 if args.rounds is None else args.rounds
    if args.devices < 1 or args.concurrency < 1 or args.seconds <= 0 or args.rounds < 1:
        raise InputError("--devices, --concurrency and --rounds must be at least 1, --seconds above 0")
    if args.backend != "cpu" or args.layers or args.profile:
        raise InputError("--devices serves on cpu devices: leave out --backend, --layers, --profile")
    ort = None
    if args.compare != "none":
        try:
            import onnxruntime as ort
        except ImportError:
            if args.compare == "onnxruntime":
                raise InputError("--compare onnxruntime: onnxruntime is not installed") from None
    cores = args.threads if args.threads is not None else machine_cores()
    per_device = max(1, cores // args.devices)
    memory = parse_memory(args.device_memory)
    devices = [Device("cpu", memory=memory, threads=per_device) for _ in range(args.devices)]
    replicas = args.replicas or (args.devices if memory is None else 1)
    interactive = sys.stderr.isatty()

    def progress(done, total):
        if interactive:
            end = "\n" if done == total else "\r"
            print(f"compiled {done}/{total} partitions", file=sys.stderr, end=end, flush=True)

    host = Host(devices, max_pending=max(1024, 4 * args.concurrency))
    try:
        t0 = time.perf_counter()
        plan = host.add_network("model", args.model, replicas=replicas,
                                input_shapes=_input_shapes(args), progress=progress)
        compile_s = time.perf_counter() - t0
        feeds = _feeds(args, _SignatureModel(host._get("model")[0].signature))
        print(f"model        {args.model}")
        print(f"host         {args.devices} cpu device{'s' if args.devices > 1 else ''} of "
              f"{per_device} thread{'s' if per_device > 1 else ''}, {len(plan.replica(0))} "
              f"partition{'s' if len(plan.replica(0)) > 1 else ''} x {plan.replicas} "
              f"replica{'s' if plan.replicas > 1 else ''}, provisioned in {compile_s:.1f} s")
        sess = names = ort_feeds = None
        if ort is not None:
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = per_device * args.devices
            opts.inter_op_num_threads = 1
            try:
                sess = ort.InferenceSession(str(args.model), opts, providers=["CPUExecutionProvider"])
            except Exception as e:   # noqa: BLE001 - onnxruntime's own errors, reported as such
                raise GlowgenError(f"onnxruntime cannot load {args.model}: {e}") from None
            names = [o.name for o in sess.get_outputs()]
            ort_feeds = {k: v for k, v in feeds.items() if k in {i.name for i in sess.get_inputs()}}
            print(f"onnxruntime  {ort.__version__}, one session, {per_device * args.devices} intra-op "
                  f"threads, serving the same clients")
        elif args.compare == "auto":
            print("onnxruntime  not installed: no comparison")
        print(f"clients      {args.concurrency} concurrent, each waiting for its answer; "
              f"{args.seconds:g} s timed after {min(1.0, args.seconds):g} s of warm-up, per engine and round")
        ratios = []
        for r in range(args.rounds):
            tag = f"round {r + 1}  " if args.rounds > 1 else ""
            g_rate, g_lat = _serve(lambda: host.run("model", feeds), args.concurrency, args.seconds,
                                   min(1.0, args.seconds))
            print(f"{tag}glowgen      {g_rate:8.1f} req/s  p50 {_pct(g_lat, 50):7.2f} ms  "
                  f"p99 {_pct(g_lat, 99):7.2f} ms")
            if sess is None:
                continue
            o_rate, o_lat = _serve(lambda: sess.run(names, ort_feeds), args.concurrency, args.seconds,
                                   min(1.0, args.seconds))
            print(f"{tag}onnxruntime  {o_rate:8.1f} req/s  p50 {_pct(o_lat, 50):7.2f} ms  "
                  f"p99 {_pct(o_lat, 99):7.2f} ms")
            ratios.append(g_rate / o_rate)
        ours = host.run("model", feeds)
    finally:
        host.close()
    if not ratios:
        return 0
    print("ratio        glowgen / onnxruntime throughput = "
          + ", ".join(f"{x:.2f}" for x in ratios) + " (above 1 means glowgen serves more)")
    theirs = dict(zip(names, sess.run(names, ort_feeds)))
    diffs = [float(np.max(np.abs(ours[k].astype(np.float64) - theirs[k]))) for k in ours
             if k in theirs and np.shape(theirs[k]) == ours[k].shape and ours[k].size]
    if diffs:
        print(f"outputs      max |glowgen - onnxruntime| = {max(diffs):.3g}")
    return 0


class _SignatureModel:
    """What cli._feeds needs of a model: its input types and a feed check."""

    def __init__(self, signature):
        self.input_types = signature.input_types
        self.input_names = signature.input_names
        self.check_feeds = signature
