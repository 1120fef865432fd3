"""The high-level graph: a Function of Placeholders, Constants and typed Nodes.

Every value knows its users, so a rewrite is "build the replacement, redirect the users,
let dead-code elimination collect the rest".  Node classes are generated from
`specs/ops.glowdef`; this module only has their generic base.
"""
from __future__ import annotations

import re
from typing import ClassVar, Iterable, Optional

import attrs
import numpy as np

from ..errors import GlowgenError, ShapeError
from .types import Type


class Value:
    """Anything that can be an operand: a Placeholder, a Constant or a node's output."""
    type: Type
    name: str

    def __init__(self, type: Type, name: str):
        self.type = type
        self.name = name
        self.users: list[tuple["Node", int]] = []   # (node, operand index)
        # The quantization parameters calibration chose for this value (a Quant), when the
        # compilation quantizes and profiled it; rules of the [quantize] phase read them.
        self.calibrated = None

    # Convenience accessors used by spec expressions (`x.shape`, `x.dtype`).
    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> str:
        return self.type.dtype

    @property
    def rank(self) -> int:
        return self.type.rank

    @property
    def producer(self) -> Optional["Node"]:
        return None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} %{self.name}: {self.type}>"


class Placeholder(Value):
    """A graph input, bound at run time."""


class Constant(Value):
    """A compile-time tensor (weights)."""

    def __init__(self, data: np.ndarray, name: str):
        data = np.asarray(data)
        data.setflags(write=False)
        super().__init__(Type.of(data), name)
        self.data = data


class Output(Value):
    """Result number `index` of a node."""

    def __init__(self, node: "Node", index: int, type: Type, name: str):
        super().__init__(type, name)
        self.node = node
        self.index = index

    @property
    def producer(self) -> "Node":
        return self.node


@attrs.define(eq=False, repr=False, kw_only=True)
class Node:
    """Base of all generated node classes.

    `inputs` holds one entry per declared operand: a Value, None for an absent optional
    operand, or a tuple of Values for a variadic operand.  Attributes are attrs fields
    declared by the generated subclass."""

    OP: ClassVar[str] = "?"
    INPUTS: ClassVar[tuple] = ()         # OperandInfo
    OUTPUTS: ClassVar[tuple] = ()        # OperandInfo
    ATTRS: ClassVar[tuple] = ()          # AttrInfo
    TRAITS: ClassVar[frozenset] = frozenset()
    INPLACE: ClassVar[tuple] = ()
    LOCATION: ClassVar[str] = ""

    inputs: list = attrs.field(factory=list)
    name: str = ""
    outputs: list = attrs.field(factory=list)
    origin: tuple = ()                   # ONNX node names this node came from
    rules: tuple = ()                    # rewrite rules that made it

    # --- declared interface, filled in by generated classes
    @classmethod
    def infer(cls, *operand_types, **attr_values) -> tuple[Type, ...]:
        raise NotImplementedError

    def attr_values(self) -> dict:
        return {a.name: getattr(self, a.name) for a in self.ATTRS}

    def operand_types(self) -> list:
        out = []
        for v in self.inputs:
            if v is None:
                out.append(None)
            elif isinstance(v, tuple):
                out.append(tuple(x.type for x in v))
            else:
                out.append(v.type)
        return out

    def infer_type(self) -> tuple[Type, ...]:
        types = self.infer(*self.operand_types(), _node=self.name, **self.attr_values())
        return self._with_quant(types)

    def _with_quant(self, types: tuple) -> tuple:
        """Quantized element types, by trait: an op marked `quantized` gives its integer
        results the scale and offset of its attributes `scale` and `offset`; one marked
        `quant_passthrough` (data movement, max) keeps its first operand's (for a concatenation,
        its first part's: every part has the same, its check says)."""
        if "quantized" in self.TRAITS:
            from .types import INT_DTYPES, Quant
            q = Quant(self.scale, self.offset)
            return tuple(t.with_quant(q) if t.dtype in INT_DTYPES else t for t in types)
        if "quant_passthrough" in self.TRAITS and self.inputs:
            first = self.inputs[0]
            if isinstance(first, tuple):        # a variadic operand: its first value
                first = first[0] if first else None
            q = getattr(first, "type", None) and first.type.quant
            if q is not None:
                return tuple(t.with_quant(q) if t.dtype == first.type.dtype else t for t in types)
        return types

    def verify(self) -> None:
        """Re-check the declaration against the current operand types."""
        types = self.infer_type()
        for out, ty in zip(self.outputs, types):
            if out.type != ty:
                raise ShapeError(f"{self.OP} (node {self.name!r}): output {out.name!r} has type "
                                 f"{out.type} but the declaration infers {ty}")

    def flat_inputs(self) -> list[Value]:
        out = []
        for v in self.inputs:
            if isinstance(v, tuple):
                out.extend(v)
            elif v is not None:
                out.append(v)
        return out

    def map_operands(self, fn) -> Optional[list]:
        """`fn` applied to every operand value, keeping the structure (None for an absent
        operand, tuples for variadic ones); None as soon as `fn` returns None."""
        out = []
        for v in self.inputs:
            if v is None:
                out.append(None)
            elif isinstance(v, tuple):
                items = tuple(fn(x) for x in v)
                if any(x is None for x in items):
                    return None
                out.append(items)
            else:
                r = fn(v)
                if r is None:
                    return None
                out.append(r)
        return out

    def has_trait(self, trait: str) -> bool:
        return trait in self.TRAITS

    def subfunctions(self) -> tuple:
        """The Functions this node owns (a conditional's branches; engine/control.py).  Generic
        passes treat such a node as opaque and run over its sub-functions separately."""
        return ()

    def copy_args(self) -> dict:
        """The keyword arguments `Function.add_node` needs to build a node like this one, in
        another graph: its attributes (a node owning sub-functions adds copies of them, so
        passes over one graph leave the other alone)."""
        return self.attr_values()

    # Spec expressions may ask a matched node for the type of its (first) result.
    @property
    def type(self) -> Type:
        return self.outputs[0].type

    @property
    def shape(self):
        return self.outputs[0].type.shape

    @property
    def dtype(self):
        return self.outputs[0].type.dtype

    @property
    def rank(self):
        return self.outputs[0].type.rank

    def __repr__(self) -> str:
        return f"<{self.OP} {self.name!r}>"


