"""What `invoke bench` shows while it works. Every line of the ranks and launchers goes
through as it comes, except rank 0's progress lines (lab.common.progress): on a terminal
they drive a live bar (tqdm: steps done of all, images/s, time left), and elsewhere (CI,
a log file) one plain line of them passes at most every PLAIN_EVERY_S seconds, so a long
run is never silent for minutes and a log is not flooded."""
from __future__ import annotations

import sys
import threading
import time

from lab.common import progress

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
