"""The `glowgen` command line.

Every user error prints `error: ...` on stderr and exits with status 2, without a traceback
(set GLOWGEN_DEBUG=1 to see one).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

import numpy as np

from . import pipeline
from .backends.base import backend_names
from .errors import GlowgenError, InputError

EXAMPLES = """\
examples:
  glowgen run examples/tiny_cnn.onnx
  glowgen run model.onnx --input-shape input=1x3x224x224 --save-outputs out/
  glowgen run model.onnx --input input=x.npy
  glowgen run model.onnx --backend cpu                  # native code through LLVM
  glowgen dump model.onnx --stage lowered
  glowgen dump model.onnx --stage lir --memory          # the memory plan against its lower bound
  glowgen dump model.onnx --stage optimized --rules     # which rules fired, how often
  glowgen dump model.onnx --passes                      # the pass pipeline and what it did
  glowgen dump model.onnx --stage loaded --format dot > graph.dot
  glowgen dump model.onnx --stage asm                   # the cpu backend's machine code
  glowgen compile model.onnx -o out/                    # a bundle: out/model.o, .h, .weights.bin, main.c
  glowgen compile model.onnx -o out/ --input-shape x=1x8 --input-shape x=4x8   # one bundle, two shape variants
  glowgen bench model.onnx --backend cpu --runs 20      # latency, against onnxruntime
  glowgen bench model.onnx --devices 2 --concurrency 4  # serving throughput, against onnxruntime
  glowgen partition model.onnx --device cpu:memory=64MB --device cpu:memory=64MB [--format dot]
  glowgen profile model.onnx --calibration calib.npz -o profile.json   # tensor ranges, for int8
  glowgen compile model.onnx -o out/ --quantize profile.json          # int8 where the profile reaches
  glowgen ops
  glowgen conformance --backend interpreter --json results.json
  glowgen regen            # after editing specs/*.glowdef
  glowgen regen --check    # exit 1 if glowgen/generated/ is stale