@attrs.frozen
class OperandInfo:
    name: str
    optional: bool = False
    variadic: bool = False


@attrs.frozen
class AttrInfo:
    name: str
    kind: str
    default: object = None
    has_default: bool = True


_NAME_OK = re.compile(r"^[A-Za-z0-9_.\-/:]+$")


class Function:
    """A graph: inputs (Placeholders), Constants, Nodes (kept in a valid topological
    order) and named outputs."""

    def __init__(self, name: str = "main"):
        self.name = name
        self.placeholders: list[Placeholder] = []
        self.constants: list[Constant] = []
        self.nodes: list[Node] = []
        self.outputs: list[tuple[str, Value]] = []
        self._names: set[str] = set()

    # ------------------------------------------------------------------ naming
    def unique_name(self, base: str) -> str:
        base = base or "v"
        if base not in self._names:
            self._names.add(base)
            return base
        i = 1
        while f"{base}.{i}" in self._names:
            i += 1
        name = f"{base}.{i}"
        self._names.add(name)
        return name

    def take_name(self, value: "Output", name: str) -> None:
        """Give `value`, result 0 of its node, the `name` of a value that is gone (the result
        of a rewritten node keeps the name of the tensor it computes)."""
        self._names.discard(value.name)
        value.name = value.node.name = name
        self._names.add(name)

    def forget_name(self, name: str) -> None:
        """Free `name` for reuse (its value is gone, or is about to be replaced)."""
        self._names.discard(name)

    # ------------------------------------------------------------------ building
    def add_placeholder(self, name: str, type: Type) -> Placeholder:
        p = Placeholder(type, self.unique_name(name))
        self.placeholders.append(p)
        return p

    def add_constant(self, data, name: str = "c") -> Constant:
        c = Constant(data, self.unique_name(name))
        self.constants.append(c)
        return c

    def add_node(self, cls: type[Node], inputs: list, attrs_: dict | None = None, name: str = "",
                 origin: tuple = (), rules: tuple = (), output_names: Iterable[str] = ()) -> Node:
        """Create a node of generated class `cls`: convert and default its attributes,
        infer its result types from the declaration, register it with its operands."""
        inputs = list(inputs)
        declared = cls.INPUTS
        while len(inputs) < len(declared) and declared[len(inputs)].optional:
            inputs.append(None)
        if len(inputs) != len(declared):
            raise ShapeError(f"{cls.OP}: expected {len(declared)} operands "
                             f"({', '.join(o.name for o in declared)}), got {len(inputs)}")
        for i, (info, v) in enumerate(zip(declared, inputs)):
            if info.variadic:
                inputs[i] = tuple(v)
            elif v is None and not info.optional:
                raise ShapeError(f"{cls.OP}: operand {info.name!r} is required")
        try:
            node = cls(inputs=inputs, name=name or cls.OP.lower(), origin=tuple(origin),
                       rules=tuple(rules), **(attrs_ or {}))
        except (TypeError, ValueError) as e:
            raise ShapeError(f"{cls.OP} (node {name!r}): bad attribute: {e}") from None
        node.name = self.unique_name(node.name)
        types = node.infer_type()
        names = list(output_names)
        for i, ty in enumerate(types):
            base = names[i] if i < len(names) and names[i] else (
                node.name if i == 0 else f"{node.name}:{cls.OUTPUTS[min(i, len(cls.OUTPUTS) - 1)].name}")
            node.outputs.append(Output(node, i, ty, base if base == node.name and i == 0
                                       else self.unique_name(base)))
        for idx, v in enumerate(node.flat_inputs()):
            v.users.append((node, idx))
        self.nodes.append(node)
        return node

    def add_output(self, name: str, value: Value) -> None:
        self.outputs.append((name, value))

    # ------------------------------------------------------------------ editing
    def replace_all_uses(self, old: Value, new: Value) -> None:
        """Point every user of `old` (nodes and function outputs) at `new`."""
        if old is new:
            return
        if old.type != new.type:
            raise ShapeError(f"cannot replace %{old.name} ({old.type}) with %{new.name} ({new.type})")
        for node, _ in list(old.users):
            node.inputs = [
                tuple(new if x is old else x for x in v) if isinstance(v, tuple)
                else (new if v is old else v)
                for v in node.inputs
            ]
            new.users.append((node, 0))
        old.users.clear()
        self.outputs = [(n, new if v is old else v) for n, v in self.outputs]
        self._reindex_users(new)

    def _reindex_users(self, value: Value) -> None:
        seen, users = set(), []
        for node, _ in value.users:
            if id(node) in seen:
                continue
            seen.add(id(node))
            for idx, v in enumerate(node.flat_inputs()):
                if v is value:
                    users.append((node, idx))
        value.users = users

    def remove_node(self, node: Node) -> None:
        for v in node.flat_inputs():
            v.users = [(n, i) for n, i in v.users if n is not node]
        self.nodes.remove(node)

    def is_used(self, value: Value) -> bool:
        return bool(value.users) or any(v is value for _, v in self.outputs)

    def dead_code_elimination(self) -> int:
        """Remove nodes none of whose results are used, and unused Constants."""
        removed = 0
        changed = True
        while changed:
            changed = False
            for node in reversed(list(self.nodes)):
                if not any(self.is_used(o) for o in node.outputs):
                    self.remove_node(node)
                    removed += 1
                    changed = True
        self.constants = [c for c in self.constants if self.is_used(c)]
        return removed

    def topological_sort(self) -> None:
        """Restore a valid order after rewrites appended nodes out of order."""
        order, state = [], {}

        def visit(node: Node):
            stack = [(node, iter(node.flat_inputs()))]
            state[id(node)] = 1
            while stack:
                n, it = stack[-1]
                for v in it:
                    p = v.producer
                    if p is not None and id(p) not in state:
                        state[id(p)] = 1
                        stack.append((p, iter(p.flat_inputs())))
                        break
                else:
                    stack.pop()
                    order.append(n)

        for n in self.nodes:
            if id(n) not in state:
                visit(n)
        self.nodes = order

    def verify(self) -> None:
        """Verify every node against its declaration and the graph's structure."""
        known = {id(v) for v in self.placeholders} | {id(c) for c in self.constants}
        for node in self.nodes:
            for v in node.flat_inputs():
                if id(v) not in known:
                    raise GlowgenError(f"graph is malformed: {node.OP} node {node.name!r} uses "
                                       f"%{v.name} before it is defined")
            node.verify()
            known.update(id(o) for o in node.outputs)
        for name, v in self.outputs:
            if id(v) not in known:
                raise GlowgenError(f"graph is malformed: output {name!r} is not defined")

    def clone(self, name: Optional[str] = None) -> "Function":
        """A copy with nodes of its own (constant data shared: it is read-only)."""
        copy = Function(name or self.name)
        values: dict[int, Value] = {}
        for p in self.placeholders:
            values[id(p)] = copy.add_placeholder(p.name, p.type)
        for c in self.constants:
            values[id(c)] = copy.add_constant(c.data, c.name)
        for n in self.nodes:
            new = copy.add_node(type(n), n.map_operands(lambda v: values[id(v)]), n.copy_args(),
                                name=n.name, origin=n.origin, rules=n.rules,
                                output_names=[o.name for o in n.outputs])
            values.update((id(o), c) for o, c in zip(n.outputs, new.outputs))
        for name_, v in self.outputs:
            copy.add_output(name_, values[id(v)])
        return copy

    def values(self):
        yield from self.placeholders
        yield from self.constants
        for n in self.nodes:
            yield from n.outputs
