"""`glowgen bench`: one model timed through the Python API, side by side with onnxruntime
(or the layer grid of glowgen.benchmarks.layers, or serving through glowgen.runtime), and
`--profile`'s time per native kernel."""
from __future__ import annotations

import numpy as np

from .cli import _feeds, _input_shapes, _thread_count, _thread_option
from .errors import GlowgenError, InputError


def _percentile(sorted_values, q: float) -> float:
    return float(np.percentile(np.asarray(sorted_values), q))


# Warm-up by default: at least this many runs and this long (capped), for each engine alike.
# Right after a compile, the first runs of a model are slower for a while (MobileNetV2 8.0 ms
# after 3 warm-up runs, 7.1 ms after 30: caches, pages and clocks settling).
WARMUP_RUNS, WARMUP_SECONDS, WARMUP_MAX_RUNS = 5, 0.5, 500


def _warm_up(fn, warmup) -> None:
    import time
    if warmup is not None:
        for _ in range(warmup):
            fn()
        return
    start, done = time.perf_counter(), 0
    while done < WARMUP_MAX_RUNS and (done < WARMUP_RUNS or time.perf_counter() - start < WARMUP_SECONDS):
        fn()
        done += 1


def _timed(fn, runs: int) -> list[float]:
    import time
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _timings(fn, runs: int, warmup) -> list[float]:
    _warm_up(fn, warmup)
    return sorted(_timed(fn, runs))


# Blocks of each engine's timed runs by default (`--rounds`, `_alternating`).
LATENCY_ROUNDS = 4
# Before each later block of an engine's runs (`_alternating`): a pause, then untimed runs.
# The other engine ran just before: onnxruntime's idle workers spin a while after its runs
# on the cores glowgen's threads need (MobileNetV2 at 2 threads on Zen 3, glowgen's p90 with
# 2 untimed runs alone 10.9 ms, with the pause too 6.0-6.3, in one block 7.6), and its data
# fills the caches.
BLOCK_PAUSE = 0.05       # seconds
BLOCK_WARMUP = 2


def _alternating(fns: list, runs: int, rounds: int, warmup, progress=None) -> list[list[list[float]]]:
    """Each engine's `runs` timed runs, in `rounds` blocks taken in turn (engine 0's first
    block, engine 1's, engine 0's second, ...), so that a burst of load from elsewhere on the
    machine (another VM's, on a cloud host) falls on both engines alike instead of on
    whichever ran in its moment: per engine, the times of each of its blocks.  Each engine
    is warmed up before its first block; progress(engine, block) is called as each block
    begins."""
    import time
    rounds = max(1, min(rounds, runs))
    sizes = [runs // rounds + (1 if r < runs % rounds else 0) for r in range(rounds)]
    blocks: list[list[list[float]]] = [[] for _ in fns]
    for r, size in enumerate(sizes):
        for e, (fn, out) in enumerate(zip(fns, blocks)):
            if progress is not None:
                progress(e, r)
            if r == 0:
                _warm_up(fn, warmup)
            else:
                time.sleep(BLOCK_PAUSE)
                _warm_up(fn, min(BLOCK_WARMUP, warmup) if warmup is not None else BLOCK_WARMUP)
            out.append(_timed(fn, size))
    return blocks


def _all_runs(blocks: list[list[float]]) -> list[float]:
    """An engine's timed runs over all its blocks, sorted."""
    return sorted(t for block in blocks for t in block)


def _round_ratios(ours: list[list[float]], theirs: list[list[float]]) -> list[float]:
    """Round by round, the median of our block over the median of theirs run right after it
    (sorted): load from elsewhere on the machine that changes from one round to the next
    (a cloud host's neighbours) falls on both sides of each ratio alike, where the medians
    over all runs let a busy stretch weigh on one engine more than on the other."""
    return sorted(_percentile(sorted(g), 50) / _percentile(sorted(o), 50) for g, o in zip(ours, theirs))


# Rounds from which `glowgen bench` also prints the ratio round by round (_round_ratios).
MIN_ROUNDS_FOR_RATIOS = 3


PROGRESS_WIDTH = 48


def _block_progress(rounds: int, engines=("glowgen", "onnxruntime")):
    """A progress line on a terminal (stderr) while the blocks run; nothing when piped."""
    import sys
    if not sys.stderr.isatty():
        return None

    def show(engine: int, block: int) -> None:
        print(f"timing: block {block + 1}/{rounds}, {engines[engine]}...".ljust(PROGRESS_WIDTH), end="\r",
              file=sys.stderr, flush=True)
    return show


def _clear_progress(progress) -> None:
    import sys
    if progress is not None:
        print(" " * PROGRESS_WIDTH, end="\r", file=sys.stderr, flush=True)


def _print_ratio(head: str, label: str, num_blocks, den_blocks, meaning: str) -> None:
    """The ratio of two engines' median latencies (and of their fastest runs), then, with
    enough rounds, the median of the rounds' ratios (_round_ratios)."""
    num, den = _all_runs(num_blocks), _all_runs(den_blocks)
    ratio = _percentile(num, 50) / _percentile(den, 50)
    print(f"{head:<13}{label} = {ratio:.2f} (median latency; {meaning}); fastest runs {num[0] / den[0]:.2f}")
    if len(num_blocks) >= MIN_ROUNDS_FOR_RATIOS:
        by_round = _round_ratios(num_blocks, den_blocks)
        print(f"by round     {label} = {_percentile(by_round, 50):.2f} (median of {len(by_round)} "
              f"rounds' ratios of medians; {by_round[0]:.2f} to {by_round[-1]:.2f})")


def _fmt_ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.3f} ms" if ms < 100 else f"{ms:.1f} ms"


