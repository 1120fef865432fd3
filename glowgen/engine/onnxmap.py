"""The shape of one generated ONNX mapping (an `onnx` clause of ops.glowdef)."""
from __future__ import annotations

from typing import Callable, Optional

import attrs


@attrs.frozen
class OnnxClause:
    onnx_op: str
    op: str                       # our op name
    since: Optional[int]
    until: Optional[int]
    inputs: tuple                 # (onnx formal input name, "single"|"optional"|"variadic")
    operands: tuple               # (onnx formal input name, our operand index)
    attributes: Callable          # (OnnxNodeView) -> dict of our attributes
    consumed: tuple               # ONNX attribute names this clause understands
    location: str
    guard: Optional[Callable] = None   # (OnnxNodeView) -> bool: does this clause take the node?
    # (onnx variadic input, our operand index, start, step): every step-th of its values from
    # start (onnxruntime's QLinearConcat interleaves tensors, scales and zero points).
    strided: tuple = ()

    def applies(self, opset: int) -> bool:
        return (self.since is None or opset >= self.since) and (self.until is None or opset <= self.until)
