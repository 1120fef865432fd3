"""Structured control flow in the graph: a node that owns sub-functions.

An ONNX If whose condition is known only at run time (and whose branches produce the same
types) becomes a `Conditional`.  Its operands are the condition (one bool) and the values
the branches capture from the enclosing function; each branch is a Function of its own
whose placeholders stand for those captured values, in the same order, and whose outputs
are the node's results.  So a branch is an ordinary graph: the whole pipeline (rules,
folding, lowering) runs over it unchanged (passes.run_pipeline recurses into it), and the
enclosing graph sees one opaque node.  IRGen turns it into a region of the LIR
(lir/irgen.py): both branches compiled, one run per call.

A `WhileLoop` (an ONNX Loop whose trip count or condition is known only at run time, with
a state of fixed types) owns its body the same way; IRGen makes it a loop of the LIR.
"""
from __future__ import annotations

from typing import ClassVar, Optional

import attrs
import numpy as np

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

    def evaluate(self, args: list, run) -> list:
        """The results on NumPy operands (`run(function, arrays) -> arrays` evaluates a
        sub-function): the reference semantics (glowgen/reference)."""
        cond, captured = args
        return run(self.branch(bool(np.asarray(cond).reshape(-1)[0])), list(captured))

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


@attrs.define(eq=False, repr=False, kw_only=True)
class WhileLoop(Node):
    """A loop run at run time: `body` maps (iteration number i64[], condition bool[], the
    carried state..., captured values...) to (next condition (one bool), next state...).
    It runs while the iteration number is below the trip count (when there is one) and the
    condition holds (when there is one: without it, the body's condition is not read).  The
    results are the final state, of the state's own types: a loop whose state changes type
    from one iteration to the next is not one of these."""
    OP: ClassVar[str] = "WhileLoop"
    INPUTS: ClassVar[tuple] = (OperandInfo("trip_count", optional=True),
                               OperandInfo("condition", optional=True),
                               OperandInfo("initial", variadic=True),
                               OperandInfo("captured", variadic=True))
    OUTPUTS: ClassVar[tuple] = (OperandInfo("final", variadic=True),)

    body: Optional[Function] = None

    @property
    def trip_count(self):
        return self.inputs[0]

    @property
    def condition(self):
        return self.inputs[1]

    @property
    def initial(self) -> tuple:
        return self.inputs[2]

    @property
    def captured(self) -> tuple:
        return self.inputs[3]

    def subfunctions(self) -> tuple:
        return (self.body,)

    def copy_args(self) -> dict:
        return {"body": self.body.clone()}

    def infer_type(self) -> tuple[Type, ...]:
        return tuple(v.type for v in self.initial)

    def evaluate(self, args: list, run) -> list:
        """The final state on NumPy operands (see Conditional.evaluate)."""
        trip, cond, state, captured = args
        trip = None if trip is None else int(np.asarray(trip).reshape(-1)[0])
        going = True if cond is None else bool(np.asarray(cond).reshape(-1)[0])
        state, i = list(state), 0
        while going and (trip is None or i < trip):
            out = run(self.body, [np.array(i, np.int64), np.array(going)] + state + list(captured))
            if cond is not None:
                going = bool(np.asarray(out[0]).reshape(-1)[0])
            state, i = out[1:], i + 1
        return state

    def verify(self) -> None:
        where = f"loop {self.name!r}"
        for label, v, dtype in (("trip count", self.trip_count, "i64"),
                                ("condition", self.condition, "bool")):
            if v is not None and (v.type.dtype != dtype or v.type.size != 1):
                raise ShapeError(f"{where}: the {label} must be one {dtype}, not {v.type}")
        state = [v.type for v in self.initial]
        takes = [p.type for p in self.body.placeholders]
        want = [Type("i64", ()), Type("bool", ())] + state + [v.type for v in self.captured]
        if takes != want:
            raise ShapeError(f"{where}: the body takes {_types(takes)}, not {_types(want)}")
        gives = [v.type for _, v in self.body.outputs]
        if gives[1:] != state or gives[0].dtype != "bool" or gives[0].size != 1:
            raise ShapeError(f"{where}: the body gives {_types(gives)}, not the condition and the "
                             f"state {_types(state)}")
        if [o.type for o in self.outputs] != state:
            raise ShapeError(f"{where}: the results are not of the state's types {_types(state)}")


def _types(types) -> str:
    return "(" + ", ".join(map(str, types)) + ")"


def subfunctions(function: Function) -> list[Function]:
    """The sub-functions the nodes of `function` own (not theirs, recursively)."""
    return [sub for node in function.nodes for sub in node.subfunctions()]
