"""What the user reads while the kit works and after, decided in one place: how wide it
may be (a terminal's own width; where the output is no terminal, a pipe, a log, CI,
$COLUMNS when it holds a number, as shells export it and a user can set it; otherwise 120
columns), tables narrowed by column to fit, a time as it is shown, "run k of N" with the
time left (Progress), and the live display of a run (Display).

What `invoke bench` shows while it works: every line of the ranks and launchers goes
through as it comes, except rank 0's progress lines (lab.common.progress): on a terminal
they drive a live bar (tqdm: steps done of all, images/s, time left), and elsewhere (CI,
a log file) one plain line of them passes at most every PLAIN_EVERY_S seconds, so a long
run is never silent for minutes and a log is not flooded."""
from __future__ import annotations

import os
import re
import sys
import textwrap
import threading
import time

from lab.common import progress

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


def table(headers: list[str], rows: list[list[str]], columns: int | None) -> str:
    """A table of plain cells as pipes and dashes, at most `columns` wide (None: each
    column as wide as its widest cell): narrowed column by column, the one with the most room
    first, down
    to its longest word (a range such as 0.98-1.26 breaks after its hyphen), then, where
    that is still too wide, down to the longest word of its values (a header's word then
    breaks within its column); a cell wraps over more lines of its row, and a row is
    never cut in two. Wider than `columns` only where even that cannot fit."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    if columns is not None:
        def longest(texts):
            return max((len(w) for x in texts for w in _words(x)), default=1)
        words = [longest(r[i] for r in cells) for i in range(len(headers))]
        values = [max(3, longest(r[i] for r in cells[1:])) for i in range(len(headers))]
        for least in (words, values):
            while 3 * len(widths) + 1 + sum(widths) > columns:
                room = [(w - m, i) for i, (w, m) in enumerate(zip(widths, least)) if w > m]
                if not room:
                    break
                widths[max(room)[1]] -= 1

    def lines(row):
        parts = [_wrap(c, w) for c, w in zip(row, widths)]
        return ["| " + " | ".join((p[k] if k < len(p) else "").ljust(w) for p, w in zip(parts, widths)) + " |"
                for k in range(max(len(p) for p in parts))]
    return "\n".join([*lines(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|",
                      *(ln for r in cells[1:] for ln in lines(r))])


def _words(text: str) -> list[str]:
    """The pieces textwrap keeps whole: words, and a word's parts after each hyphen."""
    return [piece for word in text.split() for piece in re.findall(r"[^-]*-|[^-]+", word)]


def _wrap(text: str, width: int) -> list[str]:
    """A cell's lines at most `width` long: its words (and a word's parts after each
    hyphen) filled greedily, a space between words, none after a hyphen; a piece longer
    than the width broken where it must be."""
    lines, line = [], ""
    for word in text.split():
        pieces = re.findall(r"[^-]*-|[^-]+", word)
        for k, piece in enumerate(pieces):
            sep = " " if line and k == 0 else ""
            if len(line) + len(sep) + len(piece) <= width:
                line += sep + piece
                continue
            if line:
                lines.append(line)
            while len(piece) > width:
                lines.append(piece[:width])
                piece = piece[width:]
            line = piece
    return lines + [line] if line or not lines else lines


class Progress:
    """"run k of N" before each run, with the time so far and an estimate of the rest
    (the mean time of the runs so far, times the runs left)."""

    def __init__(self, total: int, echo=print):
        self.total, self.done, self.echo, self.t0 = total, 0, echo, time.monotonic()

    def start(self, label: str) -> None:
        elapsed = time.monotonic() - self.t0
        rest = (f", about {duration(elapsed / self.done * (self.total - self.done))} left"
                if self.done else "")
        self.done += 1
        self.echo(f"-- run {self.done} of {self.total} ({label}): {duration(elapsed)} so far{rest}")


PLAIN_EVERY_S = 30.0


class Display:
    def __init__(self, echo=print, stream=None, tty: bool | None = None, clock=time.monotonic):
        self.echo, self.clock = echo, clock
        self.stream = stream if stream is not None else sys.stdout
        self.tty = self.stream.isatty() if tty is None else tty
        self._bar = None
        self._plain_at = None
        self._lock = threading.RLock()      # lines come from the parts' threads and the stall watch

    def line(self, text: str) -> None:
        with self._lock:
            self._line(text)

    def _line(self, text: str) -> None:
        seen = progress.parse(text)
        if seen is None:
            if text.startswith(("-- run ", "== ", "!! ")):
                self.close()            # a run starts or ends: its bar is done
            if self._bar is not None:
                self._bar.write(text, file=self.stream)
            else:
                self.echo(text)
            return
        step, total, rate = seen
        if not self.tty:
            now = self.clock()
            if self._plain_at is None or now - self._plain_at >= PLAIN_EVERY_S:
                self._plain_at = now
                self.echo(f"   step {step} of {total}, {rate:,.0f} images/s")
            return
        if self._bar is None or self._bar.total != total:
            self.close()
            from tqdm import tqdm
            self._bar = tqdm(total=total, unit="step", file=self.stream, leave=False,
                             dynamic_ncols=True, desc="rank 0")
        self._bar.update(step - self._bar.n)
        self._bar.set_postfix_str(f"{rate:,.0f} images/s", refresh=True)

    def close(self) -> None:
        with self._lock:
            if self._bar is not None:
                self._bar.close()
                self._bar = None
            self._plain_at = None
