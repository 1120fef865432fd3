"""The runtime of the spec expression language.

Generated code (`glowgen/generated/`) calls into this module: arithmetic that works
elementwise over shape tuples, shape unification for operand declarations, and the
builtin functions that shape formulas, checks and rule guards may use.  Nothing here
knows about a particular op; everything is plain shape and list arithmetic.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from ..errors import ShapeError
from .types import DTYPES, Type


# ----------------------------------------------------------------------------- arithmetic
def _is_seq(x) -> bool:
    return isinstance(x, (tuple, list))


def _elementwise(fn, a, b):
    if _is_seq(a) and _is_seq(b):
        if len(a) != len(b):
            raise ShapeError(f"cannot combine sequences of lengths {len(a)} and {len(b)}")
        return tuple(fn(x, y) for x, y in zip(a, b))
    if _is_seq(a):
        return tuple(fn(x, b) for x in a)
    if _is_seq(b):
        return tuple(fn(a, y) for y in b)
    return fn(a, b)


def add(a, b): return _elementwise(lambda x, y: x + y, a, b)
def sub(a, b): return _elementwise(lambda x, y: x - y, a, b)
def mul(a, b): return _elementwise(lambda x, y: x * y, a, b)
def truediv(a, b): return _elementwise(lambda x, y: x / y, a, b)
def floordiv(a, b): return _elementwise(lambda x, y: x // y, a, b)
def mod(a, b): return _elementwise(lambda x, y: x % y, a, b)
def power(a, b): return _elementwise(lambda x, y: x ** y, a, b)
def lt(a, b): return _elementwise(lambda x, y: x < y, a, b)
def le(a, b): return _elementwise(lambda x, y: x <= y, a, b)
def gt(a, b): return _elementwise(lambda x, y: x > y, a, b)
def ge(a, b): return _elementwise(lambda x, y: x >= y, a, b)


def results(value) -> tuple:
    """A rule's right-hand side as its tuple of results: one value, or a list of them."""
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def neg(a):
    return tuple(-x for x in a) if _is_seq(a) else -a


def eq(a, b) -> bool:
    """Whole-value equality (a shape equals a shape), never elementwise."""
    if _is_seq(a) and _is_seq(b):
        return tuple(a) == tuple(b)
    return a == b


def ne(a, b) -> bool:
    return not eq(a, b)


# ----------------------------------------------------------------------------- checks
class SpecCheckFailed(ShapeError):
    pass


def fail(op: str, node: str, message: str, location: str):
    where = f" (node {node!r})" if node else ""
    raise SpecCheckFailed(f"{op}{where}: {message} [declared at {location}]")


class Unifier:
    """Binds the element-type variables and dimension symbols of an op declaration.

    A symbol seen twice is an equality check; the error names both operands."""

    def __init__(self, op: str, node: str = ""):
        self.op, self.node = op, node
        self.dtypes: dict[str, tuple[str, str]] = {}     # typevar -> (dtype, operand)
        self.dims: dict[str, tuple[Any, str]] = {}       # symbol -> (value, operand)

    def _fail(self, message: str, location: str):
        fail(self.op, self.node, message, location)

    def elem(self, operand: str, ty: Type, var: str, allowed: Sequence[str], location: str):
        if allowed and ty.dtype not in allowed:
            self._fail(f"operand {operand!r} has element type {ty.dtype}, but {var} must be one of "
                       f"{', '.join(allowed)}", location)
        seen = self.dtypes.get(var)
        if seen is None:
            self.dtypes[var] = (ty.dtype, operand)
        elif seen[0] != ty.dtype:
            self._fail(f"operand {operand!r} has element type {ty.dtype} but {seen[1]!r} has "
                       f"{seen[0]}; both are {var}", location)

    def exact_elem(self, operand: str, ty: Type, dtype: str, location: str):
        if ty.dtype != dtype:
            self._fail(f"operand {operand!r} must have element type {dtype}, not {ty.dtype}", location)

    def _bind(self, symbol, value, operand, location, what):
        if isinstance(symbol, int):
            if value != symbol:
                self._fail(f"operand {operand!r}: {what} must be {symbol}, got {value}", location)
            return
        seen = self.dims.get(symbol)
        if seen is None:
            self.dims[symbol] = (value, operand)
        elif seen[0] != value:
            self._fail(f"{what} of operand {operand!r} is {_fmt(value)} but {symbol} is "
                       f"{_fmt(seen[0])} from operand {seen[1]!r}", location)

    def shape(self, operand: str, ty: Type, prefix: Sequence, rest: Optional[str],
              suffix: Sequence, location: str):
        """Bind `Tensor[_, *prefix, *rest, *suffix]` against `ty.shape`."""
        shape = ty.shape
        fixed = len(prefix) + len(suffix)
        if rest is None and len(shape) != fixed:
            self._fail(f"operand {operand!r} must have rank {fixed}, got shape {list(shape)}", location)
        if rest is not None and len(shape) < fixed:
            self._fail(f"operand {operand!r} must have rank at least {fixed}, got shape {list(shape)}",
                       location)
        for i, sym in enumerate(prefix):
            self._bind(sym, shape[i], operand, location, f"dimension {i}")
        for j, sym in enumerate(suffix):
            i = len(shape) - len(suffix) + j
            self._bind(sym, shape[i], operand, location, f"dimension {i}")
        if rest is not None:
            middle = tuple(shape[len(prefix):len(shape) - len(suffix)])
            self._bind(rest, middle, operand, location, f"dimensions {len(prefix)}..")

    def dim(self, symbol: str):
        return self.dims[symbol][0]

    def dtype(self, var: str) -> str:
        return self.dtypes[var][0]


