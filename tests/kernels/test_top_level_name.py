"""The checkout's kernels/ folder never shadows an installed top-level ``kernels`` package (transformers >= 5.25)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

from prefixflow.kernels.top_level_name import hand_over_top_level_name

CHECKOUT_ROOT = Path(__file__).resolve().parents[2]


def _fake_distribution(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    (site / "kernels").mkdir(parents=True)
    (site / "kernels" / "__init__.py").write_text("MARK = 'installed'\n")
    (site / "kernels" / "layer.py").write_text("NAME = 'layer'\n")
    return site


def test_the_installed_package_takes_the_name_even_behind_the_checkout(tmp_path: Path) -> None:
    site = _fake_distribution(tmp_path)
    modules: dict[str, ModuleType] = {}
    assert hand_over_top_level_name(modules, [str(CHECKOUT_ROOT), str(site)])
    assert modules["kernels"].MARK == "installed"
    assert Path(modules["kernels"].__file__).parent == site / "kernels"


def test_without_an_installed_package_the_name_stays(tmp_path: Path) -> None:
    modules: dict[str, ModuleType] = {}
    assert not hand_over_top_level_name(modules, [str(CHECKOUT_ROOT), str(tmp_path)])
    assert modules == {}


def test_import_kernels_from_the_checkout_root_gets_the_installed_package(tmp_path: Path) -> None:
    site = _fake_distribution(tmp_path)
    code = (
        "import kernels, kernels.layer, prefixflow.kernels as layer;"
        "print(kernels.MARK, kernels.layer.NAME, callable(layer.select))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=CHECKOUT_ROOT,
        env={"PYTHONPATH": f"{CHECKOUT_ROOT}:{site}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.split() == ["installed", "layer", "True"]