"""


def _parse_assignments(items, what: str) -> dict[str, str]:
    out = {}
    for item in items or []:
        name, sep, value = item.rpartition("=")
        if not sep or not name or not value:
            raise InputError(f"{what} takes NAME=VALUE, got {item!r}")
        out[name] = value
    return out


def shape_variants(items) -> list[dict]:
    """`--input-shape` items as shape variants (input name -> dims), in order.

    An item binds one input or several, comma-separated (`x=1x8,mask=1x8`; a comma inside
    dims, `x=1,8`, still reads as dims: only a comma before `NAME=` separates).  Items add
    to the current variant; an item naming an input the current variant already binds starts
    the next one.  Every variant must bind the same inputs, and no two may be equal."""
    from .frontend.onnx import parse_dims
    variants: list[dict] = []
    for item in items or []:
        binding = {}
        for piece in re.split(r",(?=[^,=]*=)", item):
            name, sep, value = piece.rpartition("=")
            if not sep or not name or not value:
                raise InputError(f"--input-shape takes NAME=DIMS (or NAME=DIMS,NAME=DIMS,... for "
                                 f"several inputs), got {item!r}")
            if name in binding:
                raise InputError(f"--input-shape {item!r} binds {name!r} twice; give each shape "
                                 f"variant its own --input-shape")
            binding[name] = parse_dims(value)
        if not variants or binding.keys() & variants[-1].keys():
            variants.append({})
        variants[-1].update(binding)
    for k, v in enumerate(variants[1:], 2):
        if v.keys() != variants[0].keys():
            raise InputError(
                f"--input-shape: shape variant 1 binds {', '.join(sorted(variants[0]))} but variant "
                f"{k} binds {', '.join(sorted(v))}; every variant must bind the same inputs (naming "
                f"an input again starts a new variant)")
        if v in variants[:k - 1]:
            raise InputError(f"--input-shape: shape variant {k} repeats variant "
                             f"{variants.index(v) + 1} ({_describe_variant(v)})")
    return variants


def _describe_variant(shapes: dict) -> str:
    return ",".join(f"{n}={'x'.join(map(str, d)) or 'scalar'}" for n, d in shapes.items())


def _input_shapes(args) -> dict:
    """The one set of input shapes of a command that compiles one variant."""
    variants = shape_variants(args.input_shape)
    if len(variants) > 1:
        raise InputError(f"--input-shape gives {len(variants)} shape variants "
                         f"({' | '.join(map(_describe_variant, variants))}): only `glowgen compile` "
                         f"writes several, into one bundle; bind each input once here")
    return variants[0] if variants else {}


def _safe_filename(name: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.\-]", "_", name).strip(".")
    return safe or "output"


def _random_input(ty, rng) -> np.ndarray:
    if ty.dtype == "bool":
        return rng.random(ty.shape) < 0.5
    if ty.dtype.startswith(("i", "u")):
        return rng.integers(0, 10, size=ty.shape).astype(ty.np_dtype)
    return rng.standard_normal(ty.shape).astype(ty.np_dtype)


def _summary(a: np.ndarray) -> str:
    if a.size == 0:
        return "(empty)"
    if a.dtype == np.bool_:
        return f"true={int(a.sum())}/{a.size}"
    f = a.astype(np.float64)
    finite = f[np.isfinite(f)]
    s = (f"min={finite.min():.6g} max={finite.max():.6g} mean={finite.mean():.6g}"
         if finite.size else "no finite values")
    if finite.size != f.size:
        s += f" non-finite={f.size - finite.size}"
    head = ", ".join(f"{x:.6g}" for x in f.reshape(-1)[:5])
    return s + f" first=[{head}{', ...' if a.size > 5 else ''}]"


def cmd_run(args) -> int:
    from .api import compile as compile_model
    from .cli_quantize import quantize_options
    model = compile_model(args.model, backend=args.backend, input_shapes=_input_shapes(args),
                          **_thread_option(args), **quantize_options(args))
    feeds = _feeds(args, model, say_random=True)
    outputs = model.run(feeds)
    for name, value in outputs.items():
        print(f"{name}: shape={list(value.shape)} dtype={value.dtype} {_summary(value)}")
    if args.save_outputs:
        out_dir = Path(args.save_outputs)
        out_dir.mkdir(parents=True, exist_ok=True)
        used = set()
        for name, value in outputs.items():
            fname = _safe_filename(name)
            while fname in used:
                fname += "_"
            used.add(fname)
            np.save(out_dir / f"{fname}.npy", value)
            print(f"saved {name} to {out_dir / (fname + '.npy')}")
    return 0


def _passes_report(ctx) -> str:
    from .engine.passes import describe_pipeline
    from .pipeline import PIPELINE
    lines = ["pipeline:", describe_pipeline(PIPELINE).rstrip(), "", "on this model:"]
    for name, rounds, before, after in ctx.log:
        lines.append(f"  {name:22s} {rounds:3d} round{'s' if rounds != 1 else ' '}  nodes {before} -> {after}")
    lines.append("  passes: " + (", ".join(f"{n} {c}" for n, c in sorted(ctx.passes.items())) or "none"))
    return "\n".join(lines) + "\n"


def _rules_report(ctx) -> str:
    if not ctx.fired:
        return "no rule fired\n"
    width = max(len(n) for n in ctx.fired)
    lines = [f"{name:{width}s} {count:6d}" for name, count in sorted(ctx.fired.items(), key=lambda x: (-x[1], x[0]))]
    lines.append(f"{'total':{width}s} {sum(ctx.fired.values()):6d}")
    return "\n".join(lines) + "\n"


def cmd_dump(args) -> int:
    from . import api
    from .engine.textual import print_function, to_dot
    stage = args.stage or ("lowered" if args.passes or args.rules else "loaded")
    if args.cpu and stage not in NATIVE_STAGES + ("lir",):
        raise InputError("--cpu chooses the target of native code and of the cpu backend's LIR "
                         "decisions: use it with --stage lir, llvm or asm")
    if stage in NATIVE_STAGES:
        return _dump_native(args, stage)
    args.backend = args.backend or pipeline.DEFAULT_BACKEND
    from .cli_quantize import quantize_options
    from .frontend.onnx import CheckedModel, load_model
    model = CheckedModel(load_model(args.model))
    # The weights' bits as compiling for the dumped target would choose them (--weight-bits auto).
    backend = api.get_backend(args.backend)
    cpu = {"cpu": args.cpu} if args.cpu and "cpu" in backend.options else {}
    quantization = api.quantization_options(model, **quantize_options(args), backend=backend,
                                            backend_options=backend.check_options(cpu))
    if quantization is not None and stage == "loaded":
        raise InputError("--quantize rewrites the optimized graph: use --stage optimized, lowered or lir")
    fn = api.load(model, _input_shapes(args))
    pipeline_stage = {"lir": "lowered"}.get(stage, stage)
    ctx = (api.optimize(fn, stage=pipeline_stage, backend=args.backend, quantization=quantization)
           if stage != "loaded" else None)
    if args.memory and stage != "lir":
        raise InputError("--memory reports the memory plan of the lir stage: add --stage lir")
    if args.passes or args.rules:
        if ctx is None:
            raise InputError("--passes and --rules report what the pipeline did: use them with "
                             "--stage optimized or --stage lowered")
        text = (_passes_report(ctx) if args.passes else "") + (
            ("\n" if args.passes else "") + _rules_report(ctx) if args.rules else "")
    elif stage == "lir":
        from .backends.base import get_backend
        from .engine.registry import Registry
        from .lir.printer import format_memory_report, memory_report, print_program
        if args.format == "dot":
            raise InputError("--format dot shows graphs; the lir stage prints as text")
        # After the backend's own LIR passes: the program as it will run.
        backend = get_backend(args.backend)
        options = {"cpu": args.cpu} if args.cpu else {}
        prog = api.build_program(fn, Registry.default(), backend, backend.check_options(options))
        text = format_memory_report(memory_report(prog)) if args.memory else print_program(prog)
    elif args.format == "dot":
        text = to_dot(fn)
    else:
        text = print_function(fn, max_elements=None if args.full else 16, trace=args.trace)
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


NATIVE_STAGES = ("llvm", "asm")


def _dump_native(args, stage: str) -> int:
    """`--stage llvm`: the module's LLVM IR after LLVM's optimization pipeline (what the
    assembly is generated from); `--stage asm`: the host machine code of that module."""
    from .api import compile as compile_model
    if args.backend not in (None, "cpu"):
        raise InputError(f"--stage {stage} shows native code, which only the cpu backend makes; "
                         f"use --backend cpu (or leave --backend out)")
    for flag in ("passes", "rules", "memory", "trace", "full"):
        if getattr(args, flag):
            raise InputError(f"--{flag} does not apply to --stage {stage}")
    if args.format != "text":
        raise InputError(f"--stage {stage} prints as text; --format dot shows graphs")
    from .cli_quantize import quantize_options
    model = compile_model(args.model, backend="cpu", input_shapes=_input_shapes(args), compile_processes=1,
                          **({"cpu": args.cpu} if args.cpu else {}), **quantize_options(args))
    runner = model._runner
    text = runner.assembly() if stage == "asm" else runner.llvm_ir(optimized=True)
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def _bundle_shapes(args):
    """compile's --input-shape: one variant's shapes, or a list of several variants'."""
    variants = shape_variants(args.input_shape)
    return variants if len(variants) > 1 else (variants[0] if variants else {})