def _stats_line(times) -> str:
    return (f"median {_fmt_ms(_percentile(times, 50))}  min {_fmt_ms(times[0])}  "
            f"p90 {_fmt_ms(_percentile(times, 90))}")


def _compile(args, **options):
    """MODEL compiled as the bench flags say, with `options` besides (the quantize options,
    which the float comparison leaves out; --profile's counters)."""
    from .api import compile as compile_model
    return compile_model(args.model, backend=args.backend, input_shapes=_input_shapes(args),
                         **({"stacking": False} if args.no_stacking else {}), **_thread_option(args),
                         **options)


def cmd_bench(args) -> int:
    import time
    if args.compare == "float" and (args.devices is not None or args.layers):
        raise InputError("--compare float times one quantized model against its float one: "
                         "not with --devices or --layers")
    if args.devices is not None:          # serving through glowgen.runtime.Host
        from .cli_runtime import cmd_bench_serving
        return cmd_bench_serving(args)
    args.threads = _thread_count(args)
    if args.layers:
        return _bench_layers(args)
    if args.model is None:
        raise InputError("glowgen bench needs a MODEL (or --layers for the layer grid)")
    if args.filter or args.json:
        raise InputError("--filter and --json go with --layers")
    if args.runs < 1 or (args.warmup is not None and args.warmup < 0):
        raise InputError("--runs must be at least 1 and --warmup at least 0")
    args.rounds = LATENCY_ROUNDS if args.rounds is None else args.rounds
    if args.rounds < 1:
        raise InputError("--rounds must be at least 1")
    if args.no_stacking and args.backend != "cpu":
        raise InputError("--no-stacking applies to the cpu backend: add --backend cpu")
    if args.profile and args.backend != "cpu":
        raise InputError("--profile times the cpu backend's kernels: add --backend cpu")
    if args.compare == "float" and args.quantize is None:
        raise InputError("--compare float times the quantized model against the float one: "
                         "add --quantize PROFILE.json")
    if args.compare == "float" and args.onnxruntime_model:
        raise InputError("--onnxruntime-model goes with onnxruntime's comparison, not --compare float")
    ort = None
    if args.compare not in ("none", "float"):
        try:
            import onnxruntime as ort
        except ImportError:
            if args.compare == "onnxruntime":
                raise InputError("--compare onnxruntime: onnxruntime is not installed "
                                 "(pip install onnxruntime, or pass --compare none)") from None
    t0 = time.perf_counter()
    from .cli_quantize import quantize_options
    quantized = quantize_options(args)
    model = _compile(args, **quantized)
    feeds = all_feeds = _feeds(args, model)
    if hasattr(model, "specialized"):     # dynamic: the variant these inputs call, compiled now
        model = model.specialized(feeds)
        feeds = {k: v for k, v in feeds.items() if k in model.input_types}
    compile_s = time.perf_counter() - t0
    desc = ", ".join(f"{n}: {t}" for n, t in model.input_types.items())
    print(f"model        {args.model} ({desc})")
    warm = (f"{args.warmup} warm-up" if args.warmup is not None else
            f"a warm-up of {WARMUP_SECONDS:g} s (at least {WARMUP_RUNS} runs)")
    rounds = min(args.rounds, args.runs) if ort is not None or args.compare == "float" else 1
    blocks = f", in {rounds} blocks an engine taken in turn" if rounds > 1 else ""
    print(f"runs         {args.runs} timed after {warm} each{blocks}, same inputs for every engine")
    extra = "" if args.backend != "cpu" else (f", stacking {'off' if args.no_stacking else 'on'}"
                                              + (", winograd off" if args.no_winograd else "")
                                              + (", amx off" if args.no_amx else ""))
    used = model.options.get("threads", 1)
    kind = f", quantized ({args.precision or 'int8'})" if args.quantize else ""
    print(f"glowgen      backend {args.backend}{extra}{kind}, {used} thread{'s' if used > 1 else ''}, "
          f"compiled in {compile_s:.2f} s")
    if args.compare == "float":
        return _against_float(args, model, feeds, rounds)
    if ort is None:
        g_times = _timings(lambda: model.run(feeds), args.runs, args.warmup)
        print(f"  latency    {_stats_line(g_times)}")
        if args.compare == "auto":
            print("onnxruntime  not installed: no comparison")
        if args.profile:
            _print_profile(args, feeds)
        return 0
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    t0 = time.perf_counter()
    try:
        ort_model = args.onnxruntime_model or args.model
        sess = ort.InferenceSession(str(ort_model), opts, providers=["CPUExecutionProvider"])
    except Exception as e:   # noqa: BLE001 - onnxruntime's own errors, reported as such
        raise GlowgenError(f"onnxruntime cannot load {ort_model}: {e}") from None
    ort_s = time.perf_counter() - t0
    ort_feeds = {k: v for k, v in all_feeds.items() if k in {i.name for i in sess.get_inputs()}}
    names = [o.name for o in sess.get_outputs()]
    progress = _block_progress(rounds)
    g_blocks, o_blocks = _alternating([lambda: model.run(feeds), lambda: sess.run(names, ort_feeds)],
                                      args.runs, rounds, args.warmup, progress)
    g_times, o_times = _all_runs(g_blocks), _all_runs(o_blocks)
    _clear_progress(progress)
    print(f"  latency    {_stats_line(g_times)}")
    print(f"onnxruntime  {ort.__version__}, CPUExecutionProvider, {args.threads} thread"
          f"{'s' if args.threads > 1 else ''}, session created in {ort_s:.2f} s"
          + (f", on {args.onnxruntime_model}" if args.onnxruntime_model else ""))
    print(f"  latency    {_stats_line(o_times)}")
    _print_ratio("ratio", "glowgen / onnxruntime", g_blocks, o_blocks, "below 1 means glowgen is faster")
    ours = model.run(feeds)
    theirs = dict(zip(names, sess.run(names, ort_feeds)))
    diffs = []
    for k, v in ours.items():
        if k in theirs and np.asarray(theirs[k]).shape == v.shape and v.size:
            d = np.abs(v.astype(np.float64) - np.asarray(theirs[k]).astype(np.float64))
            diffs.append(float(np.nanmax(d)) if np.isfinite(d).any() else float("nan"))
    if diffs:
        print(f"outputs      max |glowgen - onnxruntime| = {max(diffs):.3g}")
    if args.profile:
        _print_profile(args, feeds)
    return 0


