"""Quantizing a compilation: which values get integer types, with which parameters.

`QuantizationOptions` says how (profile, schema, calibration, ops kept in float, the bits of
int8 weights);
`calibrate(function, options)` gives each value of the canonicalized graph that the profile
covers the parameters calibration chooses for it (Value.calibrated); the rules of the
[quantize] phase (specs/lowerings.glowdef) then rewrite the graph.  Nothing here names an op
but those the user asks to keep in float.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

from ..engine.graph import Function
from ..engine.registry import Registry
from ..errors import GlowgenError
from .bodies import body_values, captured_placeholders, nested
from .calibration import Calibration, check_schema, choose_params, tensor_range
from .profile import Profile, as_profile

# The integer precisions a profile quantizes to (`--precision`), and their element types.
PRECISIONS = {"int8": "i8", "int16": "i16"}
# The bits int8 weights may take (`--weight-bits`): 8, or 7 ([-63, 63]), which the int8
# products of targets without VNNI compute about 1.5 times as fast (backends/cpu/qgemm.py:
# `ubsw`; int8 ResNet-18 at x86-64-v3, one thread: 1.26x -> 1.9x float);
# None ("auto") lets the backend choose for its target (Backend.weight_bits).
WEIGHT_BITS = (7, 8)


def check_weight_bits(bits, dtype: str = "i8") -> Optional[int]:
    """`bits` (7, 8, "7", "8", or None / "auto": the backend's choice) as an int or None."""
    if bits is None or bits == "auto":
        return None
    try:
        value = int(bits)
    except (TypeError, ValueError):
        value = None
    if value not in WEIGHT_BITS:
        raise GlowgenError(f"weight_bits={bits!r}: int8 weights take 7 or 8 bits, or auto (the "
                           f"default: 7 on targets without VNNI, where they multiply faster)")
    if dtype != "i8":
        raise GlowgenError(f"weight_bits={bits!r} narrows int8 weights; precision int16 keeps "
                           f"its weights in 16 bits")
    return value


def check_precision(precision: str) -> str:
    """The element type of `precision` ("int8" or "int16")."""
    if precision not in PRECISIONS:
        raise GlowgenError(f"unknown quantization precision {precision!r}; precisions: "
                           f"{', '.join(PRECISIONS)} (default int8)")
    return PRECISIONS[precision]


@dataclass(frozen=True)
class QuantizationOptions:
    profile: Profile
    schema: str = "asymmetric"
    calibration: Calibration = field(default_factory=lambda: Calibration("minmax"))
    keep_float: frozenset = frozenset()
    dtype: str = "i8"
    weight_bits: Optional[int] = None      # int8 weights' bits; None: the backend's choice

    @property
    def weight_max(self) -> Optional[int]:
        """The largest magnitude of quantized weights when narrower than the type's."""
        if self.dtype == "i8" and self.weight_bits is not None and self.weight_bits < 8:
            return (1 << (self.weight_bits - 1)) - 1
        return None

    @classmethod
    def make(cls, profile, schema: str = "asymmetric", calibration="minmax",
             keep_float: Optional[Iterable[str]] = None, precision: str = "int8",
             registry: Optional[Registry] = None, weight_bits=None) -> "QuantizationOptions":
        """Checked options from what a user passes (a Profile or a path, names as text)."""
        dtype = check_precision(precision)
        bits = check_weight_bits(weight_bits, dtype)
        if schema == "symmetric_uint8" and dtype != "i8":
            raise GlowgenError(f"schema symmetric_uint8 reads an int8 as a uint8 and has no meaning "
                               f"at precision {precision}; use symmetric (or asymmetric) with it")
        profile = as_profile(profile)
        if not isinstance(profile, Profile):
            raise GlowgenError(f"quantize= takes a profile (glowgen.profile(...)) or the path of "
                               f"one, not {type(profile).__name__}")
        if isinstance(keep_float, str):
            keep_float = [k for k in keep_float.split(",") if k.strip()]
        kept = frozenset(k.strip() for k in keep_float or ())
        known = set((registry or Registry.default()).ops) | set((registry or Registry.default()).onnx)
        unknown = sorted(k for k in kept if k not in known)
        if unknown:
            raise GlowgenError(f"--keep-float names unknown op kind{'s' if len(unknown) > 1 else ''} "
                               f"{', '.join(unknown)}; give ONNX op types such as Conv,MatMul")
        return cls(profile, check_schema(schema), Calibration.parse(calibration), kept, dtype, bits)


def calibrate(function: Function, options: QuantizationOptions) -> int:
    """Give every float32 value of `function` that the profile covers its calibrated
    parameters, except results of op kinds kept in float; and so the values inside its
    branches and loop bodies the profile covers (bodies.py: by name, those no other
    function names), a placeholder that stands for a captured value the calibration of that
    value.  Returns how many."""
    count = _calibrate(function.placeholders, function.nodes, options)
    inner = body_values(function)
    for node, sub in nested(function):
        for p, outer in zip(captured_placeholders(node, sub), node.captured):
            p.calibrated = outer.calibrated
        own = {id(v) for v in inner[id(sub)]}
        count += _calibrate([p for p in sub.placeholders if id(p) in own],
                            sub.nodes, options, lambda v: id(v) in own)
    return count


def _calibrate(placeholders, nodes, options: QuantizationOptions, covered=lambda v: True) -> int:
    count = 0
    values = list(placeholders) + [o for n in nodes if n.OP not in options.keep_float for o in n.outputs]
    for v in values:
        t = options.profile.tensors.get(v.name)
        if t is None or v.type.dtype != "f32" or not covered(v):
            continue
        lo, hi = tensor_range(t, options.calibration, options.schema, options.dtype)
        v.calibrated = (options.dtype, choose_params(lo, hi, options.schema, options.dtype))
        if options.weight_max is not None:     # the weights of the products reading v
            v.calibrated += (options.weight_max,)
        count += 1
    return count
