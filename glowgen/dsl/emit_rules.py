"""Emit `generated/rules.py`: each rule of lowerings.glowdef as a pattern (data the
engine's matcher walks), a compiled guard and a compiled builder."""
from __future__ import annotations

from . import ast as A
from .pyexpr import Scope, py_ident, spec_error, to_py, unparse
from .specs import SpecSet

# Builtins of rule right-hand sides that create nodes through the builder: constants, and
# each_like(u, xs), the matched node u rebuilt on each of the values xs in turn.
BUILDER_BUILTINS = {"scalar", "const", "each_like"}
# Builtins of guards that ask the rewrite context about the graph being rewritten.
CONTEXT_BUILTINS = {"uses": 1}


def _pattern_py(specs: SpecSet, p, binds: dict, node_ops: dict) -> str:
    """The matcher's data for pattern `p`; fills `binds` (name -> kind) and `node_ops` (name
    bound to a node -> the ops it may be)."""
    if isinstance(p, A.PatRest):
        _bind(binds, p.name, p.pos, "rest")
        return f"R({p.name!r})"
    if isinstance(p, A.PatVar):
        if p.name in specs.ops or specs.group_members(p.name):
            raise spec_error(f"{p.name} is an op or a family: write {p.name}(...) to match it", p.pos)
        if p.name != "_":
            binds.setdefault(p.name, "value")
        if p.bind:
            _bind(binds, p.bind, p.pos, "value")
        if p.optional and p.name == "_":
            raise spec_error("write an optional operand as name?, not _?", p.pos)
        return (f"V({p.name!r}{', bind=' + repr(p.bind) if p.bind else ''}"
                f"{', optional=True' if p.optional else ''})")
    group = ()
    if p.op in specs.ops:
        members = (p.op,)
    else:
        group = members = specs.group_members(p.op)
        if not members:
            raise spec_error(f"pattern names {p.op!r}, which is neither an op of ops.glowdef nor "
                             f"a template or group with ops", p.pos)
    has_rest = any(isinstance(a, A.PatRest) for a in p.args)
    for name in members:
        op = specs.ops[name]
        variadic = any(o.variadic for o in op.inputs)
        if has_rest and not (variadic and len(op.inputs) == 1):
            raise spec_error(f"a '*rest' pattern needs an op with one variadic operand; {op.name} "
                             f"is not one", p.pos)
        if not variadic:
            required = sum(1 for o in op.inputs if not o.optional)
            if not required <= len(p.args) <= len(op.inputs):
                raise spec_error(f"pattern {p.op}(...) has {len(p.args)} operands; op {op.name} has "
                                 f"{len(op.inputs)} ({', '.join(o.name for o in op.inputs)})", p.pos)
    if p.bind:
        _bind(binds, p.bind, p.pos, "node")
        node_ops[p.bind] = members
    args = ", ".join(_pattern_py(specs, a, binds, node_ops) for a in p.args)
    return (f"P({p.op!r}, ({args}{',' if len(p.args) == 1 else ''})"
            + (f", bind={p.bind!r}" if p.bind else "") + (f", ops={group!r}" if group else "") + ")")


def _doc(text: str) -> str:
    """A docstring literal for `text` (which may hold quotes)."""
    return '"""' + text + '"""' if '"' not in text and "\\" not in text else repr(text)


def _bind(binds, name, pos, kind):
    if name in binds and kind != "value":
        raise spec_error(f"{name!r} is bound twice in the pattern", pos)
    binds[name] = kind


