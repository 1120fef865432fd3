"""Calibration data from files: an .npz holding, for each model input, an array whose first
axis runs over samples (each sample has the input's shape), or a directory of such files
(read in name order, their samples concatenated)."""
from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from ..errors import InputError


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    if not zipfile.is_zipfile(path):
        raise InputError(f"calibration data {path}: cannot read it as an .npz archive of arrays "
                         f"(it is not one); write one with numpy.savez(path, input_name=array)")
    try:
        with np.load(path, allow_pickle=False) as data:
            if not isinstance(data, np.lib.npyio.NpzFile):
                raise ValueError("not an .npz archive")
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise InputError(f"calibration data {path}: cannot read it as an .npz archive of arrays "
                         f"({e}); write one with numpy.savez(path, input_name=array)") from None


def load_samples(path, input_names: Sequence[str], limit: Optional[int] = None) -> list[dict]:
    """The samples in `path` as feed dicts, checked against the model's `input_names`."""
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("*.npz"))
        if not files:
            raise InputError(f"calibration data {path}/ holds no .npz file")
    elif path.exists():
        files = [path]
    else:
        raise InputError(f"calibration data {path} does not exist")
    samples: list[dict] = []
    for f in files:
        arrays = _read_npz(f)
        unknown = sorted(set(arrays) - set(input_names))
        missing = [n for n in input_names if n not in arrays]
        if unknown or missing:
            raise InputError(
                f"calibration data {f}: " + "; ".join(
                    ([f"holds {', '.join(map(repr, unknown))}, not an input of the model"] if unknown else [])
                    + ([f"lacks input{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}"]
                       if missing else []))
                + f" (the model's inputs: {', '.join(map(repr, input_names))})")
        counts = {n: (a.shape[0] if a.ndim else None) for n, a in arrays.items()}
        if None in counts.values() or len(set(counts.values())) != 1:
            raise InputError(f"calibration data {f}: every array's first axis runs over the samples "
                             f"and must have the same length; got "
                             + ", ".join(f"{n}: {list(a.shape)}" for n, a in arrays.items()))
        n = next(iter(counts.values()))
        samples.extend({name: arrays[name][i] for name in input_names} for i in range(n))
        if limit is not None and len(samples) >= limit:
            return samples[:limit]
    if not samples:
        raise InputError(f"calibration data {path} holds no samples (its first axes are empty)")
    return samples
