"""ONNX import, generic over the `onnx` clauses of specs/ops.glowdef.

Initializers and Constant nodes become Constants, graph inputs become Placeholders (every
dynamic dimension bound by the user), and every other node is built from the clause that
maps its op at the model's opset.  Inputs that a clause needs as compile-time values
(Reshape's shape, Slice's starts...) are folded on demand, so shape-computing subgraphs
(Shape -> Gather -> Concat ...) disappear at import.
"""
from __future__ import annotations

from collections import ChainMap
from typing import Callable, Optional

import numpy as np
import onnx
from onnx import defs, helper, numpy_helper

from ..engine.graph import Constant, Function, Placeholder, Value
from ..engine.registry import Registry
from ..engine.types import ONNX_CODES, Type, dtype_from_onnx
from .onnx_control import CONTROL_FLOW
from . import onnx_data_dependent
from ..errors import (CompileTimeInputError, GlowgenError, InputError, MemoryLimitError,
                      ModelError, ShapeError, UnsupportedError)
from ..memory_limit import check_limit, format_bytes
# Loading lives in onnx_load; its names are re-exported here, where callers have always found them.
from .onnx_load import (NEWEST_OPSET, CheckedModel, ModelLike, check_opset,  # noqa: F401
                        declared_dims, declared_inputs, default_opset, load_model,
                        without_large_initializers)

# ----------------------------------------------------------------------------- node views
def _attribute_value(attr: onnx.AttributeProto):
    if attr.type == onnx.AttributeProto.TENSOR:
        return numpy_helper.to_array(attr.t)
    if attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
        raise UnsupportedError(f"attribute {attr.name!r} holds a subgraph; control flow is not supported")
    if attr.type == onnx.AttributeProto.SPARSE_TENSOR:
        raise UnsupportedError(f"attribute {attr.name!r} holds a sparse tensor, which is not supported")
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list):
        return tuple(v.decode() if isinstance(v, bytes) else v for v in value)
    return value


class OnnxInput:
    """One formal input of an ONNX node as clause expressions see it."""

    def __init__(self, importer: "_Importer", node_desc: str, formal: str, values: list,
                 names: tuple = ()):
        self._importer, self._desc, self._formal, self._values = importer, node_desc, formal, values
        self._names = names       # the ONNX names of `values`

    @property
    def present(self) -> bool:
        return bool(self._values)

    def _first(self) -> Value:
        if not self._values:
            raise UnsupportedError(f"{self._desc}: input {self._formal!r} is required here")
        return self._values[0]

    @property
    def shape(self):
        return self._first().type.shape

    @property
    def dtype(self):
        return self._first().type.dtype

    @property
    def known(self) -> Optional[np.ndarray]:
        """The input's compile-time value, or None when it is computed at run time (or absent):
        for checks that apply only to constants (an index out of range)."""
        if not self._values:
            return None
        try:
            return self._importer.constant(self._values[0])
        except MemoryLimitError:
            raise
        except GlowgenError:
            return None         # not computable here; the value is a run-time one

    @property
    def value(self) -> np.ndarray:
        v = self._first()
        data = self._importer.constant(v)
        if data is None:
            needed = self._importer.placeholders_behind(v)
            raise CompileTimeInputError(
                f"{self._desc}: input {self._formal!r} must be computable at compile time (a "
                f"constant or a shape computation), but it depends on model input"
                f"{'s' if len(needed) > 1 else ''} {', '.join(map(repr, needed))}; bind "
                f"{'them' if len(needed) > 1 else 'it'} as constant{'s' if len(needed) > 1 else ''} "
                f"to specialize the model (Python: constant_inputs=...)", needed,
                self._names[0] if self._names else None)
        return data

    def every(self, start: int, step: int) -> "OnnxInput":
        """Every step-th value of a variadic input from `start`, as an input of its own."""
        return OnnxInput(self._importer, self._desc, f"{self._formal}[{start}::{step}]",
                         self._values[start::step], self._names[start::step])

    @property
    def values(self) -> list:
        """The compile-time value of each value of a variadic input."""
        return [OnnxInput(self._importer, self._desc, f"{self._formal}[{i}]", [v], self._names[i:i + 1]).value
                for i, v in enumerate(self._values)]


