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


def notes(text: str) -> dict[str, str]:
    """Each key's comment: the comment lines right above it, joined."""
    out, pending = {}, []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("#"):
            pending.append(line.lstrip("#").strip())
        elif "=" in line:
            out[line.partition("=")[0]] = " ".join(pending)
            pending = []
        else:
            pending = []
    return out


def markdown(path: str | Path = MATRIX) -> str:
    """The version table of the README, generated from the matrix."""
    text = Path(path).read_text()
    values, why = parse(text), notes(text)
    rows = ["| component | version | note |", "| --- | --- | --- |"]
    for key, value in values.items():
        name = key.removesuffix("_VERSION").replace("_", " ").lower()
        shown = f"`{value}`" if len(value) < 40 else f"`{value[:12]}…`"
        rows.append(f"| {name} | {shown} | {why.get(key, '')} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    import sys
    if sys.argv[1:] == ["--markdown"]:
        sys.stdout.write(markdown())
    else:
        sys.exit("usage: python -m lab.versions --markdown")
