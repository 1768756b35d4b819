"""Markdown: safe tables (for the report and bench's table) and the report's blocks.

A table is written here, not by tabulate: tabulate's "github" format pads every column
by two spaces more than its widest cell (a 10-column table grows by 20 characters) and
writes a cell's `|` as it is. Cells are made safe first: `|` escaped, line breaks turned
into spaces (either would break a Markdown table); each column is as wide as its widest
cell, one space either side."""
from __future__ import annotations

from lab.report import document as d


def cell(value) -> str:
    if value is None:
        return ""
    text = str(value).replace("\r\n", " ").replace("\n", " ").replace("\r", " ")
    return text.replace("|", "\\|")


def table(headers, rows) -> str:
    head = [cell(h) for h in headers]
    body = [[cell(c) for c in row] for row in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]

    def line(cells):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"
    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
                     + [line(r) for r in body])


def render(blocks: list) -> str:
    """The blocks as one Markdown document: each block a paragraph of its own; a table's
    notes each a paragraph under it."""
    parts = []
    for b in blocks:
        if isinstance(b, d.Heading):
            parts.append("#" * b.level + " " + b.text)
        elif isinstance(b, d.Para):
            parts.append(b.text)
        elif isinstance(b, d.Table):
            parts.append(table(b.headers, b.rows))
            parts += list(b.notes)
        elif isinstance(b, d.Items):
            parts.append("\n".join((f"{i}. " if b.numbered else "- ") + text
                                   for i, text in enumerate(b.items, 1)))
        elif isinstance(b, d.Image):
            parts.append(f"![{b.alt}]({b.name})")
        else:
            raise TypeError(f"not a report block: {b!r}")
    return "\n\n".join(parts) + "\n"