class OnnxNodeView:
    """What generated clause functions read: attributes (with ONNX defaults), inputs, opset."""

    def __init__(self, importer, node: onnx.NodeProto, desc: str, inputs: dict, opset: int):
        self._attrs = {a.name: a for a in node.attribute}
        self._desc = desc
        self._inputs = inputs
        self.opset = opset
        self.outputs = tuple(o for o in node.output if o)

    def has_attr(self, name: str) -> bool:
        return name in self._attrs

    def attr(self, name: str, default=None):
        if name in self._attrs:
            return _attribute_value(self._attrs[name])
        return default

    def input(self, formal: str) -> OnnxInput:
        return self._inputs[formal]

    def check(self, ok, message: str, location: str):
        if isinstance(ok, tuple):
            ok = all(ok)
        if not ok:
            raise UnsupportedError(f"{self._desc}: {message}")

    def evaluating(self, attr: str, location: str, thunk: Callable):
        try:
            return thunk()
        except CompileTimeInputError as e:
            raise CompileTimeInputError(f"attribute {attr}: {e}", e.inputs, e.value) from None
        except GlowgenError as e:
            raise type(e)(f"{self._desc}: attribute {attr}: {e}") from None
        except (TypeError, ValueError, IndexError, KeyError) as e:
            raise UnsupportedError(f"{self._desc}: cannot compute attribute {attr} "
                                   f"(mapping at {location}): {e}") from None


# ----------------------------------------------------------------------------- import
def parse_dims(text: str) -> tuple[int, ...]:
    """'1x3x224x224' (or '1,3,224,224') -> (1, 3, 224, 224)."""
    parts = text.replace(",", "x").split("x")
    try:
        dims = tuple(int(p) for p in parts if p.strip() != "")
    except ValueError:
        raise InputError(f"bad shape {text!r}: write dimensions as 1x3x224x224") from None
    if not dims and text.strip() not in ("", "scalar"):
        raise InputError(f"bad shape {text!r}: write dimensions as 1x3x224x224")
    if any(d < 0 for d in dims):
        raise InputError(f"bad shape {text!r}: dimensions must be non-negative")
    return dims


