"""The registry: everything the generated code declares, in one object.

The default registry is `glowgen.generated`; `Registry.from_dir()` loads a package that
`glowgen regen --out DIR` wrote somewhere else (tests add ops that way, without touching
a Python file).
"""
from __future__ import annotations

import importlib
import importlib.util
import itertools
import sys
from functools import lru_cache
from pathlib import Path
from types import ModuleType

from ..errors import GlowgenError, UnsupportedError

_counter = itertools.count()


class Registry:
    def __init__(self, package: ModuleType, ops, onnx_map, rules, kernels, instrs):
        self.package = package
        self.ops: dict = dict(ops.OPS)
        self.onnx: dict[str, list] = {}
        for clause in onnx_map.CLAUSES:
            self.onnx.setdefault(clause.onnx_op, []).append(clause)
        self.rules: tuple = tuple(rules.RULES)
        self.kernels: dict = dict(kernels.KERNELS)
        self.scalars: dict = dict(kernels.SCALARS)
        self.extern: tuple = tuple(kernels.EXTERN)
        self.instructions: dict = dict(instrs.INSTRUCTIONS)

    # ------------------------------------------------------------------ loading
    @classmethod
    def _from_package(cls, name: str) -> "Registry":
        pkg = importlib.import_module(name)
        mods = [importlib.import_module(f"{name}.{m}") for m in ("ops", "onnx_map", "rules", "kernels", "instrs")]
        return cls(pkg, *mods)

    @classmethod
    def default(cls) -> "Registry":
        return _default()

    @classmethod
    def from_dir(cls, directory) -> "Registry":
        """Load generated modules from `directory` as a fresh package."""
        directory = Path(directory)
        if not (directory / "__init__.py").exists():
            raise GlowgenError(f"{directory} holds no generated code; run `glowgen regen --out {directory}`")
        name = f"_glowgen_generated_{next(_counter)}"
        spec = importlib.util.spec_from_file_location(name, directory / "__init__.py",
                                                      submodule_search_locations=[str(directory)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return cls._from_package(name)

    # ------------------------------------------------------------------ queries
    def op(self, name: str):
        try:
            return self.ops[name]
        except KeyError:
            raise UnsupportedError(f"op {name!r} is not declared in specs/ops.glowdef") from None

    def primitives(self) -> set[str]:
        return {n for n, c in self.ops.items() if "primitive" in c.TRAITS}

    def rules_for(self, phase: str) -> list:
        """Rules of one phase, larger patterns first, ties in file order."""
        rules = [r for r in self.rules if phase in r.phases]
        return sorted(rules, key=lambda r: -r.size)


@lru_cache(maxsize=1)
def _default() -> Registry:
    return Registry._from_package("glowgen.generated")
