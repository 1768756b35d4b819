"""Reading the version matrix, docker/versions.env (KEY=VALUE lines, shell syntax)."""
from __future__ import annotations

from pathlib import Path

MATRIX = Path(__file__).resolve().parent.parent / "docker" / "versions.env"


def parse(text: str) -> dict[str, str]:
    out = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.isidentifier() or " " in value:
            raise ValueError(f"versions.env line {n}: expected KEY=VALUE without spaces: {line!r}")
        out[key] = value.strip('"')
    return out


def read(path: str | Path = MATRIX) -> dict[str, str]:
    return parse(Path(path).read_text())