class _Importer:
    def __init__(self, proto: onnx.ModelProto, registry: Registry, input_shapes: dict,
                 constant_fn: Callable, constant_inputs: Optional[dict] = None, max_memory=None):
        self.proto, self.registry = proto, registry
        self.max_memory = max_memory             # a memory_limit.MemoryLimit, or None
        self.constant_bytes = 0                  # the model's own constants read so far
        self.input_shapes = dict(input_shapes or {})
        self.constant_inputs = dict(constant_inputs or {})
        self.constant_fn = constant_fn
        self.function = Function(proto.graph.name or "main")
        # Names in scope: a subgraph being inlined (a branch, a loop body) is a child scope.
        self.values: ChainMap = ChainMap()
        self.opset = default_opset(proto)
        self.cache: dict[int, Optional[np.ndarray]] = {}
        self._expansions = 0
        self._emitted = 0
        self.subgraph_depth = 0                  # inside Loop / If / Scan bodies being inlined

    def constant(self, value: Value) -> Optional[np.ndarray]:
        if isinstance(value, Constant):
            return value.data
        if id(value) not in self.cache:
            self.cache[id(value)] = self.constant_fn(self.function, value, self.registry)
        return self.cache[id(value)]

    def placeholders_behind(self, value: Value) -> list[str]:
        """Names of the model inputs `value` is computed from."""
        seen, stack, names = set(), [value], []
        while stack:
            v = stack.pop()
            if id(v) in seen:
                continue
            seen.add(id(v))
            if isinstance(v, Placeholder):
                names.append(v.name)
            elif v.producer is not None:
                stack.extend(v.producer.flat_inputs())
        return sorted(names)

    def run(self) -> Function:
        g = self.proto.graph
        fn = self.function
        for init in g.initializer:
            self.values[init.name] = fn.add_constant(self._tensor(init), init.name)
        real_inputs = [i for i in g.input if i.name not in self.values]
        names = [i.name for i in real_inputs]
        for name in self.input_shapes:
            if name not in names:
                raise InputError(f"--input-shape names {name!r}, which is not an input of the model; "
                                 f"inputs: {', '.join(names) or 'none'}")
        for name in self.constant_inputs:
            if name not in names:
                raise InputError(f"constant input {name!r} is not an input of the model; "
                                 f"inputs: {', '.join(names) or 'none'}")
        for vi in real_inputs:
            if vi.name in self.constant_inputs:
                data = np.asarray(self.constant_inputs[vi.name])
                declared = self._input_type(vi, data.shape)
                if Type.of(data) != declared:
                    raise InputError(f"constant input {vi.name!r} is {Type.of(data)}, but the "
                                     f"model declares {declared}")
                self.values[vi.name] = fn.add_constant(data, vi.name)
                continue
            self.values[vi.name] = fn.add_placeholder(vi.name, self._input_type(vi))
        for node in g.node:
            self._node(node)
        self._cross_check_with_onnx_inference()
        for out in g.output:
            if out.name not in self.values:
                raise ModelError(f"graph output {out.name!r} is not produced by any node")
            fn.add_output(out.name, self.values[out.name])
        return fn

    def _cross_check_with_onnx_inference(self) -> None:
        """Compare every type we inferred with ONNX's own shape inference (on the model with
        the user's input shapes bound): a disagreement is a bug in a spec, caught here
        instead of as wrong numbers later."""
        proto = without_large_initializers(self.proto)
        inits = {i.name for i in proto.graph.initializer}
        for vi in proto.graph.input:
            p = self.values.get(vi.name)
            if p is not None and vi.name not in inits and vi.type.HasField("tensor_type"):
                shape = vi.type.tensor_type.shape
                shape.ClearField("dim")
                for d in p.type.shape:
                    shape.dim.add().dim_value = d
        # A negative dim_value elsewhere (exporters write -1 for a dynamic one) means unknown.
        for vi in list(proto.graph.output) + list(proto.graph.value_info):
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
                for d in vi.type.tensor_type.shape.dim:
                    if d.HasField("dim_value") and d.dim_value < 0:
                        d.ClearField("dim_value")
        try:
            inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=True)
        except Exception as e:   # noqa: BLE001 - ONNX raises several kinds
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ModelError(f"ONNX shape inference rejects the model: {first}") from None
        for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
            ours = self.values.get(vi.name)
            tt = vi.type.tensor_type
            if ours is None or not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
                continue
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            if any(d is None for d in dims) or tt.elem_type == 0:
                continue
            theirs = Type(dtype_from_onnx(tt.elem_type), dims)
            if theirs != ours.type:
                raise GlowgenError(
                    f"internal error: for value {vi.name!r} ONNX infers {theirs} but glowgen "
                    f"infers {ours.type}; the op's declaration in specs/ops.glowdef is wrong")

    def _tensor(self, t: onnx.TensorProto) -> np.ndarray:
        dtype = dtype_from_onnx(t.data_type)       # rejects unsupported element types by name
        ty = Type(dtype, tuple(t.dims))
        check_limit(self.max_memory, f"constant {t.name!r} ({ty})", ty.nbytes)
        self.constant_bytes += ty.nbytes
        check_limit(self.max_memory, f"the model's constants (up to {t.name!r}, {ty}, "
                    f"{format_bytes(ty.nbytes)})", self.constant_bytes)
        try:
            return numpy_helper.to_array(t)
        except Exception as e:
            raise ModelError(f"tensor {t.name!r} cannot be read: {e}") from None

    def _input_type(self, vi: onnx.ValueInfoProto, given=None) -> Type:
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            raise UnsupportedError(f"input {vi.name!r} is not a tensor (sequences, maps and "
                                   f"optionals are not supported)")
        dtype = dtype_from_onnx(tt.elem_type)
        declared = declared_dims(vi)
        given = self.input_shapes.get(vi.name) if given is None else given
        if given is not None:
            given = tuple(given)
            if declared is not None:
                if len(given) != len(declared):
                    raise InputError(f"input {vi.name!r} has rank {len(declared)} "
                                     f"({_fmt_dims(declared)}), but --input-shape gives "
                                     f"{'x'.join(map(str, given))}")
                for i, (d, g) in enumerate(zip(declared, given)):
                    if isinstance(d, int) and d != g:
                        raise InputError(f"input {vi.name!r}: dimension {i} is {d} in the model, "
                                         f"but --input-shape gives {g}")
            return Type(dtype, given)
        if declared is None:
            raise InputError(f"input {vi.name!r} has no declared shape; bind it with "
                             f"--input-shape {vi.name}=DIMS (Python: input_shapes={{{vi.name!r}: (...)}})")
        for i, d in enumerate(declared):
            if not isinstance(d, int):
                what = f"dimension {i} ({d!r})" if d else f"dimension {i}"
                raise InputError(
                    f"input {vi.name!r} has a dynamic {what} in its shape {_fmt_dims(declared)}; "
                    f"bind it with --input-shape {vi.name}=" + "x".join(
                        str(x) if isinstance(x, int) else "N" for x in declared)
                    + f" (Python: input_shapes={{{vi.name!r}: (...)}})")
        return Type(dtype, declared)

    def _node(self, node: onnx.NodeProto, opset: Optional[int] = None) -> None:
        opset = self.opset if opset is None else opset
        desc = f"{node.op_type} node {node.name or (node.output[0] if node.output else '?')!r}"
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            self.values[node.output[0]] = self.function.add_constant(
                self._constant_node(node, desc), node.output[0])
            return
        if node.op_type in CONTROL_FLOW and node.domain in ("", "ai.onnx"):
            CONTROL_FLOW[node.op_type](self, node, desc, opset)
            return
        if onnx_data_dependent.is_data_dependent(node) and \
                onnx_data_dependent.import_node(self, node, desc):
            return
        clauses = self.registry.onnx.get(onnx_op_name(node))
        if not clauses and node.domain not in ("", "ai.onnx"):
            raise UnsupportedError(f"{desc} is in domain {node.domain!r}, which glowgen does not "
                                   f"know {node.op_type} of. Run `glowgen ops --onnx` to list "
                                   f"supported ops (other domains' ops are named with their domain).")
        if not clauses:
            if self._expand_function(node, desc, opset):
                return
            raise UnsupportedError(f"ONNX op {node.op_type} ({desc}) is not supported. "
                                   f"Run `glowgen ops` to list the supported ops.")
        clause = next((c for c in clauses if c.applies(opset) and self._guard_holds(c, node, desc, opset)), None)
        if clause is None:
            if self._expand_function(node, desc, opset):
                return
            ranges = ", ".join(f"{c.since or 1}..{c.until or ''}" for c in clauses)
            raise UnsupportedError(f"{desc}: ONNX {node.op_type} is supported at opsets {ranges}, "
                                   f"but the model uses opset {opset}")
        try:
            self._node_with_clause(node, desc, clause, opset)
        except CompileTimeInputError:
            raise
        except UnsupportedError:
            # What the clause does not cover (an extra output, say) the ONNX function body
            # of the op may still express.
            if not self._expand_function(node, desc, opset):
                raise

    # ------------------------------------------------------------------ subgraphs
    def inline_graph(self, graph: onnx.GraphProto, bindings: dict, desc: str, opset: int) -> list:
        """Import the nodes of `graph` (a branch or loop body) into the function being built,
        with its inputs bound to the values of `bindings`; returns the values of its outputs.
        The subgraph gets its own name scope: names it does not define resolve to the
        enclosing graphs, and its own names are gone after it."""
        for out in graph.output:
            kind = out.type.WhichOneof("value")
            if kind not in (None, "tensor_type"):
                raise UnsupportedError(
                    f"{desc}: subgraph output {out.name!r} is not a tensor but "
                    f"{_with_article(kind.replace('_type', ''))}; sequences, maps and optionals are not supported")
        self.values = self.values.new_child()
        self.subgraph_depth += 1
        try:
            for init in graph.initializer:
                self.values[init.name] = self.function.add_constant(self._tensor(init), init.name)
            for vi in graph.input:
                if vi.name not in bindings:
                    raise ModelError(f"{desc}: subgraph input {vi.name!r} is not bound")
            self.values.update(bindings)
            for inner in graph.node:
                self._node(inner, opset)
            outputs = []
            for out in graph.output:
                if out.name not in self.values:
                    raise ModelError(f"{desc}: subgraph output {out.name!r} is not produced by any node")
                outputs.append(self.values[out.name])
            return outputs
        finally:
            self.values = self.values.parents
            self.subgraph_depth -= 1

    def emit_onnx(self, op_type: str, inputs: list, **attributes) -> list:
        """Import one ONNX node (at opset 13) over existing values: control flow slices and
        stacks tensors with ONNX's own ops.  Integer-list attributes that opset 13 takes as
        inputs (Slice's starts, Squeeze's axes...) are passed as constants."""
        self._emitted += 1
        prefix = f"_control{self._emitted}."
        names = []
        for i, v in enumerate(inputs):
            names.append(f"{prefix}in{i}")
            self.values[names[-1]] = v
        node_attrs = {}
        for key, val in attributes.items():
            if isinstance(val, list):
                names.append(f"{prefix}{key}")
                self.values[names[-1]] = self.function.add_constant(np.array(val, np.int64), names[-1])
            else:
                node_attrs[key] = val
        node = helper.make_node(op_type, names, [f"{prefix}out"], name=f"{prefix}{op_type}", **node_attrs)
        self._node(node, 13)
        return [self.values[f"{prefix}out"]]

    # ------------------------------------------------------------------ ONNX functions
    def _expand_function(self, node: onnx.NodeProto, desc: str, opset: int) -> bool:
        """Import `node` as the body of its ONNX function, when ONNX defines it as one.

        The op knowledge stays in ONNX's schema; glowgen only inlines it (as onnxruntime
        does) and imports the body's nodes with their own clauses."""
        try:
            schema = defs.get_schema(node.op_type, opset, node.domain or "")
        except Exception:   # noqa: BLE001 - no schema at that opset
            return False
        body = None
        if schema.has_function and schema.function_opset_versions:
            usable = [v for v in schema.function_opset_versions if v <= opset]
            if usable:
                body = onnx.FunctionProto.FromString(
                    schema.get_function_with_opset_version(max(usable)))
        if body is None and schema.has_context_dependent_function:
            usable = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
            types = []
            for name in node.input:
                v = self.values.get(name) if name else None
                if v is None:
                    types.append(onnx.TypeProto())
                else:
                    types.append(helper.make_tensor_type_proto(ONNX_CODES[v.type.dtype], list(v.type.shape)))
            full = onnx.NodeProto()
            full.CopyFrom(node)
            self._add_default_attributes(full, schema)
            try:
                data = schema.get_context_dependent_function_with_opset_version(
                    max(usable) if usable else opset, full.SerializeToString(),
                    [t.SerializeToString() for t in types])
            except Exception:   # noqa: BLE001 - ONNX cannot build the body for these types
                return False
            body = onnx.FunctionProto.FromString(data) if data else None
        if body is None or not body.node:
            return False
        full = onnx.NodeProto()
        full.CopyFrom(node)
        self._add_default_attributes(full, schema)
        body_opset = next((o.version for o in body.opset_import if o.domain in ("", "ai.onnx")), opset)
        self._expansions += 1
        prefix = f"{node.name or node.output[0]}/{node.op_type}#{self._expansions}/"
        # The body runs in its own name scope (as a subgraph does), so its names neither
        # clash with the model's nor need renaming, and subgraphs inside it (an If's
        # branches) see them.  A formal input the node leaves out reads as absent.
        bindings, absent = {}, set()
        for i, formal in enumerate(body.input):
            actual = node.input[i] if i < len(node.input) else ""
            if not actual:
                absent.add(formal)
            elif actual not in self.values:
                raise ModelError(f"{desc}: input {actual!r} is not defined before it is used")
            else:
                bindings[formal] = self.values[actual]
        attrs_ = {a.name: a for a in full.attribute}
        self.values = self.values.new_child(bindings)
        try:
            for inner in body.node:
                self._node(_instantiate(inner, absent, attrs_, prefix), body_opset)
            results = [self.values.get(formal) for formal in body.output]
        finally:
            self.values = self.values.parents
        for name, value in zip(node.output, results):
            if name:
                if value is None:
                    raise ModelError(f"{desc}: the function body of {node.op_type} does not "
                                     f"compute output {name!r}")
                self.values[name] = value
        return True

    @staticmethod
    def _add_default_attributes(node: onnx.NodeProto, schema) -> None:
        present = {a.name for a in node.attribute}
        for name, a in schema.attributes.items():
            if name not in present and a.default_value is not None and a.default_value.type != 0:
                node.attribute.append(a.default_value)

    def _guard_holds(self, clause, node, desc, opset) -> bool:
        if clause.guard is None:
            return True
        view = OnnxNodeView(self, node, desc, self._formal_inputs(node, clause, desc), opset)
        return clause.guard(view)

    def _node_with_clause(self, node: onnx.NodeProto, desc: str, clause, opset: int) -> None:
        inputs = self._formal_inputs(node, clause, desc)
        view = OnnxNodeView(self, node, desc, inputs, opset)
        cls = self.registry.op(clause.op)
        try:
            attrs_ = clause.attributes(view)
            operands = [None] * len(cls.INPUTS)
            picks = [(formal, index, 0, 1) for formal, index in clause.operands] + list(clause.strided)
            for formal, index, start, step in picks:
                vals = inputs[formal]._values[start::step]
                if cls.INPUTS[index].variadic:
                    operands[index] = tuple(vals)
                elif vals:
                    operands[index] = vals[0]
            result = self.function.add_node(cls, operands, attrs_, name=node.name or node.output[0],
                                            origin=(node.name or node.output[0],),
                                            output_names=[o for o in node.output])
        except ShapeError as e:
            # (an attribute's error names the node already: OnnxNodeView.evaluating)
            raise ShapeError(str(e) if str(e).startswith(desc) else f"{desc}: {e}") from None
        outs = list(node.output)
        if len(outs) > len(result.outputs):
            extra = [o for o in outs[len(result.outputs):] if o]
            if extra:
                raise UnsupportedError(f"{desc}: outputs {', '.join(map(repr, extra))} are not "
                                       f"supported ({clause.op} has {len(result.outputs)} result(s))")
        for name, value in zip(outs, result.outputs):
            if name:
                self.values[name] = value

    def _formal_inputs(self, node, clause, desc) -> dict[str, OnnxInput]:
        actual = list(node.input)
        out: dict[str, OnnxInput] = {}
        for i, (formal, option) in enumerate(clause.inputs):
            if option == "variadic":
                names = actual[i:]
            else:
                names = actual[i:i + 1]
            values = []
            for n in names:
                if not n:
                    continue
                if n not in self.values:
                    raise ModelError(f"{desc}: input {n!r} is not defined before it is used")
                values.append(self.values[n])
            if option == "single" and not values:
                raise ModelError(f"{desc}: required input {formal!r} is missing")
            out[formal] = OnnxInput(self, desc, formal, values, tuple(n for n in names if n))
        return out

    def _constant_node(self, node, desc) -> np.ndarray:
        for a in node.attribute:
            if a.name == "value":
                return self._tensor(a.t)
            if a.name == "value_float":
                return np.array(a.f, np.float32)
            if a.name == "value_floats":
                return np.array(list(a.floats), np.float32)
            if a.name == "value_int":
                return np.array(a.i, np.int64)
            if a.name == "value_ints":
                return np.array(list(a.ints), np.int64)
            raise UnsupportedError(f"{desc}: Constant with attribute {a.name!r} is not supported")
        raise ModelError(f"{desc}: Constant node has no value")


