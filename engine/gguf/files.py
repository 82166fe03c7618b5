"""Turn a user-given model path (a .gguf file or a directory holding one) into the one GGUF file to read."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from gguf import GGUFReader

from prefixflow.engine.gguf.metadata import field_value


def find_gguf_file(path: str | Path) -> Path:
    """Return the GGUF file ``path`` names: the file itself, or the single ``*.gguf`` inside a directory.

    A directory with zero or several GGUF files is ambiguous, so the error lists what it holds
    instead of guessing.
    """
    p = Path(path).expanduser()
    if p.is_file():
        return p
    if p.is_dir():
        found = sorted(c for c in p.iterdir() if c.is_file() and c.suffix.lower() == ".gguf")
        if len(found) == 1:
            return found[0]
        names = sorted(c.name for c in p.iterdir())
        if not found:
            raise FileNotFoundError(
                f"no .gguf file in directory {str(p)!r}; it holds: {', '.join(names) or '(nothing)'}"
            )
        raise ValueError(
            f"directory {str(p)!r} holds {len(found)} .gguf files, expected exactly one: "
            f"{', '.join(c.name for c in found)}; pass the file path instead"
        )
    raise FileNotFoundError(f"GGUF model path {str(p)!r} does not exist")


def is_gguf_path(model: str | Path) -> bool:
    """Whether ``model`` should go to the GGUF loader: a ``.gguf`` path, or a directory holding a ``.gguf``
    file and no ``config.json`` (a Hugging Face directory that also carries a GGUF stays a HF directory).
    """
    p = Path(model).expanduser()
    if p.suffix.lower() == ".gguf":
        return True
    if not p.is_dir() or (p / "config.json").is_file():
        return False
    return any(c.is_file() and c.suffix.lower() == ".gguf" for c in p.iterdir())


def file_identity(reader: GGUFReader, file: Path) -> dict[str, Any]:
    """What names this model across runs: file name, size, quantization and a hash of head and tail.

    Hashing the first and last MiB (plus the size) tells different files apart without reading
    gigabytes on every start. The absolute path is left out on purpose: the same file installed
    elsewhere (another machine's site-packages) is the same model, so a job can resume there.
    """
    size = file.stat().st_size
    return {
        "format": "gguf",
        "file": file.name,
        "size": size,
        "sha256_head_tail": head_tail_digest(file),
        "general_name": field_value(reader, "general.name", None),
        "file_type": field_value(reader, "general.file_type", None),
    }


def head_tail_digest(file: Path) -> str:
    """sha256 of the size, the first MiB and the last MiB: tells checkpoints apart without reading them."""
    size = file.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with file.open("rb") as f:
        digest.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        digest.update(f.read(1 << 20))
    return digest.hexdigest()
