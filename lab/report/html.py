"""The report's blocks as one self-contained HTML page: the styles inline, each PNG
embedded as a data: URL, nothing fetched from anywhere (a student can mail the one file
or open it offline)."""
from __future__ import annotations

import base64
import html
import re
from pathlib import Path

from lab.report import document as d

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px;
       color: #1b1b1b; line-height: 1.45; }
h1 { font-size: 1.6em; } h2 { font-size: 1.3em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
h3 { font-size: 1.1em; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { border: 1px solid #bbb; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
tr:nth-child(even) td { background: #fafafa; }
p.note { font-size: 0.85em; margin: 0.2em 0; color: #333; }
code { font-family: ui-monospace, monospace; background: #f3f3f3; padding: 0 2px; }
img { display: block; margin: 0.5em 0; max-width: 100%; height: auto; }
"""


def inline(text: str) -> str:
    """Escaped text, `code` spans as <code>."""
    parts = re.split(r"`([^`]*)`", str(text))
    return "".join(f"<code>{html.escape(p)}</code>" if i % 2 else html.escape(p)
                   for i, p in enumerate(parts))


def data_url(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def render(blocks: list, image_dir: Path, title: str = "Distributed training lab report") -> str:
    body = []
    for b in blocks:
        if isinstance(b, d.Heading):
            body.append(f"<h{b.level}>{inline(b.text)}</h{b.level}>")
        elif isinstance(b, d.Para):
            body.append(f"<p>{inline(b.text)}</p>")
        elif isinstance(b, d.Table):
            head = "".join(f"<th>{inline(h)}</th>" for h in b.headers)
            rows = "\n".join("<tr>" + "".join(f"<td>{inline('' if c is None else c)}</td>" for c in row)
                             + "</tr>" for row in b.rows)
            body.append(f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{rows}\n</tbody>\n</table>")
            body += [f'<p class="note">{inline(n)}</p>' for n in b.notes]
        elif isinstance(b, d.Items):
            tag = "ol" if b.numbered else "ul"
            body.append(f"<{tag}>\n" + "\n".join(f"<li>{inline(i)}</li>" for i in b.items) + f"\n</{tag}>")
        elif isinstance(b, d.Image):
            body.append(f'<img src="{data_url(Path(image_dir) / b.name)}" alt="{html.escape(b.alt)}" '
                        f'title="{html.escape(b.name)}">')
        else:
            raise TypeError(f"not a report block: {b!r}")
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
            + "\n".join(body) + "\n</body>\n</html>\n")
