"""Turn a user-given model path (a .gguf file or a directory holding one) into the one GGUF file to read."""

from __future__ import annotations

from pathlib import Path


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
