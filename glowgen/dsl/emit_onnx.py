"""Emit `generated/onnx_map.py`: the `onnx` clauses of ops.glowdef as import tables.

ONNX names (inputs, attributes) are checked against ONNX's own operator schemas at
generation time, so a typo in a mapping is a spec error, not a silent mismatch.
"""
from __future__ import annotations

import attrs
import onnx
from onnx import defs, helper

from . import ast as A
from .pyexpr import Scope, names_in, spec_error, to_py
from .specs import SpecSet


_KINDS = {"Single": "single", "Optional": "optional", "Variadic": "variadic"}


@attrs.frozen
class _Signature:
    """What a clause may name of an ONNX op: its inputs in order with their kind
    ("single", "optional", "variadic") and its attributes with their defaults."""
    inputs: tuple
    attributes: dict


def _signature(clause: A.OnnxClause) -> _Signature:
    domain, _, name = clause.onnx_op.rpartition(".")
    if domain:
        return _contrib_signature(clause, domain, name)
    version = clause.until if clause.until is not None else (defs.onnx_opset_version())
    try:
        schema = defs.get_schema(clause.onnx_op, version, "")
    except Exception:
        raise spec_error(f"onnx {clause.onnx_op}: ONNX has no operator of that name at opset "
                         f"{version}", clause.pos) from None
    return _Signature(tuple((i.name, _KINDS[i.option.name]) for i in schema.inputs),
                      {n: _attr_default(a.default_value) for n, a in schema.attributes.items()})


def _contrib_signature(clause: A.OnnxClause, domain: str, name: str) -> _Signature:
    """The schema of an op of another domain (onnxruntime's com.microsoft contrib ops): ONNX
    does not know them, onnxruntime registers them (needed to regenerate, not to run)."""
    if clause.since is not None or clause.until is not None:
        raise spec_error(f"onnx {clause.onnx_op}: since/until count opsets of the default "
                         f"domain; a clause of domain {domain} takes neither", clause.pos)
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as ort_state
    except ImportError:
        raise spec_error(f"onnx {clause.onnx_op}: the schemas of domain {domain} come from "
                         f"onnxruntime; install it (pip install -e '.[test]') to regenerate",
                         clause.pos) from None
    found = [s for s in ort_state.get_all_operator_schema() if s.domain == domain and s.name == name]
    if not found:
        raise spec_error(f"onnx {clause.onnx_op}: onnxruntime has no operator {name} in domain "
                         f"{domain}", clause.pos)
    schema = max(found, key=lambda s: s.since_version)
    defaults = {}
    for attr_name, a in schema.attributes.items():
        proto = onnx.AttributeProto()
        proto.ParseFromString(a._default_value)
        defaults[attr_name] = _attr_default(proto)
    return _Signature(tuple((i.name, _KINDS[i.option.name]) for i in schema.inputs), defaults)


def _attr_default(v):
    if v is None or v.type == 0:
        return None
    value = helper.get_attribute_value(v)
    if isinstance(value, bytes):
        value = value.decode()
    if isinstance(value, list):
        value = tuple(v.decode() if isinstance(v, bytes) else v for v in value)
    if isinstance(value, onnx.TensorProto):
        return None
    return value


def emit_onnx(specs: SpecSet) -> str:
    lines = [
        "from glowgen.engine import specrt as rt",
        "from glowgen import speclib as sl",
        "from glowgen.engine.onnxmap import OnnxClause",
        "",
        "from .fns import *  # noqa: F401,F403",
        "",
    ]
    tables = []
    for op in specs.ops.values():
        for n, clause in enumerate(op.onnx):
            fn_name = f"_{op.name}_{n}"
            lines += _emit_clause(specs, op, clause, fn_name)
            tables.append(fn_name)
    lines += ["", "CLAUSES = (" + "".join(f"\n    {t}_clause," for t in tables) + "\n)", ""]
    return "\n".join(lines)


