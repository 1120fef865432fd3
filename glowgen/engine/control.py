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
a state of fixed types, or one running too many iterations to unroll; an ONNX Scan over a
long axis) owns its body the same way; IRGen makes it a loop of the LIR.
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
    carried state..., the slices of the scanned values..., captured values...) to (next
    condition (one bool), next state..., the slices of the stacked results...).

    It runs while the iteration number is below the trip count (when there is one) and the
    condition holds (when there is one: without it, the body's condition is not read).  The
    results are the final state, of the state's own types (a loop whose state changes type
    from one iteration to the next is not one of these), then the stacked results.

    Scanning and stacking (an ONNX Loop's scan outputs, a Scan's inputs and outputs) need
    the number of iterations at compile time, `length`: shapes are static.  A loop with
    either runs exactly `length` times (its trip count is that constant and it has no
    condition; the frontend checks it).  Iteration i reads slice i of each scanned value
    (along its first axis; `length - 1 - i` for one in `reverse_scanned`) and writes slice
    i of each stacked result (`length - 1 - i` for one in `reverse_stacked`): IRGen makes
    those slices views into the whole tensors at an offset the counter decides at run time,
    so no iteration copies what earlier ones scanned or stacked."""
    OP: ClassVar[str] = "WhileLoop"
    INPUTS: ClassVar[tuple] = (OperandInfo("trip_count", optional=True),
                               OperandInfo("condition", optional=True),
                               OperandInfo("initial", variadic=True),
                               OperandInfo("scanned", variadic=True),
                               OperandInfo("captured", variadic=True))
    OUTPUTS: ClassVar[tuple] = (OperandInfo("final", variadic=True),)

    body: Optional[Function] = None
    length: int = 0                       # iterations, when it scans or stacks
    reverse_scanned: tuple = ()           # per scanned value: read from the last slice back
    reverse_stacked: tuple = ()           # per stacked result: written from the last slice back

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
    def scanned(self) -> tuple:
        return self.inputs[3]

    @property
    def captured(self) -> tuple:
        return self.inputs[4]

    @property
    def n_state(self) -> int:
        return len(self.initial)

    def subfunctions(self) -> tuple:
        return (self.body,)

    def copy_args(self) -> dict:
        return {"body": self.body.clone(), **self.attr_values()}

    def attr_values(self) -> dict:
        """What a loop that scans or stacks adds to its operands (printed in dumps as
        attributes: 1 for a direction read or written from the last slice back)."""
        if not (self.scanned or self.reverse_stacked):
            return {}
        return {"length": self.length, "reverse_scanned": tuple(map(int, self.reverse_scanned)),
                "reverse_stacked": tuple(map(int, self.reverse_stacked))}

    def stacked_slices(self) -> list[Type]:
        """The types of the body's slices of the stacked results."""
        return [v.type for _, v in self.body.outputs[1 + self.n_state:]]

    def infer_type(self) -> tuple[Type, ...]:
        return tuple(v.type for v in self.initial) + tuple(
            t.with_shape((self.length,) + tuple(t.shape)) for t in self.stacked_slices())

    def evaluate(self, args: list, run) -> list:
        """The final state and the stacked results on NumPy operands (see
        Conditional.evaluate)."""
        trip, cond, state, scanned, captured = args
        trip = None if trip is None else int(np.asarray(trip).reshape(-1)[0])
        going = True if cond is None else bool(np.asarray(cond).reshape(-1)[0])
        state, i = list(state), 0
        stacks = [np.empty(o.type.shape, o.type.np_dtype) for o in self.outputs[self.n_state:]]
        last = self.length - 1
        while going and (trip is None or i < trip):
            slices = [x[last - i] if rev else x[i] for x, rev in zip(scanned, self.reverse_scanned)]
            out = run(self.body, [np.array(i, np.int64), np.array(going)] + state + slices
                      + list(captured))
            if cond is not None:
                going = bool(np.asarray(out[0]).reshape(-1)[0])
            for stack, piece, rev in zip(stacks, out[1 + self.n_state:], self.reverse_stacked):
                stack[last - i if rev else i] = piece
            state, i = out[1:1 + self.n_state], i + 1
        return state + stacks

    def verify(self) -> None:
        where = f"loop {self.name!r}"
        for label, v, dtype in (("trip count", self.trip_count, "i64"),
                                ("condition", self.condition, "bool")):
            if v is not None and (v.type.dtype != dtype or v.type.size != 1):
                raise ShapeError(f"{where}: the {label} must be one {dtype}, not {v.type}")
        state = [v.type for v in self.initial]
        slices = []
        for v in self.scanned:
            if v.type.rank == 0 or v.type.shape[0] != self.length:
                raise ShapeError(f"{where}: a scanned value is {v.type}, not {self.length} slices "
                                 f"along its first axis")
            slices.append(v.type.with_shape(tuple(v.type.shape[1:])))
        if len(self.reverse_scanned) != len(self.scanned):
            raise ShapeError(f"{where}: {len(self.reverse_scanned)} directions for "
                             f"{len(self.scanned)} scanned values")
        takes = [p.type for p in self.body.placeholders]
        want = ([Type("i64", ()), Type("bool", ())] + state + slices
                + [v.type for v in self.captured])
        if takes != want:
            raise ShapeError(f"{where}: the body takes {_types(takes)}, not {_types(want)}")
        gives = [v.type for _, v in self.body.outputs]
        if gives[1:1 + len(state)] != state or gives[0].dtype != "bool" or gives[0].size != 1:
            raise ShapeError(f"{where}: the body gives {_types(gives)}, not the condition and the "
                             f"state {_types(state)} first")
        stacked = gives[1 + len(state):]
        if len(self.reverse_stacked) != len(stacked):
            raise ShapeError(f"{where}: {len(self.reverse_stacked)} directions for "
                             f"{len(stacked)} stacked results")
        if (slices or stacked) and self.condition is not None:
            raise ShapeError(f"{where}: a loop that scans or stacks runs the number of "
                             f"iterations known at compile time ({self.length}): it has no condition")
        if [o.type for o in self.outputs] != list(self.infer_type()):
            raise ShapeError(f"{where}: the results are {_types(o.type for o in self.outputs)}, "
                             f"not {_types(self.infer_type())}")


def _types(types) -> str:
    return "(" + ", ".join(map(str, types)) + ")"


def subfunctions(function: Function) -> list[Function]:
    """The sub-functions the nodes of `function` own (not theirs, recursively)."""
    return [sub for node in function.nodes for sub in node.subfunctions()]
