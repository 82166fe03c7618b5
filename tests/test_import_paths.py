"""Every file has one import path: ``prefixflow.<layer>.<module>``, never ``<layer>.<module>``.

The layers are top-level folders (engine/, pipeline/, kernels/, flows/) reached as ``prefixflow.*``
through the prefixflow/ links (docs/architecture.md, "Packaging"). With the repository root on
``sys.path`` a folder is also importable under its own name, which would load a second copy of every
module (two ``Request`` classes, two registries). These tests keep that from happening.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAYERS = ("engine", "pipeline", "kernels", "flows")
# Layers whose __init__ refuses a second name. Not kernels/: transformers probes the name ``kernels`` (the
# Hugging Face kernels hub) and imports whatever it finds on sys.path, so refusing would break transformers
# whenever the repository root is on the path; kernels/__init__ imports only ``prefixflow.kernels.*``, so
# that probe binds the same objects and loads no second copy of a module.
GUARDED = ("engine", "pipeline", "flows")


def _tracked_python_files() -> list[Path]:
    skip = {".git", "prefixflow", "build", "dist", ".venv"}  # prefixflow/<layer> are the links to the layers
    return [p for p in REPO.rglob("*.py") if not skip & set(p.relative_to(REPO).parts[:1])]


def test_no_file_imports_a_layer_by_its_folder_name_or_relatively() -> None:
    """``import engine...`` would load a second copy; so would a relative import inside a module loaded
    under a second name (the transformers probe of ``kernels``): only absolute ``prefixflow.*`` imports."""
    wrong = []
    for path in _tracked_python_files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level > 0:
                wrong.append(f"{path.relative_to(REPO)}:{node.lineno}: relative import of {node.module}")
                continue
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            wrong += [
                f"{path.relative_to(REPO)}:{node.lineno}: {n}" for n in names if n.split(".")[0] in LAYERS
            ]
    assert wrong == [], "import these as prefixflow.<layer>...: " + ", ".join(wrong)


@pytest.mark.parametrize("layer", GUARDED)
def test_a_layer_imported_by_its_folder_name_fails_and_says_how(layer: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run(
        [sys.executable, "-c", f"import {layer}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode != 0
    assert f"ImportError: import prefixflow.{layer}, not {layer}" in res.stderr


def test_each_layer_is_reached_through_exactly_one_link() -> None:
    links = {p.name: p.resolve() for p in (REPO / "prefixflow").iterdir() if p.is_symlink()}
    assert links == {layer: REPO / layer for layer in (*LAYERS, "configs")}
    # Inside the layers no link leads back into the tree (which would give a file a second dotted name).
    for layer in LAYERS:
        assert [p for p in (REPO / layer).rglob("*") if p.is_symlink()] == []


def test_the_checkout_imports_the_engine_with_only_the_root_on_the_path(tmp_path: Path) -> None:
    """The GPU machine cannot install: ``PYTHONPATH=<checkout>`` alone must import the engine from it
    (the editable install's finder is taken out of the subprocess to stand for "no install")."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    code = (
        "import sys\n"
        "sys.meta_path[:] = [f for f in sys.meta_path if '__editable__' not in type(f).__module__]\n"
        "import prefixflow.engine.sampling.sampling_params as m, prefixflow.engine as e\n"
        "print(m.__file__, e.SamplingParams.__module__)"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr
    module_file, module_name = res.stdout.split()
    assert Path(module_file).resolve() == REPO / "engine" / "sampling" / "sampling_params.py"
    assert module_name == "prefixflow.engine.sampling.sampling_params"