def _instantiate(inner: onnx.NodeProto, absent: set, attrs_: dict, prefix: str) -> onnx.NodeProto:
    """A node of a function body with absent formal inputs blanked and attribute references
    resolved; its name gets `prefix`, so it traces back to the node the body expands."""
    out = onnx.NodeProto()
    out.CopyFrom(inner)
    out.ClearField("input")
    out.ClearField("attribute")
    out.input.extend("" if n in absent else n for n in inner.input)
    out.name = prefix + (inner.name or (inner.output[0] if inner.output else inner.op_type))
    for a in inner.attribute:
        if a.ref_attr_name:
            if a.ref_attr_name in attrs_:
                b = onnx.AttributeProto()
                b.CopyFrom(attrs_[a.ref_attr_name])
                b.name = a.name
                out.attribute.append(b)
        else:
            out.attribute.append(a)
    return out


def onnx_op_name(node: onnx.NodeProto) -> str:
    """The name the specs' `onnx` clauses give the op of `node`: its op type, qualified with
    its domain outside the default one (com.microsoft.QLinearAdd)."""
    if node.domain in ("", "ai.onnx"):
        return node.op_type
    return f"{node.domain}.{node.op_type}"


def _with_article(noun: str) -> str:
    return ("an " if noun[:1] in "aeiou" else "a ") + noun


def _fmt_dims(dims) -> str:
    return "[" + ", ".join(str(d) if d is not None else "?" for d in dims) + "]"


def import_model(model: ModelLike, registry: Registry, constant_fn: Callable,
                 input_shapes: Optional[dict] = None,
                 constant_inputs: Optional[dict] = None, max_memory=None) -> Function:
    """Build a typed graph from an ONNX model.  `constant_fn(function, value, registry)` returns
    a value's compile-time data or None (the pipeline passes its constant evaluator).
    `constant_inputs` binds model inputs to fixed arrays: the model is specialized to them.
    `max_memory` (a memory_limit.MemoryLimit) bounds each constant and all of them together."""
    proto = load_model(model, max_memory)
    function = _Importer(proto, registry, input_shapes or {}, constant_fn, constant_inputs,
                         max_memory).run()
    function.verify()
    return function