def _emit_clause(specs: SpecSet, op: A.OpDef, clause: A.OnnxClause, fn_name: str) -> list[str]:
    signature = _signature(clause)
    onnx_inputs = signature.inputs
    onnx_input_names = [n for n, _ in onnx_inputs]
    onnx_attrs = signature.attributes
    operand_names = [o.name for o in op.inputs]
    attr_names = {a.name: a for a in op.attrs}

    # ---- inputs: explicit maps, else positional
    operand_map: dict[str, int] = {}        # onnx input -> our operand index
    strided: list = []                       # (onnx input, our operand index, start, step)
    attr_inputs: dict[str, str] = {}         # onnx input -> our attribute (must be constant)
    kinds = dict(onnx_inputs)
    for onnx_name, target, pos, every in clause.maps:
        if onnx_name not in onnx_input_names:
            raise spec_error(f"onnx {clause.onnx_op}: ONNX input {onnx_name!r} does not exist "
                             f"(inputs: {', '.join(onnx_input_names) or 'none'})", pos)
        if every is not None:
            index = operand_names.index(target) if target in operand_names else None
            if kinds[onnx_name] != "variadic" or index is None or not op.inputs[index].variadic or every[1] < 1:
                raise spec_error(f"onnx {clause.onnx_op}: a strided map ({onnx_name}[{every[0]}::{every[1]}]) "
                                 f"picks values of a variadic ONNX input onto a variadic operand, with a "
                                 f"step of at least 1", pos)
            strided.append((onnx_name, index) + every)
        elif target in operand_names:
            operand_map[onnx_name] = operand_names.index(target)
        elif target in attr_names:
            attr_inputs[onnx_name] = target
        else:
            raise spec_error(f"onnx {clause.onnx_op}: {target!r} is neither an operand nor an "
                             f"attribute of op {op.name}", pos)
    referenced = set()
    for _, e, _ in clause.sets:
        referenced |= names_in(e)
    for _, e, _ in clause.lets:
        referenced |= names_in(e)
    for c in clause.checks:
        referenced |= names_in(c.expr)
    if clause.guard is not None:
        referenced |= names_in(clause.guard)
    if not clause.maps:
        # Positional: ONNX inputs in order onto our operands in order.
        free = [n for n in onnx_input_names if n not in clause.ignore]
        for i, n in enumerate(free):
            if i < len(operand_names):
                operand_map[n] = i
    strided_names = {n for n, *_ in strided}
    for n in onnx_input_names:
        if (n not in operand_map and n not in strided_names and n not in attr_inputs and n not in referenced
                and n not in clause.ignore):
            raise spec_error(f"onnx {clause.onnx_op}: ONNX input {n!r} is not mapped to an operand "
                             f"or attribute of op {op.name} (map it with '{n} -> name', use it in "
                             f"an expression, or 'ignore {n}')", clause.pos)
    for idx, o in enumerate(op.inputs):
        if idx not in operand_map.values() and idx not in {i for _, i, *_ in strided} and not o.optional:
            raise spec_error(f"onnx {clause.onnx_op}: operand {o.name!r} of op {op.name} gets no "
                             f"ONNX input", clause.pos)

    # ---- attributes
    set_names = {name for name, _, _ in clause.sets}
    for name, _, pos in clause.sets:
        if name not in attr_names:
            raise spec_error(f"onnx {clause.onnx_op}: {name!r} is not an attribute of op {op.name}", pos)
    passthrough = tuple(a for a in onnx_attrs if a in attr_names and a not in set_names
                        and a not in attr_inputs.values())
    for name in clause.ignore:
        if name not in onnx_attrs and name not in onnx_input_names:
            raise spec_error(f"onnx {clause.onnx_op}: cannot ignore {name!r}: ONNX has no input or "
                             f"attribute of that name", clause.pos)
    consumed = set(passthrough) | (referenced & set(onnx_attrs)) | set(clause.ignore)

    names = {}
    for n in onnx_input_names:
        names[n] = f"o.input({n!r})"
    for n, default in onnx_attrs.items():
        names[n] = f"o.attr({n!r}, {default!r})"
    # `opset` is the model's opset, unless the ONNX op has an attribute of that name: then
    # the attribute (onnxruntime's QLinearSoftmax says which Softmax it follows by one).
    names.setdefault("opset", "o.opset")
    names["outputs"] = "o.outputs"
    scope = Scope(names, specs.callables, what=f"onnx clause {clause.onnx_op} of op {op.name}")
    # `let`s are computed once, when a setting first needs them, so that an error in one is
    # reported for that setting, as if the expression were written there.
    let_lines = []
    set_scope = scope
    for name, e, pos in clause.lets:
        if name in names or name in set_scope.names:
            raise spec_error(f"onnx {clause.onnx_op}: let {name}: the name is taken (an ONNX input, "
                             f"attribute or an earlier let); choose another", pos)
        let_lines.append(f"    _let_{name} = rt.once(lambda: {to_py(e, set_scope)})")
        set_scope = set_scope.child({name: f"_let_{name}()"})

    lines = ["", "", f"def {fn_name}(o):",
             f'    """ONNX {clause.onnx_op} -> {op.name} ({clause.pos})."""',
             "    attrs = {}"]
    for name in passthrough:
        default = onnx_attrs[name]
        lines.append(f"    if o.has_attr({name!r}):")
        lines.append(f"        attrs[{name!r}] = o.attr({name!r})")
        if default is not None:
            lines.append("    else:")
            lines.append(f"        attrs[{name!r}] = {default!r}")
    for onnx_name, attr in attr_inputs.items():
        lines.append(f"    if o.input({onnx_name!r}).present:")
        lines.append(f"        attrs[{attr!r}] = o.input({onnx_name!r}).value")
    for c in clause.checks:
        lines.append(f"    o.check({to_py(c.expr, scope)}, {c.message!r}, {str(c.pos)!r})")
    lines += let_lines
    for name, e, pos in clause.sets:
        lines.append(f"    attrs[{name!r}] = o.evaluating({name!r}, {str(pos)!r}, lambda: {to_py(e, set_scope)})")
    lines.append("    return attrs")
    lines.append("")
    guard = "None"
    if clause.guard is not None:
        lines += [f"def {fn_name}_guard(o):", f"    return bool({to_py(clause.guard, scope)})", ""]
        guard = f"{fn_name}_guard"
    lines.append(
        f"{fn_name}_clause = OnnxClause(onnx_op={clause.onnx_op!r}, op={op.name!r}, "
        f"since={clause.since!r}, until={clause.until!r}, "
        f"inputs={tuple(onnx_inputs)!r}, "
        f"operands={tuple(sorted(operand_map.items(), key=lambda kv: onnx_input_names.index(kv[0])))!r}, "
        + (f"strided={tuple(strided)!r}, " if strided else "") +
        f"attributes={fn_name}, consumed={tuple(sorted(consumed))!r}, "
        f"location={str(clause.pos)!r}, guard={guard})")
    return lines