def _against_float(args, model, feeds, rounds: int) -> int:
    """--compare float: the quantized `model` (already compiled and described) and the same
    model compiled in float with the same options, timed in turn as onnxruntime would be;
    their ratio (the quantized model's speed-up) and the SQNR of its outputs against float's."""
    import time
    t0 = time.perf_counter()
    fp = _compile(args)
    if hasattr(fp, "specialized"):
        fp = fp.specialized(feeds)
    fp_s = time.perf_counter() - t0
    progress = _block_progress(rounds, ("quantized", "float"))
    q_blocks, f_blocks = _alternating([lambda: model.run(feeds), lambda: fp.run(feeds)],
                                      args.runs, rounds, args.warmup, progress)
    q_times, f_times = _all_runs(q_blocks), _all_runs(f_blocks)
    _clear_progress(progress)
    print(f"  latency    {_stats_line(q_times)}")
    print(f"float        the same model unquantized, compiled alike in {fp_s:.2f} s")
    print(f"  latency    {_stats_line(f_times)}")
    _print_ratio("speed-up", "float / quantized", f_blocks, q_blocks, "above 1 means the quantized model is faster")
    ours, theirs = model.run(feeds), fp.run(feeds)
    signal = noise = 0.0
    for k, v in theirs.items():
        if k in ours and np.asarray(ours[k]).shape == v.shape:
            ref = np.asarray(v, np.float64)
            signal += float(np.sum(ref ** 2))
            noise += float(np.sum((np.asarray(ours[k], np.float64) - ref) ** 2))
    if signal > 0:
        sqnr = "inf" if noise == 0 else f"{10 * np.log10(signal / noise):.1f}"
        print(f"outputs      SQNR of the quantized outputs against float's = {sqnr} dB")
    if args.profile:
        _print_profile(args, feeds)
    return 0