def cmd_compile(args) -> int:
    import shlex
    import time
    from .api import write_bundle
    t0 = time.perf_counter()
    from .cli_quantize import quantize_options
    b = write_bundle(args.model, args.output, name=args.name, triple=args.target, cpu=args.cpu,
                     input_shapes=_bundle_shapes(args), stacking=not args.no_stacking,
                     **_thread_option(args, "cpu"), **quantize_options(args))
    seconds = time.perf_counter() - t0
    sizes = b.program.region_sizes
    print(f"compiled {args.model} for {b.triple} (cpu {b.cpu or 'generic'}) in {seconds:.2f} s")
    for path in b.files:
        print(f"  wrote {path} ({path.stat().st_size} bytes)")
    if b.variants:
        from .backends.cpu.bundle_variants import describe_inputs
        print(f"  {len(b.variants)} shape variants, picked by int {b.name}_select_variant(ranks, dims) "
              f"and run by int {b.name}_run(variant, constant_weights, mutable_weights, activations):")
        for k, prog in enumerate(b.variants):
            print(f"    {k}: {b.name}_v{k}  {describe_inputs(prog)}")
        sizes = {r: max(p.region_sizes[r] for p in b.variants) for r in sizes}
        print(f"  regions: constant {sizes['constant']} bytes (one for every variant), mutable "
              f"{sizes['mutable']} bytes, activations {sizes['activation']} bytes (the largest "
              f"variant's; 64-byte aligned)")
    else:
        print(f"  entry point: int {b.name}(uint8_t *constant_weights, uint8_t *mutable_weights, "
              f"uint8_t *activations)")
        print(f"  regions: constant {sizes['constant']} bytes, mutable {sizes['mutable']} bytes, "
              f"activations {sizes['activation']} bytes (64-byte aligned)")
    print("build and run the example program:")
    print(f"  cd {shlex.quote(str(b.directory))} && {b.build_command}")
    if b.host:
        print(f"  ./{b.name} --help")
    else:
        print(f"  (the object is for {b.triple}: build with that target's C compiler and run it there)")
    return 0


