"""From a tensor's profile to its quantization parameters: which range to represent
(calibration) and how to map it onto integers (schema), as Glow does.

A quantized value q stands for the real number  scale * (q - offset)  (Glow's convention;
ONNX calls the offset the zero point).

Calibration picks the range [low, high] from the profile:
    minmax          the extremes seen
    percentile=P    the central P percent of the values (symmetric schemas: the P-th
                    percentile of |x|), so that rare outliers do not widen every step
    kl              the threshold whose quantized distribution is closest, in Kullback-Leibler
                    divergence, to the observed one (TensorRT's entropy calibration)

Schemas map the range onto the integer type's [qmin, qmax]:
    asymmetric        the range (widened to contain 0) onto [qmin, qmax]; offset anywhere
    symmetric         [-m, m], m = max(|low|, |high|); offset 0
    symmetric_uint8   symmetric, but a range with low >= 0 uses all 256 steps for [0, high]
                      (offset qmin: an i8 that reads as a u8)
    symmetric_power2  symmetric with the scale rounded up to a power of two (rescales become
                      shifts)
Zero is always exactly representable: padding and ReLU depend on it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..engine.types import Quant
from ..errors import GlowgenError
from .profile import TensorProfile

SCHEMAS = ("asymmetric", "symmetric", "symmetric_uint8", "symmetric_power2")
INT_RANGES = {"i8": (-128, 127), "i16": (-32768, 32767)}


@dataclass(frozen=True)
class Calibration:
    method: str                  # "minmax", "percentile" or "kl"
    percentile: float = 100.0

    @classmethod
    def parse(cls, text: "str | Calibration") -> "Calibration":
        if isinstance(text, Calibration):
            return text
        spec = str(text).strip().lower()
        if spec in ("minmax", "kl"):
            return cls(spec)
        name, sep, value = spec.partition("=")
        if name == "percentile" and sep:
            try:
                p = float(value)
            except ValueError:
                p = math.nan
            if not 50.0 < p <= 100.0:
                raise GlowgenError(f"percentile={value}: the percentile must be a number in "
                                   f"(50, 100], e.g. percentile=99.99")
            return cls("percentile", p)
        raise GlowgenError(f"unknown calibration {text!r}; use minmax, kl or percentile=P "
                           f"(e.g. percentile=99.99)")

    def __str__(self) -> str:
        return f"percentile={self.percentile:g}" if self.method == "percentile" else self.method


def check_schema(schema: str) -> str:
    if schema not in SCHEMAS:
        raise GlowgenError(f"unknown quantization schema {schema!r}; schemas: {', '.join(SCHEMAS)}")
    return schema


# ----------------------------------------------------------------------------- ranges
def _quantile(t: TensorProfile, fraction: float) -> float:
    """The value below which `fraction` of the profiled values lie (linear within a bin)."""
    cdf = np.cumsum(t.histogram, dtype=np.float64)
    if cdf[-1] == 0:
        return t.min
    target = fraction * cdf[-1]
    i = int(np.searchsorted(cdf, target, side="left"))
    i = min(i, len(cdf) - 1)
    before = cdf[i - 1] if i else 0.0
    inside = (target - before) / max(t.histogram[i], 1)
    edges = t.bin_edges
    return float(edges[i] + min(max(inside, 0.0), 1.0) * (edges[i + 1] - edges[i]))


def _abs_histogram(t: TensorProfile) -> tuple[np.ndarray, float]:
    """The histogram of |x| over [0, max|x|] with as many bins as `t` has, and that max."""
    top = max(abs(t.min), abs(t.max))
    n = len(t.histogram)
    if top == 0.0:
        return np.array([t.histogram.sum()] + [0] * (n - 1), dtype=np.float64), 0.0
    centers = np.abs((t.bin_edges[:-1] + t.bin_edges[1:]) / 2)
    idx = np.minimum((centers / top * n).astype(np.int64), n - 1)
    out = np.zeros(n, dtype=np.float64)
    np.add.at(out, idx, t.histogram.astype(np.float64))
    return out, top


def _kl_threshold(hist: np.ndarray, top: float, levels: int) -> float:
    """TensorRT's entropy calibration on a histogram of |x| over [0, top]: the threshold
    whose clipped distribution, quantized to `levels` levels, loses the least information."""
    n = len(hist)
    if n <= levels or top == 0.0:
        return top
    # The bin at zero is inside every threshold; left in, the spike of exact zeros a ReLU
    # writes (often half the values) dominates the divergence as each candidate's first level
    # spreads it over its neighbours, and pulls the threshold far down.
    hist = hist.copy()
    hist[0] = 0
    best_i, best_kl = n, math.inf
    total = hist.sum()
    if total == 0 or np.count_nonzero(hist) <= levels:
        return top          # few distinct values (pixels in k/16 steps): levels enough for all
    for i in range(levels, n + 1, max(1, (n - levels) // 256)):
        p = hist[:i].copy()
        p[-1] += hist[i:].sum()                        # outliers clipped into the last bin
        # Q: P merged into `levels` groups (as np.array_split cuts them), each spread evenly
        # over its nonzero bins.
        sizes = np.full(levels, i // levels)
        sizes[:i % levels] += 1
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        sliced = hist[:i]
        nonzero = sliced > 0
        sums = np.add.reduceat(sliced, starts).astype(np.float64)
        counts = np.add.reduceat(nonzero.astype(np.int64), starts)
        per_bin = np.divide(sums, counts, out=np.zeros(levels), where=counts > 0)
        q = np.where(nonzero, np.repeat(per_bin, sizes), 0.0)
        mask = p > 0
        if not mask.any():
            continue
        pn = p / total
        qs = q.sum()
        if qs == 0:
            continue
        qn = q / qs
        with np.errstate(divide="ignore", invalid="ignore"):
            kl = float(np.sum(pn[mask] * np.log(pn[mask] / np.where(qn[mask] > 0, qn[mask], 1e-12))))
        if kl < best_kl:
            best_i, best_kl = i, kl
    return top * best_i / n


def tensor_range(t: TensorProfile, calibration: "str | Calibration" = "minmax",
                 schema: str = "asymmetric", dtype: str = "i8") -> tuple[float, float]:
    """The range of `t` that quantization represents, per `calibration`."""
    cal = Calibration.parse(calibration)
    symmetric = schema != "asymmetric"
    if cal.method == "minmax" or t.count == 0:
        return t.min, t.max
    if cal.method == "percentile":
        if symmetric:
            hist, top = _abs_histogram(t)
            m = _quantile(TensorProfile(0.0, top, hist.astype(np.int64), t.count),
                          cal.percentile / 100) if top else 0.0
            return max(t.min, -m), min(t.max, m)
        tail = (1 - cal.percentile / 100) / 2
        return _quantile(t, tail), _quantile(t, 1 - tail)
    hist, top = _abs_histogram(t)
    qmin, qmax = INT_RANGES[dtype]
    m = _kl_threshold(hist, top, (qmax - qmin + 1) // 2)
    return max(t.min, -m), min(t.max, m)


# ----------------------------------------------------------------------------- parameters
def choose_params(low: float, high: float, schema: str = "asymmetric", dtype: str = "i8") -> Quant:
    """Scale and offset representing [low, high] in `dtype` under `schema`."""
    check_schema(schema)
    if dtype not in INT_RANGES:
        raise GlowgenError(f"quantized element type {dtype!r} is not supported; use "
                           f"{' or '.join(INT_RANGES)}")
    if not (math.isfinite(low) and math.isfinite(high)) or low > high:
        raise GlowgenError(f"cannot quantize the range [{low}, {high}]")
    qmin, qmax = INT_RANGES[dtype]
    low, high = min(low, 0.0), max(high, 0.0)           # zero must be representable
    tiny = np.finfo(np.float32).tiny
    if schema == "asymmetric":
        scale = max((high - low) / (qmax - qmin), tiny)
        offset = int(round(qmin - low / scale))
        return Quant(float(np.float32(scale)), min(max(offset, qmin), qmax))
    if schema == "symmetric_uint8" and low >= 0.0:
        return Quant(float(np.float32(max(high / (qmax - qmin), tiny))), qmin)
    m = max(-low, high)
    scale = max(m / qmax, tiny)
    if schema == "symmetric_power2":
        scale = 2.0 ** math.ceil(math.log2(scale))
    return Quant(float(np.float32(scale)), 0)


def quantize_array(x: np.ndarray, quant: Quant, dtype: str = "i8") -> np.ndarray:
    """x in `dtype` (round half to even, saturating), as the int8 kernels quantize."""
    qmin, qmax = INT_RANGES[dtype]
    q = np.rint(np.asarray(x, dtype=np.float32) / np.float32(quant.scale)) + quant.offset
    return np.clip(q, qmin, qmax).astype(np.int8 if dtype == "i8" else np.int16)


def dequantize_array(q: np.ndarray, quant: Quant) -> np.ndarray:
    return (np.float32(quant.scale) * (q.astype(np.float32) - np.float32(quant.offset))).astype(np.float32)