def _bench_layers(args) -> int:
    if args.model is not None:
        raise InputError("--layers runs its own grid of layers: leave MODEL out")
    if args.backend != "cpu" or args.profile or args.input or args.input_shape:
        raise InputError("--layers times the cpu backend on its own inputs: leave out --backend, "
                         "--profile, --input and --input-shape")
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        raise InputError("--layers compares with onnxruntime: pip install onnxruntime") from None
    from .benchmarks.layers import run
    options = {**({"stacking": False} if args.no_stacking else {}),
               **({"winograd": False} if args.no_winograd else {}),
               **({"amx": False} if args.no_amx else {}),
               **({"cpu": args.cpu} if args.cpu else {})}
    run(args.filter, threads=args.threads, json_path=args.json, compile_options=options or None)
    return 0


def _print_profile(args, feeds) -> None:
    """Time per native kernel, from cycle counters around each step of a second build (the
    timed runs above carry no counters)."""
    from .cli_quantize import quantize_options
    model = _compile(args, profile=True, **quantize_options(args))     # (--profile: the cpu backend)
    import time
    _warm_up(lambda: model.run(feeds), args.warmup)
    model.profile(reset=True)
    t0 = time.perf_counter()
    for _ in range(args.runs):
        model.run(feeds)
    per_run_ms = (time.perf_counter() - t0) * 1e3 / args.runs
    rows = model.profile()
    tasks = model.task_profile()
    total = sum(c for _, c in rows) or 1
    print(f"profile      per kernel, its fastest of {args.runs} runs (cycle counter; ms are shares "
          f"of the {per_run_ms:.3f} ms a profiled run took; a split kernel's tasks, each its "
          f"fastest, in brackets)")
    # A step joined to the one before runs in that step's round of tasks: the round's time
    # is the earlier step's (its own counter never runs), its tasks' times are its own.
    plan = getattr(getattr(model, "program", None), "plan", None)
    joined = [getattr(step, "joined", False) for step in getattr(plan, "steps", [])]
    joined += [False] * (len(rows) - len(joined))
    order = sorted(range(len(rows)), key=lambda i: -rows[i][1])[:args.profile_top]
    shown = [rows[i] for i in order]
    for i in order:
        name, cycles = rows[i]
        share = cycles / total
        split = (" [" + " ".join(f"{c / total * per_run_ms:.3f}" for c in tasks[i]) + "]") if tasks[i] else ""
        if joined[i]:
            print(f"  {'joined':>6}  {'':>11}  {name}{split} (in the round of the step before: its time there)")
            continue
        after = " (+ the joined step after it)" if i + 1 < len(joined) and joined[i + 1] else ""
        print(f"  {100 * share:5.1f}%  {share * per_run_ms:8.3f} ms  {name}{split}{after}")
    if len(rows) > len(shown):
        rest = sum(c for _, c in rows) - sum(c for _, c in shown)
        print(f"  {100 * rest / total:5.1f}%  {rest / total * per_run_ms:8.3f} ms  "
              f"({len(rows) - len(shown)} more kernels)")
