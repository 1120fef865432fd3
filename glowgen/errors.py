"""One error hierarchy for everything a user can cause.

Every message says what went wrong, where (file:line:col, op, node or input) and,
where there is one, what to do about it.  The CLI prints ``error: <message>`` and
exits with status 2; it never shows a traceback for a ``GlowgenError``.
"""
from __future__ import annotations


class GlowgenError(Exception):
    """Base class of every error a user can cause."""


class SpecError(GlowgenError):
    """A `.glowdef` file is malformed or inconsistent.

    The message starts with ``FILE:LINE:COL:`` so editors can jump to it."""

    def __init__(self, message: str, file: str | None = None, line: int | None = None,
                 column: int | None = None):
        self.file, self.line, self.column, self.bare_message = file, line, column, message
        where = ""
        if file is not None:
            where = f"{file}:{line or 0}:{column or 0}: "
        super().__init__(where + message)


class ModelError(GlowgenError):
    """The model file cannot be read or is not valid ONNX."""


class UnsupportedError(GlowgenError):
    """The model uses an op, attribute or type that glowgen does not support."""


class CompileTimeInputError(UnsupportedError):
    """A value the compiler needs at compile time (a shape, axes, a Range bound) depends on
    model inputs; `inputs` names them.  Binding them as constants (`constant_inputs=` in the
    Python API, `--constant-input` on the command line) specializes the model and resolves it."""

    def __init__(self, message: str, inputs=(), value: str | None = None):
        super().__init__(message)
        self.inputs = tuple(inputs)
        self.value = value       # the ONNX name of the value needed, when the model names it


class DataDependentError(CompileTimeInputError):
    """An op whose output shape depends on the values of its operands (NonZero, Unique, a
    Compress whose condition is computed) meets operands computed from the model inputs
    `inputs`.  `node` and `outputs` name the ONNX node; glowgen.compile's specializing model
    cuts the graph there (glowgen/staged.py); binding the inputs as constants folds the op."""

    def __init__(self, message: str, inputs, node: str, outputs=(), value: str | None = None):
        super().__init__(message, inputs, value)
        self.node = node
        self.outputs = tuple(outputs)


class ShapeError(GlowgenError):
    """An operand's type does not satisfy its op's declaration."""


class InputError(GlowgenError):
    """Wrong inputs at run time (name, shape, dtype) or unbound dynamic dimensions."""


class RewriteError(GlowgenError):
    """The rewrite engine did not converge or a rule built an invalid graph."""


class ParseError(GlowgenError):
    """The textual form of a graph could not be parsed."""


class MemoryLimitError(GlowgenError):
    """The model needs more memory than the compilation may use (`max_memory=`,
    `--max-memory`; default: what the machine has available)."""
