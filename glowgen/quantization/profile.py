"""A quantization profile: the range and histogram of every float tensor of one model.

Written by `glowgen profile` (glowgen/quantization/profiler.py) and read when compiling with
`--quantize`.  The file is JSON, keyed by tensor name (the ONNX model's names):

    {"format": "glowgen-profile", "version": 1,
     "model": {"sha256": "...", "name": "..."}, "samples": 100, "bins": 2048,
     "tensors": {"conv1_out": {"min": -3.1, "max": 7.9, "count": 802816,
                               "histogram": [0, 12, ...]}, ...}}

A tensor's histogram counts its values over all samples in `bins` equal bins over
[min, max].  A profile is per tensor, not per shape: it applies to any input shapes of its
model.  It names its model by a fingerprint of the graph and weights (not of the declared
input shapes), and a profile of another model is refused.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import GlowgenError, InputError

FORMAT = "glowgen-profile"
VERSION = 1


@dataclass(frozen=True)
class TensorProfile:
    """What calibration saw of one tensor: its extremes and how its values spread."""
    min: float
    max: float
    histogram: np.ndarray       # counts (int64) over `bins` equal bins of [min, max]
    count: int                  # values seen: the histogram's total

    @property
    def bin_edges(self) -> np.ndarray:
        return np.linspace(self.min, self.max, len(self.histogram) + 1)

    def to_json(self) -> dict:
        return {"min": self.min, "max": self.max, "count": self.count,
                "histogram": [int(c) for c in self.histogram]}

    @classmethod
    def from_json(cls, name: str, data: Mapping, where: str) -> "TensorProfile":
        try:
            lo, hi = float(data["min"]), float(data["max"])
            hist = np.asarray(data["histogram"], dtype=np.int64)
            count = int(data.get("count", hist.sum()))
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(f"{where}: tensor {name!r}: a tensor needs min, max and a histogram "
                             f"of counts ({type(e).__name__}: {e})") from None
        if not (np.isfinite(lo) and np.isfinite(hi) and lo <= hi) or hist.ndim != 1 or \
                hist.size == 0 or (hist < 0).any():
            raise InputError(f"{where}: tensor {name!r}: needs finite min <= max and a non-empty "
                             f"histogram of non-negative counts")
        return cls(lo, hi, hist, count)


def model_fingerprint(proto: onnx.ModelProto) -> str:
    """SHA-256 of what a model computes: its nodes (with attributes and subgraphs) and its
    initializers' names and values.  Declared input shapes, names of the producer and doc
    strings do not count, so binding a dynamic dimension keeps a profile valid."""
    h = hashlib.sha256()

    def text(s: str) -> None:
        b = s.encode()
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)

    graph = proto.graph
    for opset in sorted((o.domain, o.version) for o in proto.opset_import):
        text(f"opset {opset[0]} {opset[1]}")
    for node in graph.node:
        text(f"{node.domain}::{node.op_type}")
        for name in node.input:
            text("in " + name)
        for name in node.output:
            text("out " + name)
        for attr in node.attribute:
            text("attr " + attr.name)
            h.update(attr.SerializeToString(deterministic=True))
    for init in graph.initializer:
        text(f"init {init.name} {init.data_type} {list(init.dims)}")
        h.update(np.ascontiguousarray(numpy_helper.to_array(init)).tobytes())
    for out in graph.output:
        text("output " + out.name)
    return h.hexdigest()


class Profile:
    """Per-tensor calibration statistics of one model (see the module docstring)."""

    def __init__(self, tensors: Mapping[str, TensorProfile], model_sha256: str,
                 model_name: str = "", samples: int = 0):
        self.tensors: dict[str, TensorProfile] = dict(tensors)
        self.model_sha256 = model_sha256
        self.model_name = model_name
        self.samples = samples

    @property
    def bins(self) -> int:
        return max((len(t.histogram) for t in self.tensors.values()), default=0)

    def __getitem__(self, name: str) -> TensorProfile:
        return self.tensors[name]

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def __len__(self) -> int:
        return len(self.tensors)

    def __repr__(self) -> str:
        return (f"<Profile of {self.model_name or 'a model'}: {len(self.tensors)} tensors, "
                f"{self.samples} samples, {self.bins} bins>")

    def check_model(self, proto: onnx.ModelProto, where: str = "the profile") -> None:
        """Refuse to apply this profile to a model it was not made for."""
        got = model_fingerprint(proto)
        if got != self.model_sha256:
            raise InputError(
                f"{where} was made for another model ({self.model_name or 'unnamed'}, sha256 "
                f"{self.model_sha256[:12]}...), not this one (sha256 {got[:12]}...): its tensor "
                f"ranges would not fit; profile this model with `glowgen profile`")

    # ------------------------------------------------------------------ files
    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION,
                "model": {"sha256": self.model_sha256, "name": self.model_name},
                "samples": self.samples, "bins": self.bins,
                "tensors": {name: t.to_json() for name, t in self.tensors.items()}}

    def save(self, path) -> None:
        """Write the profile as JSON (atomically: a reader never sees half a file)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        try:
            with open(tmp, "w") as f:
                json.dump(self.to_json(), f, separators=(",", ":"))
                f.write("\n")
            os.replace(tmp, path)
        except OSError as e:
            raise GlowgenError(f"cannot write the profile to {path}: {e.strerror or e}") from None

    @classmethod
    def from_json(cls, data, where: str = "profile") -> "Profile":
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise InputError(f"{where} is not a glowgen profile (no \"format\": \"{FORMAT}\"); "
                             f"write one with `glowgen profile MODEL --calibration DATA -o FILE`")
        if data.get("version") != VERSION:
            raise InputError(f"{where} is a version {data.get('version')!r} glowgen profile; this "
                             f"glowgen reads version {VERSION}: profile the model again")
        model = data.get("model") or {}
        tensors = data.get("tensors")
        if not isinstance(tensors, dict) or not isinstance(model.get("sha256"), str):
            raise InputError(f"{where}: a profile needs \"model\": {{\"sha256\": ...}} and "
                             f"\"tensors\": {{name: ...}}")
        return cls({name: TensorProfile.from_json(name, t, where) for name, t in tensors.items()},
                   model["sha256"], str(model.get("name", "")), int(data.get("samples", 0)))


def load_profile(path) -> Profile:
    """Read a profile written by `Profile.save` / `glowgen profile`."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise InputError(f"cannot read the profile {path}: {e.strerror or e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{path} is not JSON ({e.msg} at line {e.lineno}); is it a glowgen "
                         f"profile?") from None
    return Profile.from_json(data, where=str(path))


def as_profile(profile_or_path) -> Optional[Profile]:
    if profile_or_path is None or isinstance(profile_or_path, Profile):
        return profile_or_path
    return load_profile(profile_or_path)