MEMORY_HELP = ("refuse, at compile time, a model whose constants or one call's inputs, outputs "
               "and activations need more than this many bytes (units K, M, G, T: 8G); "
               "default: what this machine has available")

CPU_HELP = ("cpu backend: the CPU to compile for, this machine's (default; $GLOWGEN_CPU) or an "
            "x86-64 level it can run, e.g. x86-64-v3 for the AVX2 + FMA code of a CPU without AVX-512")


def _thread_count(args) -> int:
    """--threads N checked; left out: this machine's cores."""
    from .backends.cpu.backend import machine_cores
    if args.threads is None:
        return machine_cores()
    if args.threads < 1:
        raise InputError(f"--threads must be at least 1, not {args.threads}")
    return args.threads


NO_WINOGRAD_HELP = ("cpu backend: no Winograd 3x3 convolutions (slower, but their weights take "
                    "16/9 to 4 times less memory: ResNet-50's 127 MB -> 98 MB)")
NO_AMX_HELP = ("cpu backend: int8 products on AVX-512 VNNI, not on the AMX tiles of a CPU that has "
               "them (Sapphire Rapids and later; to compare)")


def _thread_option(args, backend: str = None) -> dict:
    """The compile options for --threads and --cpu, for a backend that takes them, and
    --max-memory."""
    limit = getattr(args, "max_memory", None)
    return {**_backend_options(args, backend), **({"max_memory": limit} if limit is not None else {})}


def _backend_options(args, backend: str = None) -> dict:
    from .backends.base import get_backend
    options = get_backend(backend or args.backend).options
    cpu = getattr(args, "cpu", None) if backend is None else None     # compile's --cpu is the bundle's
    if cpu is not None and "cpu" not in options:
        raise InputError(f"--cpu applies to the cpu backend, not {args.backend}")
    no_winograd = getattr(args, "no_winograd", False)
    if no_winograd and "winograd" not in options:
        raise InputError(f"--no-winograd applies to the cpu backend, not {args.backend}")
    no_amx = getattr(args, "no_amx", False)
    if no_amx and "amx" not in options:
        raise InputError(f"--no-amx applies to the cpu backend, not {args.backend}")
    if "threads" not in options:
        return {}               # a backend without threads runs on one (bench says so)
    return {"threads": _thread_count(args), **({"cpu": cpu} if cpu is not None else {}),
            **({"winograd": False} if no_winograd else {}), **({"amx": False} if no_amx else {})}


def _feeds(args, model, say_random: bool = False) -> dict:
    """Inputs from --input NAME=FILE.npy; the rest random from --seed (said when asked)."""
    feeds = {}
    for name, path in _parse_assignments(args.input, "--input").items():
        if name not in model.input_types:
            raise InputError(f"--input names {name!r}, which is not an input of the model; inputs: "
                             f"{', '.join(model.input_names)}")
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise InputError(f"--input {name}={path}: cannot read a .npy array: {e}") from None
    missing = [n for n in model.input_names if n not in feeds]
    if missing and say_random:
        print(f"note: random input{'s' if len(missing) > 1 else ''} (seed {args.seed}) for "
              f"{', '.join(missing)}; pass --input NAME=FILE.npy to choose them")
    rng = np.random.default_rng(args.seed)
    ones = []
    for n in missing:
        ty = model.input_types[n]
        if ty.shape is None:
            raise InputError(f"input {n!r} declares no shape, so a random one cannot be made; "
                             f"pass --input {n}=FILE.npy or --input-shape {n}=DIMS")
        if None in ty.shape:      # a dynamic dimension (the model compiles per shape): 1
            ty = _Concrete(ty.dtype, tuple(1 if d is None else d for d in ty.shape), ty.np_dtype)
            ones.append(f"{n}={'x'.join(map(str, ty.shape))}")
        feeds[n] = _random_input(ty, rng)
    if ones:
        print(f"note: dynamic dimensions of random inputs set to 1: {', '.join(ones)}; pass "
              f"--input-shape NAME=DIMS or --input NAME=FILE.npy to choose", file=sys.stderr)
    model.check_feeds(feeds)
    return feeds