def _fmt(v):
    return list(v) if isinstance(v, tuple) else v


def check(ok, op: str, node: str, message: str, location: str):
    if isinstance(ok, tuple):
        ok = all(ok)
    if not ok:
        fail(op, node, message, location)


def result_type(op: str, node: str, dtype, dims, location: str) -> Type:
    if dtype not in DTYPES:
        fail(op, node, f"result element type {dtype!r} is not an element type", location)
    try:
        dims = tuple(int(d) for d in dims)
    except (TypeError, ValueError):
        fail(op, node, f"result shape {dims!r} is not a list of integers", location)
    if any(d < 0 for d in dims):
        fail(op, node, f"result shape {list(dims)} has a negative dimension", location)
    return Type(dtype, dims)


# ----------------------------------------------------------------------------- builtins
# Every name in BUILTINS may be used in spec expressions (shape formulas, checks, guards,
# ONNX mappings and rule right-hand sides).  Keep them generic: shapes and lists only.

def b_len(x):
    return len(x)


def b_rank(x):
    return len(x.shape)


def b_prod(xs):
    p = 1
    for x in xs:
        p *= x
    return p


def b_sum(xs):
    return sum(xs)


def b_all(x):
    return all(x) if _is_seq(x) else bool(x)


def b_any(x):
    return any(x) if _is_seq(x) else bool(x)


def b_min(*xs):
    return min(xs[0]) if len(xs) == 1 else min(xs)


def b_max(*xs):
    return max(xs[0]) if len(xs) == 1 else max(xs)


def b_abs(x):
    return tuple(abs(v) for v in x) if _is_seq(x) else abs(x)


def b_concat(*seqs):
    out = []
    for s in seqs:
        out.extend(s)
    return tuple(out)


def b_results_of(value):
    """Every result of the node that computes `value` (an op with several, such as Split,
    built in a rule, stands for its first)."""
    return tuple(value.node.outputs)


def b_list(*values):
    """The values as one list (several results of a builder or a rule)."""
    return tuple(values)


def b_ones(n):
    return (1,) * int(n)


def b_repeat(value, n):
    return (value,) * int(n)


def b_range(*args):
    return tuple(range(*[int(a) for a in args]))


def b_reversed(xs):
    return tuple(reversed(xs))


def b_ceil(x):
    return math.ceil(x)


def b_floor(x):
    return math.floor(x)


def b_int(x):
    return int(x)


def b_float(x):
    return float(x)


def b_tuple(x):
    return tuple(x)


def b_broadcast(*shapes):
    """NumPy broadcasting of any number of shapes."""
    if len(shapes) == 1 and shapes[0] and _is_seq(shapes[0][0]):
        shapes = tuple(shapes[0])          # broadcast(S) over a variadic operand's shapes
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        dim = 1
        for s in shapes:
            j = i - (rank - len(s))
            if j < 0:
                continue
            d = s[j]
            if d == 1:
                continue
            if dim != 1 and d != dim:
                raise ShapeError("shapes " + ", ".join(str(list(s)) for s in shapes)
                                 + " do not broadcast")
            dim = d
        out.append(dim)
    return tuple(out)


def b_broadcastable(*shapes):
    try:
        b_broadcast(*shapes)
        return True
    except ShapeError:
        return False


