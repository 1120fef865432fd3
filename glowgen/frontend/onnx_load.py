"""Reading and checking ONNX models: files, bytes and protos (external data kept inside the
model's folder and within the memory limit), the opsets glowgen knows, the inputs a model
declares, and the copy of a model ONNX's shape inference checks our types against."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Union

import onnx
from onnx import helper

from ..engine.types import Type, dtype_from_onnx
from ..errors import ModelError, UnsupportedError
from ..memory_limit import check_limit

class CheckedModel:
    """A model `load_model` has read and checked already: compiling it again (a variant per
    input shape) skips the check, which takes seconds on a large model."""

    def __init__(self, proto: onnx.ModelProto):
        self.proto = proto


ModelLike = Union[str, os.PathLike, onnx.ModelProto, bytes, CheckedModel]

# The newest opset of the default ONNX domain the `onnx` clauses of specs/ops.glowdef are
# written and checked against (ONNX 1.23's schemas; the conformance suite runs up to it).  A
# model importing a newer one is refused, naming both versions: an op whose meaning changed
# since would otherwise be imported with the old meaning and compute wrong answers silently.
# Raise it after reviewing the ops ONNX changed in the new opsets (docs/Changelog.md).
NEWEST_OPSET = 28


# Initializers with more elements than this reach ONNX's shape inference as typed graph inputs
# without their data: inference needs only their types, and copying, serializing and parsing
# back ResNet-50's 100 MB of weights took a second of every compile.  Small ones keep their data,
# as shape inference reads the values of shape tensors (Reshape's target, Slice's bounds, ...).
_INFERENCE_DATA_LIMIT = 1024


def _copy_fields(src, dst, skip=()) -> None:
    for field, value in src.ListFields():
        if field.name in skip:
            continue
        repeated = getattr(field, "is_repeated", None)
        if repeated is None:        # older protobuf: no is_repeated
            repeated = field.label == field.LABEL_REPEATED
        if repeated:
            getattr(dst, field.name).extend(value)
        elif field.message_type is not None:
            getattr(dst, field.name).CopyFrom(value)
        else:
            setattr(dst, field.name, value)


def without_large_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` for shape inference: large initializers become typed inputs."""
    proto = onnx.ModelProto()
    _copy_fields(model, proto, skip=("graph",))
    _copy_fields(model.graph, proto.graph, skip=("initializer",))
    inputs = {vi.name for vi in proto.graph.input}
    for init in model.graph.initializer:
        size = 1
        for d in init.dims:
            size *= d
        if size <= _INFERENCE_DATA_LIMIT:
            proto.graph.initializer.append(init)
        elif init.name not in inputs:
            proto.graph.input.append(helper.make_tensor_value_info(
                init.name, init.data_type, list(init.dims)))
    return proto


# ----------------------------------------------------------------------------- loading
def load_model(model: ModelLike, max_memory=None) -> onnx.ModelProto:
    """Read and check an ONNX model; every failure is a `ModelError` that says why.
    `max_memory` (a memory_limit.MemoryLimit) bounds the external weights read."""
    if isinstance(model, CheckedModel):
        return model.proto
    if isinstance(model, onnx.ModelProto):
        proto = model
        where = "the model"
    elif isinstance(model, bytes):
        proto = _parse(model, "the model bytes")
        where = "the model bytes"
    else:
        path = Path(model)
        where = str(path)
        if not path.exists():
            raise ModelError(f"{path}: no such file")
        if path.is_dir():
            raise ModelError(f"{path} is a directory; pass the .onnx file")
        proto = _parse(path.read_bytes(), str(path))
        external = [t for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
        if external:
            _check_external_sizes(external, path, max_memory)
            try:
                onnx.load_external_data_for_model(proto, str(path.parent))
            except Exception as e:
                raise ModelError(f"{path}: cannot load external weights: {e}") from None
    if not proto.graph.node and not proto.graph.output:
        raise ModelError(f"{where} is not an ONNX model (it has no graph); is it truncated or "
                         f"another kind of file?")
    check_opset(proto, where)
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else "invalid model"
        raise ModelError(f"{where} is not a valid ONNX model: {first}") from None
    return proto


def _check_external_sizes(tensors, path: Path, max_memory) -> None:
    """The external weights' sizes against the limit, before any is read."""
    total = 0
    for t in tensors:
        ty = Type(dtype_from_onnx(t.data_type), tuple(t.dims))
        check_limit(max_memory, f"{path}: external weight {t.name!r} ({ty})", ty.nbytes)
        total += ty.nbytes
    check_limit(max_memory, f"{path}: the {len(tensors)} external weights", total)


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception:
        raise ModelError(f"{where} is not an ONNX model: the file does not parse as an ONNX "
                         f"protobuf (is it truncated, or another kind of file?)") from None
    if not proto.HasField("graph"):
        raise ModelError(f"{where} is not an ONNX model: it has no graph (is it truncated, or "
                         f"another kind of file?)")
    return proto


def default_opset(proto: onnx.ModelProto) -> int:
    for imp in proto.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return 1


def check_opset(proto: onnx.ModelProto, where: str) -> None:
    """Refuse a default-domain opset newer than the specs know (see NEWEST_OPSET)."""
    opset = default_opset(proto)
    if opset > NEWEST_OPSET:
        raise UnsupportedError(
            f"{where} imports opset {opset} of the default ONNX domain, but glowgen knows opsets "
            f"1 to {NEWEST_OPSET}; export the model at opset {NEWEST_OPSET} or lower, or convert it "
            f"with onnx.version_converter.convert_version(model, {NEWEST_OPSET})")


def declared_dims(vi: onnx.ValueInfoProto) -> Optional[list]:
    """The dimensions a graph input declares: an int for a fixed one, the dim_param's name
    (a str) or None for a dynamic one; None when no shape is declared.  A negative
    dim_value (exporters write -1) is dynamic, as onnxruntime reads it; 0 is a fixed,
    empty dimension (onnxruntime rejects any other size for it)."""
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else (d.dim_param or None)
            for d in tt.shape.dim]


def declared_inputs(proto: onnx.ModelProto) -> list[tuple[str, str, Optional[list]]]:
    """(name, element type, declared dims) of each graph input that is not an initializer."""
    inits = {i.name for i in proto.graph.initializer}
    out = []
    for vi in proto.graph.input:
        if vi.name in inits:
            continue
        if not vi.type.HasField("tensor_type"):
            raise UnsupportedError(f"input {vi.name!r} is not a tensor (sequences, maps and "
                                   f"optionals are not supported)")
        out.append((vi.name, dtype_from_onnx(vi.type.tensor_type.elem_type), declared_dims(vi)))
    return out
