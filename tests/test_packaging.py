"""The installed namespace: `prefixflow.*` imports lazily, and a built wheel works outside the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _python(code: str, cwd: Path, executable: str = sys.executable) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [executable, "-c", code], cwd=cwd, capture_output=True, text=True, env=env, timeout=300
    )


def test_top_level_names_import_lazily_and_plan_stays_torch_free(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "sys.modules['torch'] = None  # importing torch now raises\n"
        "import prefixflow, prefixflow.pipeline.cli\n"
        "assert 'prefixflow.engine' not in sys.modules\n"
        "print(prefixflow.load_job.__module__, prefixflow.plan_shards.__module__)\n"
    )
    res = _python(code, tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["prefixflow.pipeline.job.spec", "prefixflow.pipeline.run.planning"]


def test_engine_names_come_from_the_namespace(tmp_path: Path) -> None:
    res = _python(
        "from prefixflow import LLM, SamplingParams, EngineConfig, batch_inference\n"
        "print(LLM.__module__, SamplingParams.__module__, EngineConfig.__module__, batch_inference.name)",
        tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [
        "prefixflow.engine.llm",
        "prefixflow.engine.sampling.sampling_params",
        "prefixflow.engine.config",
        "batch-inference",
    ]


def test_unknown_name_is_an_attribute_error() -> None:
    import prefixflow

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        prefixflow.nope  # noqa: B018


@pytest.mark.slow
def test_wheel_installs_into_a_fresh_venv_and_runs_the_demo_outside_the_checkout(tmp_path: Path) -> None:
    # Build from a copy: an in-tree build would leave build/ and *.egg-info in the checkout.
    source = tmp_path / "source"
    shutil.copytree(
        REPO,
        source,
        symlinks=True,
        ignore=shutil.ignore_patterns(
            ".git", "build", "*.egg-info", "__pycache__", ".venv", "prefixflow-demo", ".hypothesis"
        ),
    )
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(wheels),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = wheels.glob("prefixflow-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    wanted = {
        f"prefixflow/{p.relative_to(REPO)}"
        for layer in ("engine", "kernels", "pipeline", "flows", "configs")
        for p in (REPO / layer).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert wanted - shipped == set(), "files the wheel lacks"
    # The venv sees this interpreter's packages (torch, ...) but gets its own prefixflow from the wheel.
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    py = str(env_dir / "bin" / "python")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps", str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = _python(
        "import prefixflow.engine, prefixflow.engine.loading.presets as p; print(prefixflow.engine.__file__);"
        "print(p.configs_dir())",
        elsewhere,
        py,
    )
    assert where.returncode == 0, where.stderr
    engine_file, configs = where.stdout.split()
    assert engine_file.startswith(str(env_dir)) and configs.startswith(str(env_dir))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run(
        [str(env_dir / "bin" / "prefixflow"), "demo", "--model", "tiny", "--workdir", "demo"],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert list((elsewhere / "demo" / "tiny" / "summarize-out" / "data").rglob("*.parquet"))
    assert list((elsewhere / "demo" / "tiny" / "label-out" / "data").rglob("*.parquet"))


def _folders_to_ship() -> set[str]:
    """Every folder of the layers and configs/, as the package name it installs under."""
    names = {"prefixflow"}
    for layer in ("engine", "kernels", "pipeline", "flows", "configs"):
        for folder in [REPO / layer, *(REPO / layer).rglob("*")]:
            if folder.is_dir() and folder.name != "__pycache__":
                names.add(".".join(("prefixflow", *folder.relative_to(REPO).parts)))
    return names


def test_package_discovery_finds_every_folder_of_the_layers() -> None:
    """pyproject.toml lists no package: [tool.setuptools.packages.find] discovers them through the prefixflow/
    links, so a new sub-folder ships without anyone editing a list."""
    from setuptools.config.pyprojecttoml import read_configuration

    packages = read_configuration(REPO / "pyproject.toml", expand=True)["tool"]["setuptools"]["packages"]
    assert sorted(packages) == sorted(_folders_to_ship())
