"""bench's live progress: rank 0's progress lines (lab.common.progress) drive a tqdm bar
on a terminal and pass as plain lines, at most every 30 s, elsewhere."""
import io
import subprocess
import sys

from conftest import REPO

from lab.common import progress
from lab.common.display import PLAIN_EVERY_S, Display


def test_the_line_rank_0_prints_is_the_line_the_host_reads():
    text = progress.line(120, 300, 4321.5)
    assert progress.parse(text) == (120, 300, 4321.5)
    assert progress.parse(f"[1,0]<stdout>:{text}") == (120, 300, 4321.5)     # horovodrun's prefix
    assert progress.parse("epoch 1/3: loss 2.3") is None


def test_on_a_terminal_a_live_bar_and_the_other_lines_above_it():
    out, shown = io.StringIO(), []
    d = Display(echo=shown.append, stream=out, tty=True)
    d.line("-- run 1 of 2 (ddp over gloo, none, np 2): 0 s so far")
    d.line(progress.line(100, 400, 5000.0))
    d.line("epoch 1/4: loss 2.2")
    d.line(progress.line(200, 400, 5100.0))
    screen = out.getvalue()
    assert "200/400" in screen and "5,100 images/s" in screen and "rank 0" in screen
    assert "epoch 1/4: loss 2.2" in screen              # written above the bar, not lost
    assert shown == ["-- run 1 of 2 (ddp over gloo, none, np 2): 0 s so far"]
    d.line("== ddp over gloo, 2 process(es): next")      # the next run closes the bar
    assert d._bar is None and shown[-1].startswith("== ddp")


def test_elsewhere_plain_lines_at_most_every_30_seconds():
    now = [0.0]
    shown = []
    d = Display(echo=shown.append, stream=io.StringIO(), tty=False, clock=lambda: now[0])
    for step in range(1, 40):
        now[0] = step * 2.0                           # rank 0 speaks every 2 s
        d.line(progress.line(step * 10, 1000, 250.0))
    # at 2 s, then the first line at least PLAIN_EVERY_S (30 s) after each: 32 s, 62 s
    assert PLAIN_EVERY_S == 30
    assert shown == [f"   step {s * 10} of 1000, 250 images/s" for s in (1, 16, 31)]


def test_a_run_of_several_seconds_says_where_it_is(tmp_path):
    """A real run of several seconds: its output (not a terminal here) carries a plain
    progress line between its start and its table (rank 0 speaks after 2 s). 600 steps of
    the default MNIST net at np 1 train for about 9 s here (15 ms a step): several times
    the 2 s before rank 0's first line, and a loaded machine only makes it longer."""
    cp = subprocess.run([sys.executable, "-m", "invoke", "bench", "--local", "--np", "1", "--framework", "ddp",
                         "--max-steps", "600", "--results-dir", str(tmp_path)],
                        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0, cp.stdout[-2000:] + cp.stderr[-2000:]
    plain = [line for line in cp.stdout.splitlines() if line.startswith("   step ")]
    assert plain and all(" of " in line and line.endswith("images/s") for line in plain), cp.stdout[-2000:]