class _RuleEmitter:
    def __init__(self, specs: SpecSet, rule):
        self.specs, self.rule = specs, rule
        self._guard = False
        self.node_ops: dict = {}        # names bound to matched nodes -> the ops they may be

    def _forwarded(self, e: A.Call, op: A.OpDef) -> list:
        """The (attribute, source node) pairs `...node` arguments of `e` forward to `op`: each
        attribute `op` declares, the node's op declares too, and `e` does not give."""
        given = {k for k, _ in e.kwargs}
        out = []
        for f in (a for a in e.args if isinstance(a, A.Forward)):
            sources = self.node_ops.get(f.name)
            if sources is None:
                raise spec_error(f"...{f.name}: {f.name} is not a node matched by the pattern "
                                 f"(bind one with 'as {f.name}')", f.pos)
            if len(sources) != 1:
                raise spec_error(f"...{f.name}: {f.name} matches several ops; its attributes are "
                                 f"not known (rebuild it with {f.name}(...) instead)", f.pos)
            declared = {a.name for a in self.specs.ops[sources[0]].attrs}
            names = [a.name for a in op.attrs if a.name in declared and a.name not in given]
            if not names:
                raise spec_error(f"...{f.name}: op {sources[0]} has no attribute that {op.name} "
                                 f"takes and the call does not give", f.pos)
            out += [(n, f.name) for n in names if n not in {x for x, _ in out}]
        return out

    def call_hook(self, e: A.Call, scope: Scope):
        if e.func in CONTEXT_BUILTINS:
            if not self._guard:
                raise spec_error(f"{e.func}(...) may only be used in a guard (where ...)", e.pos)
            if len(e.args) != CONTEXT_BUILTINS[e.func] or e.kwargs:
                raise spec_error(f"{e.func} takes {CONTEXT_BUILTINS[e.func]} argument(s)", e.pos)
            return f"_ctx.{e.func}({', '.join(to_py(a, scope) for a in e.args)})"
        if e.func in self.specs.builds:
            if self._guard:
                raise spec_error(f"a guard cannot call build {e.func}", e.pos)
            build = self.specs.builds[e.func]
            if e.kwargs or len(e.args) != len(build.params):
                raise spec_error(f"build {e.func} takes {len(build.params)} arguments "
                                 f"({', '.join(build.params)}), got {len(e.args)}", e.pos)
            return f"build_{e.func}(_b, {', '.join(to_py(a, scope) for a in e.args)})"
        if e.func in BUILDER_BUILTINS:
            args = [to_py(a, scope) for a in e.args] + [f"{k}={to_py(v, scope)}" for k, v in e.kwargs]
            return f"_b.{e.func}({', '.join(args)})"
        if e.func in self.node_ops and not self._guard:
            return self._rebuild(e, scope)
        op = self.specs.ops.get(e.func)
        if op is None:
            if any(isinstance(a, A.Forward) for a in e.args):
                raise spec_error(f"...node forwards attributes to an op built by a rule; "
                                 f"{e.func} is not an op", e.pos)
            return None
        if self._guard:
            raise spec_error(f"a guard cannot build op {e.func}", e.pos)
        attr_names = {a.name for a in op.attrs}
        for k, _ in e.kwargs:
            if k not in attr_names:
                raise spec_error(f"op {op.name} has no attribute {k!r} (attributes: "
                                 f"{', '.join(sorted(attr_names)) or 'none'})", e.pos)
        forwarded = self._forwarded(e, op)
        args = [to_py(a, scope) for a in e.args if not isinstance(a, A.Forward)]
        if any(o.variadic for o in op.inputs):
            if len(op.inputs) != 1:
                raise spec_error(f"building op {op.name} with several operands, one variadic, is "
                                 f"not supported in rules", e.pos)
            operands = f"[({', '.join(args)}{',' if len(args) == 1 else ''})]"
        else:
            required = sum(1 for o in op.inputs if not o.optional)
            if any(isinstance(a, A.Star) for a in e.args) or not required <= len(args) <= len(op.inputs):
                raise spec_error(f"{op.name}(...) takes {len(op.inputs)} operands "
                                 f"({', '.join(o.name for o in op.inputs)}), got {len(args)}", e.pos)
            operands = f"[{', '.join(args)}]"
        given = [(k, to_py(v, scope)) for k, v in e.kwargs]
        given += [(k, f"{py_ident(src)}.{py_ident(k)}") for k, src in forwarded]
        kwargs = "{" + ", ".join(f"{k!r}: {v}" for k, v in given) + "}"
        return f"_b.op({op.name!r}, {operands}, {kwargs})"

    def _rebuild(self, e: A.Call, scope: Scope) -> str:
        """`u(x, ...)` for a node `u` bound by the pattern: an op of u's kind with these
        operands and u's attributes (those given in the call replaced)."""
        members = self.node_ops[e.func]
        if any(isinstance(a, (A.Star, A.Forward)) for a in e.args):
            raise spec_error(f"{e.func}(...) rebuilds the matched node with the operands given; "
                             f"'*' and '...' do not apply", e.pos)
        for name in members:
            op = self.specs.ops[name]
            required = sum(1 for o in op.inputs if not o.optional)
            if any(o.variadic for o in op.inputs) or not required <= len(e.args) <= len(op.inputs):
                raise spec_error(f"{e.func}(...) has {len(e.args)} operands; op {name}, which "
                                 f"{e.func} may be, takes {len(op.inputs)}", e.pos)
            attr_names = {a.name for a in op.attrs}
            for k, _ in e.kwargs:
                if k not in attr_names:
                    raise spec_error(f"{e.func}(...): op {name}, which {e.func} may be, has no "
                                     f"attribute {k!r}", e.pos)
        args = ", ".join(to_py(a, scope) for a in e.args)
        kwargs = "{" + ", ".join(f"{k!r}: {to_py(v, scope)}" for k, v in e.kwargs) + "}"
        return f"_b.like({py_ident(e.func)}, [{args}], {kwargs})"

    def emit(self, index: int) -> tuple[list[str], str]:
        rule, specs = self.rule, self.specs
        binds: dict[str, str] = {}
        pattern = _pattern_py(specs, rule.pattern, binds, self.node_ops)
        names = {n: py_ident(n) for n in binds}
        unpack = [f"    {py_ident(n)} = _m[{n!r}]" for n in binds]
        base = f"_r{index}_{rule.name}"
        lines = ["", ""]
        guard = "None"
        self._guard = True
        if rule.where is not None or rule.when is not None:
            scope = Scope(dict(names), specs.callables, self.call_hook, what=f"guard of rule {rule.name}")
            conds = []
            if rule.when is not None:
                when_scope = Scope(dict(names), specs.callables, self._when_hook,
                                   what=f"when of rule {rule.name}")
                conds.append(to_py(rule.when, when_scope))
            if rule.where is not None:
                conds.append(to_py(rule.where, scope))
            lines += [f"def {base}_guard(_m, _ctx):",
                      f'    {_doc("where " + (unparse(rule.where) if rule.where else ""))}'] + unpack + [
                      f"    return bool({' and '.join('(' + c + ')' for c in conds)})", ""]
            guard = f"{base}_guard"
        self._guard = False
        scope = Scope(dict(names), specs.callables, self.call_hook, what=f"rule {rule.name}")
        body = []
        for name, e in rule.lets:
            body.append(f"    {py_ident(name)} = {to_py(e, scope)}")
            scope = scope.child({name: py_ident(name)})
        if isinstance(rule.result, A.ListLit):
            result = "(" + "".join(to_py(x, scope) + ", " for x in rule.result.items) + ")"
        else:
            result = f"rt.results({to_py(rule.result, scope)})"
        lines += [f"def {base}_build(_b, _m):",
                  f'    {_doc("=> " + unparse(rule.result))}'] + unpack + body + [f"    return {result}", ""]
        from .ast import pattern_size
        info = (f"RuleInfo(name={rule.name!r}, phases={rule.phases!r}, pattern={pattern}, "
                f"size={pattern_size(rule.pattern)}, guard={guard}, build={base}_build, "
                f"location={str(rule.pos)!r})")
        return lines, info

    def emit_build(self) -> list[str]:
        """A builder as a Python function of the rewrite's Builder and its parameters."""
        build = self.rule
        scope = Scope({n: py_ident(n) for n in build.params}, self.specs.callables, self.call_hook,
                      what=f"build {build.name}")
        body = []
        for name, e in build.lets:
            body.append(f"    {py_ident(name)} = {to_py(e, scope)}")
            scope = scope.child({name: py_ident(name)})
        params = "".join(", " + py_ident(n) for n in build.params)
        return ["", "", f"def build_{build.name}(_b{params}):",
                f'    {_doc("= " + unparse(build.result))}'] + body + [
                f"    return {to_py(build.result, scope)}", ""]

    def _when_hook(self, e: A.Call, scope: Scope):
        if e.func == "backend_has":
            names = []
            for a in e.args:
                if not isinstance(a, A.Name) or a.id not in self.specs.ops:
                    raise spec_error("backend_has(...) takes op names", e.pos)
                names.append(a.id)
            return f"_ctx.backend_has({', '.join(repr(n) for n in names)})"
        return None


def emit_rules(specs: SpecSet) -> str:
    lines = [
        "from glowgen.engine import specrt as rt",
        "from glowgen import speclib as sl",
        "from glowgen.engine.patterns import P, R, RuleInfo, V",
        "",
        "from .fns import *  # noqa: F401,F403",
    ]
    for build in specs.builds.values():
        lines += _RuleEmitter(specs, build).emit_build()
    infos = []
    for i, rule in enumerate(specs.rules):
        body, info = _RuleEmitter(specs, rule).emit(i)
        lines += body
        infos.append(info)
    lines += ["", "RULES = (" + "".join(f"\n    {x}," for x in infos) + "\n)", ""]
    return "\n".join(lines)