def b_normalize_axis(axis, rank):
    axis = int(axis)
    if not -rank <= axis < max(rank, 1):
        raise ShapeError(f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def b_normalize_axes(axes, rank):
    out = tuple(sorted(b_normalize_axis(a, rank) for a in axes))
    if len(set(out)) != len(out):
        raise ShapeError(f"repeated axis in {list(axes)}")
    return out


def b_reduce_shape(shape, axes, keepdims):
    """Shape after reducing `axes` (all axes when empty)."""
    axes = set(axes) if len(axes) else set(range(len(shape)))
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def b_permute(shape, perm):
    if sorted(perm) != list(range(len(shape))):
        raise ShapeError(f"perm {list(perm)} is not a permutation of the {len(shape)} axes")
    return tuple(shape[p] for p in perm)


def b_inverse_perm(perm):
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


def b_dtype(x):
    return x.dtype


def b_shape(x):
    return x.shape


def b_is_float(dtype):
    from .types import FLOAT_DTYPES
    return dtype in FLOAT_DTYPES


def once(thunk):
    """`thunk`, evaluated the first time it is called and remembered (an onnx clause's `let`)."""
    cell = []

    def get():
        if not cell:
            cell.append(thunk())
        return cell[0]
    return get


def b_item(value, default=None):
    if value is None:
        return default
    import numpy as np
    arr = np.asarray(value)
    if arr.size != 1:
        raise ShapeError(f"expected a single value, got an array of shape {list(arr.shape)}")
    return arr.reshape(()).item()


def b_elem_dtype(value, default="f32"):
    if value is None:
        return default
    from .types import dtype_of
    return dtype_of(value)


def b_defined(x):
    return x is not None


def b_ints(x):
    import numpy as np
    return tuple(int(v) for v in np.asarray(x).reshape(-1))


def b_floats(x):
    import numpy as np
    return tuple(float(v) for v in np.asarray(x).reshape(-1))


# ----------------------------------------------------------------------------- attributes
def to_int(x) -> int:
    return int(x)


def to_ints(x) -> tuple[int, ...]:
    import numpy as np
    if isinstance(x, (int, np.integer)):
        return (int(x),)
    return tuple(int(v) for v in x)


def to_float(x) -> float:
    return float(x)


def to_floats(x) -> tuple[float, ...]:
    return tuple(float(v) for v in x)


def to_string(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def to_strings(x) -> tuple[str, ...]:
    return (to_string(x),) if isinstance(x, (str, bytes)) else tuple(to_string(v) for v in x)


def to_dtype(x) -> str:
    if x not in DTYPES:
        raise ShapeError(f"{x!r} is not an element type; expected one of {', '.join(DTYPES)}")
    return x


CONVERTERS = {"int": to_int, "ints": to_ints, "float": to_float, "floats": to_floats,
              "string": to_string, "strings": to_strings, "dtype": to_dtype}



def b_clamp_to(value, dtype):
    """`value` clamped into the range of element type `dtype` (for bounds such as +-inf)."""
    import numpy as np
    from .types import numpy_dtype
    dt = numpy_dtype(dtype)
    if np.issubdtype(dt, np.integer):
        info = np.iinfo(dt)
        if value != value:
            return 0
        return int(min(max(value, info.min), info.max))
    return value


# ----------------------------------------------------------------------------- graph queries
# Rule guards and right-hand sides may ask about the values they matched.  These stay
# generic: constants and their data, and the producers of values.

def b_is_const(value) -> bool:
    """`value` is a compile-time Constant."""
    from .graph import Constant
    return isinstance(value, Constant)


def b_is_computed(value) -> bool:
    """`value` is the result of a node: neither a model input nor a Constant."""
    return getattr(value, "producer", None) is not None


def b_transposed_data(value):
    """The data of a 2-D Constant, transposed (for a constant of the transposed shape)."""
    if not b_is_const(value) or value.data.ndim != 2:
        raise ShapeError(f"%{value.name} is not a 2-D constant")
    return value.data.T


def b_is_splat(value, element=None) -> bool:
    """`value` is a non-empty Constant whose elements are all equal (to `element` if given)."""
    import numpy as np
    if not b_is_const(value) or value.data.size == 0:
        return False
    flat = value.data.reshape(-1)
    first = flat[0]
    if not np.all(flat == first):
        return False
    return element is None or bool(first == element)


def b_reciprocal_is_normal(value) -> bool:
    """`value` is a float Constant whose every element has a finite, normal reciprocal in its
    element type, so that x * (1 / c) stays within an ulp or two of x / c.  Not so for 0,
    infinities, NaN and denormals (1 / c overflows: 0 * inf is NaN where 0 / c is 0), nor for
    elements so large that their reciprocal is denormal and has lost its precision."""
    import ml_dtypes
    import numpy as np
    if not b_is_const(value) or value.data.dtype.kind not in "fV":
        return False
    data = value.data.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        r = np.abs(1.0 / data)
    info = ml_dtypes.finfo(value.data.dtype)
    return bool(np.all((r >= float(info.tiny)) & (r <= float(info.max))))


def b_splat_value(value) -> float:
    """The repeated element of a splat Constant, as a Python number."""
    if not b_is_splat(value):
        raise ShapeError(f"%{value.name} is not a constant with all elements equal")
    return value.data.reshape(-1)[0].item()


def _same_kind(value, node) -> bool:
    p = value.producer
    return (p is not None and p.OP == node.OP and len(p.outputs) == 1
            and p.attr_values() == node.attr_values())


def b_nested(values, node) -> bool:
    """Some of `values` is produced by a node of the same op and attributes as `node`."""
    return any(_same_kind(v, node) for v in values)


def b_unnest(values, node) -> tuple:
    """`values` with each value that a node like `node` produces replaced by that node's
    operands (one level): for op(op(a, b), c), the operands a, b, c."""
    out = []
    for v in values:
        out.extend(v.producer.flat_inputs() if _same_kind(v, node) else [v])
    return tuple(out)


# ----------------------------------------------------------------------------- quantization
# Quantized types carry scale and offset (Type.quant); values a quantizing compilation
# calibrated carry the parameters chosen for them (Value.calibrated: (dtype, Quant), or
# (dtype, Quant, weight_max): the largest magnitude of the weights of the products reading
# the value, when the compilation narrows them below the type's).

def _quant_of(x):
    q = getattr(getattr(x, "type", x), "quant", None)
    if q is None:
        raise ShapeError(f"{getattr(x, 'name', x)} has no quantized type")
    return q


def b_is_quantized(x) -> bool:
    """`x` (a value or a type) has a quantized element type."""
    return getattr(getattr(x, "type", x), "quant", None) is not None


def b_has_quant(x, scale, offset) -> bool:
    """`x` (a value or a type) is quantized with `scale` (compared in float32, the
    precision of scales) and `offset`."""
    import numpy as np
    q = getattr(getattr(x, "type", x), "quant", None)
    return q is not None and np.float32(q.scale) == np.float32(scale) and q.offset == offset


def b_same_quant(xs) -> bool:
    """The values or types `xs` are all quantized with the same parameters, or none is: what
    joining them into one tensor (a concatenation) needs."""
    quants = {getattr(getattr(x, "type", x), "quant", None) for x in xs}
    return len(quants) <= 1


def b_quant_scale(x) -> float:
    return _quant_of(x).scale


def b_quant_offset(x) -> int:
    return _quant_of(x).offset


def _result(x):
    """A matched node stands for its (first) result."""
    outputs = getattr(x, "outputs", None)
    return outputs[0] if outputs else x


def b_calibrated(x) -> bool:
    """Calibration chose quantization parameters for value `x` (a node: its result)."""
    return getattr(_result(x), "calibrated", None) is not None


def _calibrated(x):
    if not b_calibrated(x):
        raise ShapeError(f"%{getattr(x, 'name', x)} was not calibrated")
    return _result(x).calibrated


def b_calibrated_dtype(x) -> str:
    return _calibrated(x)[0]


def b_calibrated_scale(x) -> float:
    return _calibrated(x)[1].scale


def b_calibrated_offset(x) -> int:
    return _calibrated(x)[1].offset


def b_calibrated_weight_max(x) -> int:
    """The largest magnitude a product over `x` quantizes its weights to: what the
    calibration says, else the type's maximum."""
    import numpy as np
    from .types import numpy_dtype
    c = _calibrated(x)
    return int(c[2]) if len(c) > 2 else int(np.iinfo(numpy_dtype(c[0])).max)


BUILTINS = {
    name[2:]: fn for name, fn in dict(globals()).items() if name.startswith("b_") and callable(fn)
}
BUILTINS.update({"inf": math.inf, "true": True, "false": False, "none": None})

for _dt in DTYPES:
    BUILTINS.setdefault(_dt, _dt)
