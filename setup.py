"""Packaging beyond pyproject.toml: the wheel carries specs/ inside the package.

The spec files live at the top of the repository (they are the project's source of truth, not
a Python module), so an installed glowgen would have no specs for `glowgen regen` to read.
build_py copies them to glowgen/specs/ in the build; glowgen/dsl/regen.py looks there when the
repository's specs/ is not beside the package.
"""
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithSpecs(build_py):
    def run(self):
        super().run()
        target = Path(self.build_lib) / "glowgen" / "specs"
        target.mkdir(parents=True, exist_ok=True)
        for spec in sorted(Path(__file__).resolve().parent.joinpath("specs").glob("*.glowdef")):
            self.copy_file(str(spec), str(target / spec.name))


setup(cmdclass={"build_py": BuildWithSpecs})
