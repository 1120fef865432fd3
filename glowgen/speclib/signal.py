"""Signal processing: DFT lengths, shapes and matrices, STFT frames.

Each function marked @helper is callable from the specs, where specs/helpers.glowdef declares
it with its parameters."""
from __future__ import annotations

import numpy as np

from .registry import helper


@helper
def dft_length(shape, axis, given, inverse, onesided):
    """ONNX DFT's transform length: dft_length when given (> 0), else the axis' size (or,
    for an inverse one-sided transform, the full signal length 2 * (size - 1))."""
    if given > 0:
        return int(given)
    if inverse and onesided:
        return 2 * (shape[axis] - 1)
    return shape[axis]


@helper
def dft_bins(length, inverse, onesided):
    """How many values the transform produces along its axis."""
    return length // 2 + 1 if onesided and not inverse else length


@helper
def dft_shape(shape, axis, length, inverse, onesided):
    """The result shape of DFT: `axis` holds the bins, the last dimension is 2 (real and
    imaginary parts), or 1 for an inverse one-sided (real-valued) transform."""
    out = list(shape)
    out[axis] = dft_bins(length, inverse, onesided)
    out[-1] = 1 if inverse and onesided else 2
    return tuple(out)


@helper
def dft_perm(rank, axis):
    """A permutation that moves `axis` just before the last (real/imaginary) dimension."""
    return tuple(d for d in range(rank - 1) if d != axis) + (axis, rank - 1)


@helper
def dft_matrix(size, parts, length, inverse, onesided):
    """The DFT along one axis as a real matrix: row (n, c) is what input element n, real
    (c = 0) or imaginary (c = 1) part, contributes to each output (bin, part).  Built by
    transforming unit inputs with NumPy's FFT, which defines the semantics (zero padding or
    truncation to `length`, 1/length scaling of the inverse, Hermitian one-sided inverse)."""
    rows = []
    for n in range(size):
        for c in range(parts):
            unit = np.zeros(size, np.complex128)
            unit[n] = 1j if c else 1.0
            if inverse and onesided:
                out = np.fft.irfft(unit, n=length)[:, None]
            else:
                full = np.fft.ifft(unit, n=length) if inverse else np.fft.fft(unit, n=length)
                full = full[:dft_bins(length, inverse, onesided)]
                out = np.stack([full.real, full.imag], axis=-1)
            rows.append(tuple(float(v) for v in out.reshape(-1)))
    return tuple(rows)


@helper
def frame_indices(length, frame, step):
    """Sample positions of the frames of a signal of `length` samples: one row of `frame`
    positions every `step` samples, as many whole frames as fit."""
    count = 1 + (length - frame) // step
    return tuple(tuple(f * step + i for i in range(frame)) for f in range(count))
