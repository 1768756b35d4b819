"""How wide what the kit prints may be: the one place that decides it. A terminal's own
width; where the output is no terminal (a pipe, a log, CI), $COLUMNS when it holds a
number (shells export it, and a user can set it); otherwise 120 columns."""
from __future__ import annotations

import os
import sys
import textwrap

DEFAULT = 120
NARROWEST = 60      # a table below this cannot keep its columns apart: it is laid out at this


def width(stream=None, environ=None) -> int:
    """The columns the output may use (see the module's note)."""
    stream = sys.stdout if stream is None else stream
    environ = os.environ if environ is None else environ
    try:
        if stream.isatty():
            return max(NARROWEST, os.get_terminal_size(stream.fileno()).columns)
    except (AttributeError, OSError, ValueError):
        pass            # no file descriptor (a test's StringIO), or not a terminal after all
    columns = str(environ.get("COLUMNS", "")).strip()
    if columns.isdigit() and int(columns) > 0:
        return max(NARROWEST, int(columns))
    return DEFAULT


def wrap(text: str, columns: int | None, indent: str = "  ") -> str:
    """A line of prose at most `columns` wide (None: as it is), its continuation lines
    indented; words are never broken."""
    if columns is None or len(text) <= columns:
        return text
    return "\n".join(textwrap.wrap(text, columns, subsequent_indent=indent, break_on_hyphens=False,
                                   break_long_words=False)) or text


def duration(seconds: float, rough: bool = False) -> str:
    """A time as the user reads it: "1 min 05 s", "45 s"; `rough` (an estimate): whole
    minutes from 90 s on ("5 min"), else seconds ("75 s")."""
    if rough:
        return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"
    m, s = divmod(int(round(seconds)), 60)
    return f"{m} min {s:02d} s" if m else f"{s} s"
