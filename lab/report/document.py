"""The report as a list of blocks (headings, paragraphs, tables with their notes, lists,
images), built once from the records and written as Markdown (lab.report.markdown) or
as one HTML page (lab.report.html), so the two never say different things."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Heading:
    level: int
    text: str


@dataclass
class Para:
    """A paragraph; `code` spans in backticks are the only inline markup."""
    text: str


@dataclass
class Table:
    headers: list
    rows: list
    notes: list = field(default_factory=list)     # lines under the table: [n] notes, marks


@dataclass
class Items:
    items: list
    numbered: bool = False


@dataclass
class Image:
    name: str          # a PNG file beside the report
    alt: str


class Notes:
    """Numbered notes for a document: a long text (a reason, a failure) goes under its
    table as `[n] text` and its cell holds `[n]`; the same text is one note however many
    cells point at it. Numbers run through the whole document; `take` hands over the
    notes added since the last take, for the table they belong under."""

    def __init__(self):
        self._numbers: dict[str, int] = {}
        self._pending: list[str] = []

    def add(self, text: str) -> str:
        if text not in self._numbers:
            self._numbers[text] = len(self._numbers) + 1
            self._pending.append(f"[{self._numbers[text]}] {text}")
        return f"[{self._numbers[text]}]"

    def take(self) -> list[str]:
        out, self._pending = self._pending, []
        return out
