"""Markdown tables for the report and bench's table, through tabulate. tabulate 0.10
writes a cell's `|` as it is and breaks a cell at its newlines into extra rows (seen:
`tabulate([["a|b", "x\ny"]], tablefmt="github")`), either of which breaks a Markdown
table, so cells are made safe first: `|` escaped, line breaks turned into spaces."""
from __future__ import annotations


def cell(value) -> str:
    if value is None:
        return ""
    text = str(value).replace("\r\n", " ").replace("\n", " ").replace("\r", " ")
    return text.replace("|", "\\|")


def table(headers, rows) -> str:
    from tabulate import tabulate
    return tabulate([[cell(c) for c in row] for row in rows], headers=[cell(h) for h in headers],
                    tablefmt="github", disable_numparse=True)
