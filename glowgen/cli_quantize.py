"""`glowgen profile`: the command-line side of profile-guided quantization."""
from __future__ import annotations

import sys
import time

from .errors import InputError

PROFILE_EXAMPLES = """\
examples:
  glowgen profile model.onnx --calibration calib.npz -o model.profile.json
  glowgen profile model.onnx --calibration calib_dir/ --limit 100 -o profile.json
  python -c "import numpy as np; np.savez('calib.npz', input=np.random.rand(32, 1, 3, 224, 224).astype('f4'))"

calibration data: an .npz holding, for each model input, an array whose first axis runs over
the samples (each sample has the input's shape: [samples, 1, 3, 224, 224] for a 1x3x224x224
input), or a directory of such files.
"""


def add_profile_parser(sub, shape_help: str, cpu_help: str, memory_help: str) -> None:
    import argparse
    from .quantization import DEFAULT_BINS
    p = sub.add_parser(
        "profile", help="record every tensor's range on calibration data, for --quantize",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run MODEL natively on calibration samples and write each float tensor's "
                    "range and histogram as JSON (a profile). Compiling with --quantize "
                    "PROFILE chooses the integer types from it. The profile is tied to the "
                    "model (a fingerprint of its graph and weights) but not to input shapes.",
        epilog=PROFILE_EXAMPLES)
    p.add_argument("model", help="path to an .onnx file")
    p.add_argument("--calibration", required=True, metavar="DATA",
                   help="an .npz of input arrays with a leading sample axis, or a directory of them")
    p.add_argument("-o", "--output", required=True, metavar="PROFILE.json", help="where to write the profile")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="use only the first N samples")
    p.add_argument("--bins", type=int, default=DEFAULT_BINS,
                   help=f"histogram bins per tensor (default {DEFAULT_BINS})")
    p.add_argument("--input-shape", action="append", metavar="NAME=DIMS", help=shape_help)
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="threads a sample runs on (default: this machine's cores)")
    p.add_argument("--cpu", default=None, help=cpu_help)
    p.add_argument("--max-memory", default=None, metavar="BYTES", help=memory_help)
    p.set_defaults(func=cmd_profile)


def cmd_profile(args) -> int:
    from .cli import _input_shapes, _thread_option
    from .frontend.onnx import declared_inputs, load_model
    from .quantization import profile
    from .quantization.samples import load_samples

    args.backend = "cpu"
    if args.limit is not None and args.limit < 1:
        raise InputError(f"--limit must be at least 1, not {args.limit}")
    proto = load_model(args.model)
    names = [n for n, _, _ in declared_inputs(proto)]
    samples = load_samples(args.calibration, names, args.limit)
    interactive = sys.stderr.isatty()
    t0 = time.perf_counter()

    def progress(phase, done, total):
        if interactive:
            end = "\n" if done == total else "\r"
            print(f"profiling: {phase} {done}/{total} samples", file=sys.stderr, end=end, flush=True)

    if interactive:
        print(f"profiling {args.model} on {len(samples)} samples (compiling)...", file=sys.stderr, flush=True)
    result = profile(proto, samples, input_shapes=_input_shapes(args) or None, bins=args.bins,
                     progress=progress, **_thread_option(args))
    result.save(args.output)
    print(f"profiled {len(result)} tensors on {len(samples)} samples in "
          f"{time.perf_counter() - t0:.1f} s; wrote {args.output}")
    return 0


QUANTIZE_HELP = ("compile with integer arithmetic (int8, or --precision int16) where PROFILE "
                 "(from `glowgen profile`) covers the graph: convolutions and matrix products in "
                 "integers, conversions only at the borders of integer regions")
PRECISION_HELP = ("with --quantize: the integer type of activations and weights: int8 (default) "
                  "or int16 (65536 steps: far closer to float; exact i64 sums; compiled as plain "
                  "loops, slower than float). Either way only convolutions and matrix products "
                  "with constant weights compute in integers; ReLU, max pooling and data "
                  "movement follow them, other ops run in float between conversions. "
                  "Does not apply to QDQ / QOperator models, which keep their own int8 types")


def add_quantize_arguments(p) -> None:
    """--quantize PROFILE and the options that choose how (compile, run, bench, dump)."""
    from .quantization import SCHEMAS
    p.add_argument("--quantize", metavar="PROFILE.json", help=QUANTIZE_HELP)
    p.add_argument("--schema", default="asymmetric", choices=SCHEMAS,
                   help="with --quantize: how ranges map onto the integers (default asymmetric; "
                        "symmetric_uint8 is int8 only)")
    p.add_argument("--precision", default=None, metavar="{int8,int16}", help=PRECISION_HELP)
    p.add_argument("--weight-bits", default=None, choices=("auto", "7", "8"),
                   help="with --quantize: the bits of int8 weights: 7 ([-63, 63]) or 8; auto "
                        "(default) takes 7 on targets without AVX-512 VNNI (AVX2), whose int8 "
                        "products multiply 7-bit weights about 1.5 times as fast, exactly; 8 "
                        "otherwise")
    p.add_argument("--calibration", dest="quant_calibration", default="minmax", metavar="C",
                   help="with --quantize: the range taken from each tensor's profile: minmax "
                        "(default), kl (entropy) or percentile=P (e.g. percentile=99.99)")
    p.add_argument("--keep-float", metavar="OPS",
                   help="with --quantize: op kinds to keep in float, e.g. Conv,MatMul")


def quantize_options(args) -> dict:
    """glowgen.compile's keyword arguments for the --quantize flags."""
    if args.quantize is None:
        given = [flag for flag, value, default in (
            ("--schema", args.schema, "asymmetric"), ("--calibration", args.quant_calibration, "minmax"),
            ("--keep-float", args.keep_float, None), ("--precision", args.precision, None),
            ("--weight-bits", args.weight_bits, None))
            if value != default]
        if given:
            raise InputError(f"{', '.join(given)} choose{'s' if len(given) == 1 else ''} how to "
                             f"quantize: add --quantize PROFILE.json")
        return {}
    return {"quantize": args.quantize, "schema": args.schema, "calibration": args.quant_calibration,
            "keep_float": args.keep_float, "precision": args.precision,
            "weight_bits": args.weight_bits}