class _Concrete:
    def __init__(self, dtype, shape, np_dtype):
        self.dtype, self.shape, self.np_dtype = dtype, shape, np_dtype


def cmd_regen(args) -> int:
    from .dsl.regen import DEFAULT_OUT_DIR, DEFAULT_SPEC_DIR, regen
    spec_dir = Path(args.specs) if args.specs else DEFAULT_SPEC_DIR
    out_dir = Path(args.out) if args.out else DEFAULT_OUT_DIR
    if not spec_dir.is_dir():
        raise GlowgenError(f"spec directory {spec_dir} does not exist (pass --specs DIR)")
    stale = regen(spec_dir, out_dir, check=args.check)
    if args.check:
        if stale:
            print("generated code is stale; run `glowgen regen`. Stale files:", file=sys.stderr)
            for p in stale:
                print(f"  {p}", file=sys.stderr)
            return 1
        print(f"generated code in {out_dir} matches {spec_dir}")
        return 0
    print(f"wrote {len(stale)} file(s) in {out_dir}" if stale else f"{out_dir} was already up to date")
    for p in stale:
        print(f"  {p}")
    return 0


def cmd_ops(args) -> int:
    from .engine.registry import Registry
    reg = Registry.default()
    if args.onnx:
        width = max(len(name) for name in reg.onnx)
        for onnx_op in sorted(reg.onnx):
            clauses = reg.onnx[onnx_op]
            parts = [f"{c.op} (opset {c.since or 1}{'..' + str(c.until) if c.until else '+'})" for c in clauses]
            print(f"{onnx_op:{width}s} -> {', '.join(parts)}")
        return 0
    for name, cls in sorted(reg.ops.items()):
        kind = "primitive" if "primitive" in cls.TRAITS else "lowered"
        onnx_names = sorted({c.onnx_op for cs in reg.onnx.values() for c in cs if c.op == name})
        doc = (cls.__doc__ or "").strip().splitlines()[0]
        print(f"{name:20s} {kind:9s} {('onnx: ' + ', '.join(onnx_names)) if onnx_names else '':28s} {doc}")
    print(f"\n{len(reg.ops)} ops, {len(reg.onnx)} ONNX ops; `glowgen ops --onnx` lists the ONNX mapping")
    return 0


def cmd_conformance(args) -> int:
    from .conformance import main as conformance_main
    return conformance_main(args)


