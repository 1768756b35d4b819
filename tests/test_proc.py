"""The one process helper (lab.common.proc), on real processes: lines (the last one
without a newline kept), a prefix, separate streams, the time limit ending the whole
process tree (TERM, then KILL for what ignores TERM), typed errors."""
import os
import sys
import time

import pytest

from lab.common import proc


def test_lines_stream_with_a_prefix_and_the_last_line_without_newline_is_kept():
    seen = []
    res = proc.run([sys.executable, "-c", "import sys; print('one'); sys.stdout.write('two')"],
                   echo=seen.append, prefix="[n1] ", timeout=60)
    assert res.ok and res.stdout == "one\ntwo" and res.tail == ["one", "two"]
    assert seen == ["[n1] one", "[n1] two"]


def test_iter_lines_joins_chunks_split_anywhere():
    chunks = [b"al", b"pha\nbe", b"ta\r\n", b"\xffgam", b"ma"]
    assert list(proc.iter_lines(chunks)) == ["alpha", "beta", "\ufffdgamma"]


def test_separate_streams_and_the_exit_status():
    res = proc.run([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); "
                    "sys.exit(3)"], merge=False, timeout=60)
    assert res.returncode == 3 and res.stdout == "out" and res.stderr == "err"
    with pytest.raises(proc.Failed, match="exited with 3: err"):
        proc.run([sys.executable, "-c", "import sys; print('err', file=sys.stderr); sys.exit(3)"],
                 check=True, timeout=60)


def test_a_missing_program_is_a_typed_error():
    with pytest.raises(proc.NotFound, match="no-such-program"):
        proc.run(["no-such-program-here"])


def test_the_time_limit_ends_the_whole_tree_even_what_ignores_term(tmp_path):
    pidfile = tmp_path / "child.pid"
    # The child ignores TERM and would live for a minute; the parent waits for it.
    code = (f"import os, signal, subprocess, sys, time\n"
            f"c = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            f"signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'])\n"
            f"open({str(pidfile)!r}, 'w').write(str(c.pid))\n"
            f"print('started', flush=True)\nc.wait()\n")
    t0 = time.monotonic()
    res = proc.run([sys.executable, "-c", code], timeout=3, grace=1)
    took = time.monotonic() - t0
    assert res.timed_out and res.returncode is None and "started" in res.tail
    assert took < 15, took
    child = int(pidfile.read_text())
    for _ in range(50):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the child {child} that ignored TERM is still alive")
    with pytest.raises(proc.TimedOut, match="did not finish"):
        proc.run([sys.executable, "-c", "import time; time.sleep(30)"], timeout=1, grace=1,
                 check=True)


def test_stop_ends_a_started_process_at_once():
    p = proc.start([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"])
    for _ in range(100):
        if p.tail:
            break
        time.sleep(0.05)
    p.stop(grace=1)
    assert p.poll() is not None
