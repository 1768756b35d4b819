"""The progress line rank 0 prints while it trains (every few seconds) and the host reads
back: one format, written and parsed here. Standard library only."""
from __future__ import annotations

import re

EVERY_S = 2.0          # how often rank 0 says where it is
_LINE = re.compile(r"progress: step (\d+)/(\d+), ([\d.]+) images/s")


def line(step: int, total: int, images_per_s: float) -> str:
    return f"progress: step {step}/{total}, {images_per_s:.1f} images/s"


def parse(text: str) -> tuple[int, int, float] | None:
    """(step, total steps, images/s) from a line that carries one (a launcher's prefix,
    "[1,0]<stdout>:" or "[node1] ", may stand before it), else None."""
    m = _LINE.search(text)
    return (int(m.group(1)), int(m.group(2)), float(m.group(3))) if m else None
