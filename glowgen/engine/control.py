"""Structured control flow in the graph: a node that owns sub-functions.

An ONNX If whose condition is known only at run time (and whose branches produce the same
types) becomes a `Conditional`.  Its operands are the condition (one bool) and the values
the branches capture from the enclosing function; each branch is a Function of its own
whose placeholders stand for those captured values, in the same order, and whose outputs
are the node's results.  So a branch is an ordinary graph: the whole pipeline (rules,
folding, lowering) runs over it unchanged (passes.run_pipeline recurses into it), and the
enclosing graph sees one opaque node.  IRGen turns it into a region of the LIR
(lir/irgen.py): both branches compiled, one run per call.
"""
from __future__ import annotations

from typing import ClassVar, Optional

import attrs

from ..errors import ShapeError
from .graph import Function, Node, OperandInfo
from .types import Type


@attrs.define(eq=False, repr=False, kw_only=True)
class Conditional(Node):
    OP: ClassVar[str] = "Conditional"
    INPUTS: ClassVar[tuple] = (OperandInfo("condition"), OperandInfo("captured", variadic=True))
    OUTPUTS: ClassVar[tuple] = (OperandInfo("result", variadic=True),)

    then_branch: Optional[Function] = None
    else_branch: Optional[Function] = None

    @property
    def condition(self):
        return self.inputs[0]

    @property
    def captured(self) -> tuple:
        return self.inputs[1]

    def subfunctions(self) -> tuple:
        return (self.then_branch, self.else_branch)

    def copy_args(self) -> dict:
        return {"then_branch": self.then_branch.clone(), "else_branch": self.else_branch.clone()}

    def branch(self, taken: bool) -> Function:
        return self.then_branch if taken else self.else_branch

    def infer_type(self) -> tuple[Type, ...]:
        return tuple(v.type for _, v in self.then_branch.outputs)

    def verify(self) -> None:
        """The condition is one bool; each branch takes the captured values' types and both
        give the node's result types."""
        where = f"conditional {self.name!r}"
        cond = self.condition.type
        if cond.dtype != "bool" or cond.size != 1:
            raise ShapeError(f"{where}: the condition must be one bool, not {cond}")
        captured = [v.type for v in self.captured]
        results = [o.type for o in self.outputs]
        for label, fn in (("then", self.then_branch), ("else", self.else_branch)):
            takes = [p.type for p in fn.placeholders]
            if takes != captured:
                raise ShapeError(f"{where}: the {label} branch takes {_types(takes)} but the "
                                 f"node captures {_types(captured)}")
            gives = [v.type for _, v in fn.outputs]
            if gives != results:
                raise ShapeError(f"{where}: the {label} branch gives {_types(gives)} but the node's "
                                 f"results are {_types(results)}")


def _types(types) -> str:
    return "(" + ", ".join(map(str, types)) + ")"


def subfunctions(function: Function) -> list[Function]:
    """The sub-functions the nodes of `function` own (not theirs, recursively)."""
    return [sub for node in function.nodes for sub in node.subfunctions()]