def build_parser() -> argparse.ArgumentParser:
    from .cli_bench import LATENCY_ROUNDS, WARMUP_MAX_RUNS, WARMUP_RUNS, WARMUP_SECONDS, cmd_bench
    from .cli_quantize import add_quantize_arguments
    p = argparse.ArgumentParser(
        prog="glowgen",
        description="glowgen compiles ONNX models. Every op is declared in specs/*.glowdef; "
                    "`glowgen regen` turns the specs into the Python the compiler runs.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    shape_help = ("bind an input's shape, e.g. input=1x3x224x224 (several inputs: "
                  "x=1x8,mask=1x8): compile for it ahead of time (compile and dump need it for "
                  "dynamic dimensions; run and bench without it take the shape of --input, or 1 "
                  "for a dynamic dimension of a random input)")
    variants_help = ("bind an input's shape, e.g. image=1x3x224x224, or several inputs' at once: "
                     "x=1x8,mask=1x8 (needed for dynamic dimensions). Repeat it to bind more "
                     "inputs; naming an input again starts another shape variant: "
                     "--input-shape x=1x3x32x32 --input-shape x=4x3x32x32 writes one bundle "
                     "with an entry point per variant (NAME_v0, NAME_v1, ...; weights shared) "
                     "and NAME_select_variant(ranks, dims), which picks the variant for given "
                     "input shapes, and NAME_run(variant, ...); every variant binds the same "
                     "inputs, e.g. x=1x8,mask=1x8 then x=4x8,mask=4x8")

    r = sub.add_parser("run", help="compile a model and run it once",
                       description="Compile MODEL and run it on the given (or random) inputs; print "
                                   "each output's name, shape, dtype and a summary.")
    r.add_argument("model", help="path to an .onnx file")
    r.add_argument("--input", action="append", metavar="NAME=FILE.npy",
                   help="an input array from a .npy file (repeatable); inputs not given are random")
    r.add_argument("--input-shape", action="append", metavar="NAME=DIMS", help=shape_help)
    r.add_argument("--backend", default=pipeline.DEFAULT_BACKEND, choices=backend_names(),
                   help="interpreter (NumPy reference, every op) or cpu (native code through "
                        "LLVM, JIT-compiled for this machine); default: " + pipeline.DEFAULT_BACKEND)
    r.add_argument("--save-outputs", metavar="DIR", help="write DIR/<output name>.npy for each output")
    r.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    r.add_argument("--threads", type=int, default=None, metavar="N",
                   help="cpu backend: threads a call runs on (default: this machine's cores)")
    r.add_argument("--cpu", default=None, help=CPU_HELP)
    r.add_argument("--max-memory", default=None, metavar="BYTES", help=MEMORY_HELP)
    r.add_argument("--no-winograd", action="store_true", help=NO_WINOGRAD_HELP)
    r.add_argument("--no-amx", action="store_true", help=NO_AMX_HELP)
    add_quantize_arguments(r)
    r.set_defaults(func=cmd_run)

    d = sub.add_parser("dump", help="print the graph at a stage of compilation",
                       description="Print MODEL after a stage: `loaded` (as imported), "
                                   "`optimized` (canonicalized: rules, DCE, CSE, constant folding), "
                                   "`lowered` (the whole pipeline: what the backend runs) or `lir` "
                                   "(low-level instructions with their memory plan).")
    d.add_argument("model", help="path to an .onnx file")
    d.add_argument("--stage", choices=["loaded", "optimized", "lowered", "lir", "llvm", "asm"],
                   help="default: loaded (lowered with --passes or --rules); llvm: the cpu "
                        "backend's LLVM IR after LLVM's optimizations; asm: its machine code for "
                        "this host")
    d.add_argument("--backend", default=None, choices=backend_names(),
                   help="the backend whose op set lowering targets (default: "
                        + pipeline.DEFAULT_BACKEND + "; always cpu for --stage llvm and asm)")
    d.add_argument("--passes", action="store_true",
                   help="print the pass pipeline and what each phase did, instead of the graph")
    d.add_argument("--rules", action="store_true",
                   help="print how many times each rule fired, instead of the graph")
    d.add_argument("--memory", action="store_true",
                   help="with --stage lir: print the memory report (regions, arena, max-live bound)")
    d.add_argument("--format", default="text", choices=["text", "dot"],
                   help="text (parses back) or Graphviz dot")
    d.add_argument("--input-shape", action="append", metavar="NAME=DIMS", help=shape_help)
    d.add_argument("--full", action="store_true", help="print every constant's data (default: elide "
                                                       "constants of more than 16 values)")
    d.add_argument("--trace", action="store_true", help="show the ONNX node and rules behind each node")
    d.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    d.add_argument("--cpu", default=None, help="--stage llvm and asm: " + CPU_HELP)
    add_quantize_arguments(d)
    d.set_defaults(func=cmd_dump)

    k = sub.add_parser(
        "compile", help="write an ahead-of-time bundle: object file, weights, C header, main.c",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Compile MODEL with the cpu backend into DIR:\n"
                    "  NAME.o            the code, for --target/--cpu (default: this machine)\n"
                    "  NAME.weights.bin  the constant weights, as the code expects them\n"
                    "  NAME.h            int NAME(uint8_t *constant_weights, uint8_t *mutable_weights,\n"
                    "                    uint8_t *activations); region sizes, alignment, and each\n"
                    "                    input's and output's offset, shape and element type\n"
                    "  main.c            an example: reads inputs from raw files, writes outputs\n"
                    "Build the example with `gcc -O2 -pthread main.c NAME.o -lm -o NAME` in DIR; the object\n"
                    "needs no library but libm.\n"
                    "With several shape variants (--input-shape naming an input again), NAME.h has an\n"
                    "entry point per variant and NAME_select_variant / NAME_run to pick and run one;\n"
                    "main.c runs the variant of its inputs' shapes (from the file sizes, or --shape).",
        epilog="examples:\n  glowgen compile mlp.onnx -o out/ && cd out && gcc -O2 -pthread main.c mlp.o -lm -o mlp\n"
               "  ./mlp input.bin output.bin     # raw little-endian, row-major tensors\n"
               "  glowgen compile net.onnx -o out/ --input-shape x=1x3x32x32 --input-shape x=4x3x32x32\n"
               "  ./net x4.bin y4.bin            # the batch-4 variant, chosen by x4.bin's size\n"
               "  glowgen compile bert.onnx -o out/ --input-shape ids=1x8,mask=1x8 --input-shape ids=1x16,mask=1x16")
    k.add_argument("model", help="path to an .onnx file")
    k.add_argument("-o", "--output", required=True, metavar="DIR",
                   help="directory to write the bundle to (created if needed)")
    k.add_argument("--name", help="name of the entry point and the files (default: the model "
                                  "file's stem, made a C identifier)")
    k.add_argument("--target", metavar="TRIPLE",
                   help="LLVM target triple, e.g. aarch64-linux-gnu (default: this machine)")
    k.add_argument("--cpu", help="CPU to tune and select instructions for, e.g. x86-64-v3 "
                                 "(default: this machine's CPU for the host triple, else generic)")
    k.add_argument("--input-shape", action="append", metavar="NAME=DIMS[,NAME=DIMS...]",
                   help=variants_help)
    k.add_argument("--no-stacking", action="store_true",
                   help="one loop per elementwise op (for comparison)")
    k.add_argument("--no-winograd", action="store_true", help=NO_WINOGRAD_HELP)
    k.add_argument("--no-amx", action="store_true", help=NO_AMX_HELP)
    k.add_argument("--threads", type=int, default=None, metavar="N",
                   help="threads to split the work for (default: this machine's cores); "
                        "NAME_parallel runs on the caller's pool, main.c's --threads sets its size")
    k.add_argument("--max-memory", default=None, metavar="BYTES",
                   help="refuse a model whose constants need more than this many bytes to "
                        "compile (units K, M, G, T: 8G); default: what this machine has available")
    add_quantize_arguments(k)
    k.set_defaults(func=cmd_compile)

    bn = sub.add_parser(
        "bench", help="measure latency, against onnxruntime",
        description="Compile MODEL, then time one inference at a time on a fixed input, "
                    "through the Python API (model.run, InferenceSession.run): the "
                    "median, min and 90th percentile latency of glowgen and, when onnxruntime is "
                    "installed, of onnxruntime in the same process on the same input, and their "
                    "ratio.  Both run on --threads N threads (default: this machine's cores).  "
                    "With --quantize P --compare float, the quantized model against the same "
                    "model in float: the speed-up quantization gives and its outputs' SQNR.")
    bn.add_argument("model", nargs="?", help="path to an .onnx file (not with --layers)")
    bn.add_argument("--layers", action="store_true",
                    help="instead of a model, a grid of single-op layers (convolutions, products, "
                         "resizes, pooling, elementwise stacks, ...): each layer's time, GFLOPS, "
                         "fraction of the measured FMA peak and ratio to onnxruntime")
    bn.add_argument("--filter", metavar="REGEX", help="--layers: only layers whose name matches")
    bn.add_argument("--json", metavar="FILE", help="--layers: also write the table as JSON")
    bn.add_argument("--backend", default=pipeline.DEFAULT_BACKEND, choices=backend_names(),
                    help="glowgen backend (default: cpu)")
    bn.add_argument("--compare", default="auto", choices=["auto", "onnxruntime", "float", "none"],
                    help="compare with onnxruntime (default: auto, when it is installed); float: "
                         "with --quantize, the quantized model against glowgen's float one, "
                         "compiled alike (the speed-up quantization gives, and the SQNR of its "
                         "outputs)")
    bn.add_argument("--threads", type=int, default=None, metavar="N",
                    help="threads for glowgen (threads=N) and for onnxruntime "
                         "(intra_op_num_threads=N); default: this machine's cores")
    bn.add_argument("--cpu", default=None, help=CPU_HELP)
    bn.add_argument("--max-memory", default=None, metavar="BYTES", help=MEMORY_HELP)
    bn.add_argument("--no-stacking", action="store_true",
                    help="cpu backend: one loop per elementwise op (for comparison)")
    bn.add_argument("--no-winograd", action="store_true", help=NO_WINOGRAD_HELP)
    bn.add_argument("--no-amx", action="store_true", help=NO_AMX_HELP)
    bn.add_argument("--runs", type=int, default=20, help="timed runs (default 20)")
    bn.add_argument("--rounds", type=int, default=None, metavar="N",
                    help="glowgen then onnxruntime, N times, so that load from elsewhere on the "
                         "machine falls on both alike: each engine's --runs in N blocks "
                         f"(default {LATENCY_ROUNDS}; 1: all of glowgen's runs, then all of "
                         "onnxruntime's), or with --devices, N rounds of --seconds each (default 1)")
    bn.add_argument("--profile", action="store_true",
                    help="also print where the time goes: each native kernel's share (cpu)")
    bn.add_argument("--profile-top", type=int, default=15, metavar="N",
                    help="kernels listed by --profile, the most costly first (default 15)")
    bn.add_argument("--warmup", type=int, default=None,
                    help=f"untimed runs first, for each engine (default: {WARMUP_RUNS} runs and "
                         f"at least {WARMUP_SECONDS:g} s, at most {WARMUP_MAX_RUNS} runs: a model "
                         f"just compiled runs slower for a while)")
    bn.add_argument("--input", action="append", metavar="NAME=FILE.npy",
                    help="an input array from a .npy file (repeatable); inputs not given are random")
    bn.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    bn.add_argument("--input-shape", action="append", metavar="NAME=DIMS", help=shape_help)
    from .cli_runtime import add_bench_arguments, add_partition_parser
    add_bench_arguments(bn)
    add_quantize_arguments(bn)
    bn.add_argument("--onnxruntime-model", metavar="FILE",
                    help="run onnxruntime on FILE instead of MODEL (same inputs): e.g. the QDQ "
                         "model onnxruntime's quantize_static writes, against --quantize")
    bn.set_defaults(func=cmd_bench)
    add_partition_parser(sub, shape_help)
    from .cli_quantize import add_profile_parser
    add_profile_parser(sub, shape_help, CPU_HELP, MEMORY_HELP)

    g = sub.add_parser("regen", help="regenerate glowgen/generated/ from specs/",
                       description="Parse specs/*.glowdef and write the generated Python modules.")
    g.add_argument("--check", action="store_true",
                   help="only compare; exit 1 and name the stale files if they differ")
    g.add_argument("--specs", metavar="DIR", help="spec directory (default: the repository's specs/)")
    g.add_argument("--out", metavar="DIR", help="output directory (default: glowgen/generated/)")
    g.set_defaults(func=cmd_regen)

    o = sub.add_parser("ops", help="list the supported ops",
                       description="List every declared op (primitive or lowered) and its ONNX ops.")
    o.add_argument("--onnx", action="store_true", help="list by ONNX op instead")
    o.set_defaults(func=cmd_ops)

    c = sub.add_parser("conformance", help="run ONNX's backend test suite",
                       description="Run ONNX's backend conformance cases (node, simple, "
                                   "pytorch-converted, pytorch-operator) through glowgen, each in a "
                                   "worker subprocess with a timeout; print a table per category and "
                                   "`N passed, M failed`. Exits 1 when a case fails that is not in "
                                   "glowgen/conformance/expected_failures.toml.")
    c.add_argument("--backend", default=pipeline.DEFAULT_BACKEND, choices=backend_names(),
                   help="backend to compile for (default: " + pipeline.DEFAULT_BACKEND + ")")
    c.add_argument("--include", metavar="REGEX", help="only cases whose name matches REGEX")
    c.add_argument("--category", action="append", choices=["node", "simple", "pytorch-converted",
                                                           "pytorch-operator"],
                   help="only this category (repeatable; default: all four)")
    c.add_argument("--json", metavar="FILE", help="write every case's outcome and message to FILE")
    c.add_argument("--jobs", type=int, default=None, help="worker processes (default: CPU count)")
    c.add_argument("--timeout", type=float, default=60.0, help="seconds per case (default 60)")
    c.add_argument("--expected", metavar="FILE", help="expected-failures file (default: the bundled one)")
    c.add_argument("--write-expected", metavar="FILE",
                   help="write the failing cases, grouped by reason, as an expected-failures file")
    c.add_argument("--specialize", action="store_true",
                   help="give every input at run time, binding none: models whose inputs decide "
                        "shapes or control flow compile per value (glowgen.compile's default); "
                        "(frozen) then counts those")
    c.add_argument("-v", "--verbose", action="store_true", help="print every failure")
    c.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    c.set_defaults(func=cmd_conformance)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except GlowgenError as e:
        if os.environ.get("GLOWGEN_DEBUG"):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
