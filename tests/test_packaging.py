"""An installed (not editable) glowgen carries its specs: `glowgen regen --check` works from
site-packages, run from a directory that is not the repository."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

from conftest import REPO


def test_installed_package_has_its_specs_and_runs(tmp_path):
    # A copy of the sources: building writes build/ and *.egg-info beside them.
    source = tmp_path / "src"
    source.mkdir()
    for item in ("pyproject.toml", "setup.py", "README.md", "glowgen", "specs"):
        copy = shutil.copytree if (REPO / item).is_dir() else shutil.copy
        copy(REPO / item, source / item, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                             if (REPO / item).is_dir() else {}))
    target = tmp_path / "site"
    build = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                            "--target", str(target), str(source)],
                           capture_output=True, text=True, cwd=tmp_path)
    assert build.returncode == 0, build.stderr[-2000:]
    assert sorted(p.name for p in (target / "glowgen" / "specs").glob("*.glowdef")) == [
        "cpu_kernels.glowdef", "helpers.glowdef", "lowerings.glowdef", "ops.glowdef"]
    env = {**os.environ, "PYTHONPATH": str(target)}
    cli = [sys.executable, "-c", "import sys; from glowgen.cli import main; sys.exit(main())"]
    check = subprocess.run(cli + ["regen", "--check"], capture_output=True, text=True,
                           cwd=tmp_path, env=env)
    assert check.returncode == 0, check.stdout + check.stderr
    assert str(target) in check.stdout          # it read the installed copy, not the repo's
    run = subprocess.run(cli + ["run", str(REPO / "examples" / "tiny_cnn.onnx"),
                                "--backend", "interpreter"],
                         capture_output=True, text=True, cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stderr
    assert "probs: shape=[1, 10]" in run.stdout
