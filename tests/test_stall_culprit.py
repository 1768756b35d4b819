"""The stall watch on every channel and with a culprit that cannot speak
(lab.host.watch.stall, lab.host.watch.stall_diagnosis, lab.worker.heartbeat): a rank stopped with
SIGSTOP is named, not the peer that waits for it in the all-reduce; heartbeats that
come over the launchers' output (servers without a shared results folder, a
Kubernetes job's log) are read behind every launcher's prefix; a slow but healthy
ResNet-50 step is never cut by --stall-s."""
import glob
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from lab.common import heartbeat, kit, results
from lab.host.places.local import LocalRunner
from lab.host.watch.stall import StallWatch
from lab.host.watch.stall_diagnosis import culprits, in_collective, process_state
from tests.conftest import requires_horovod, requires_mpirun
from tests.test_runs import processes_left

# The module's bench stack and its run(): test_stall's, shared.
from tests.test_stall import STALL_S, run  # noqa: E402 (the stack fixture: conftest)


def rank_entry(err, rank):
    return next(e for e in err["stalled"]["ranks"] if e["rank"] == rank)


def stop_rank_at(folder_glob: str, rank: int, step: int, stopped: list) -> threading.Thread:
    """A thread that sends SIGSTOP to `rank` once its heartbeat says it reached `step`
    (its pid is in the heartbeat), as a user's `kill -STOP` would."""
    def watch():
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            for path in glob.glob(os.path.join(folder_glob, f"rank-{rank}.json")):
                b = heartbeat.read(path)
                if b and b.get("phase") in ("warm-up", "step") and (b.get("step") or 0) >= step:
                    os.kill(b["pid"], signal.SIGSTOP)
                    stopped.append(b["pid"])
                    return
            time.sleep(0.02)
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("framework", ["ddp", pytest.param("horovod", marks=requires_horovod)])
def test_a_stopped_rank_is_the_culprit_and_its_peer_only_waits(stack, tmp_path, mnist_like, framework):
    """Rank 1 stopped (SIGSTOP) during a run of two ranks over Gloo: its own watchdog cannot
    run, so it gives no stack and its process is in state T; rank 0 waits inside the
    all-reduce. The record names rank 1 as not answering and rank 0 as waiting."""
    stopped: list[int] = []
    run_id = f"sigstop-{framework}"
    t = stop_rank_at(str(tmp_path / run_id / "heartbeats" / "*"), 1, 5, stopped)
    outcome, lines, elapsed = run(stack, tmp_path, mnist_like, framework=framework, backend="gloo",
                                  epochs=20, run_id=run_id)
    t.join(timeout=1)
    assert stopped, "rank 1 finished before it could be stopped"
    [r] = outcome.records
    err = r["error"]
    assert r["status"] == "failed" and results.missing_fields(r) == []
    assert err["rank"] == 1 and err["stalled"]["behind"] == [1], err["reason"]
    assert err["stalled"]["rule"] == "not answering" and err["stalled"]["waiting"] == [0]
    one, zero = rank_entry(err, 1), rank_entry(err, 0)
    assert one["answering"] is False and zero["answering"] is True and zero["behind"] is False
    assert "rank 1 on" in err["reason"] and "not answering (its process is stopped)" in err["reason"]
    assert "waiting for it: rank 0" in err["reason"]
    assert in_collective(zero["stack"]), zero["stack"]
    assert elapsed < STALL_S + 120, f"took {elapsed:.0f} s"
    assert processes_left(f"--run-id {run_id} ") == []


@pytest.mark.slow
def test_resnet50_at_batch_32_with_a_short_stall_bound_is_not_cut(stack, tmp_path):
    """ResNet-50 at batch 32 with --stall-s 20, the value the README suggests: its first
    step takes longer than 20 s on a loaded 2-core machine, and the bound follows the
    run's own forward and steps instead of cutting it."""
    outcome, lines, _ = run(stack, tmp_path, None, data="synthetic", data_dir=None, model="resnet50",
                            framework="ddp", backend="gloo", batch_size=32, warmup_steps=1, stall_s=20,
                            max_steps=2, synthetic_size=2 * 32 * 2, timeout_s=1200, run_id="r50")
    assert outcome.failed == 0, "\n".join(lines[-30:])
    [r] = outcome.records
    assert r["status"] == "ok" and r["figures"]["timed_steps"] == 1
    # what the ranks measured, from the heartbeat files the run left
    beats = [heartbeat.read(p) for p in glob.glob(str(tmp_path / "r50" / "heartbeats" / "*" / "rank-*.json"))]
    assert beats and all(b["phase"] == "done" and b["forward_s"] for b in beats)
    print("first forward (s):", [round(b["forward_s"], 2) for b in beats],
          "slowest step (s):", [round(b["slowest_step_s"], 2) for b in beats],
          "step time mean (s):", r["figures"]["step_time_mean_s"])


class ElsewhereRunner(LocalRunner):
    """Local ranks that write into a results folder bench does not read (as servers
    without a shared folder do) and print their heartbeats on the launcher's output."""

    heartbeat_channel = "stream"

    def __init__(self, results_dir, data_dir, theirs):
        super().__init__(results_dir, data_dir)
        self.results_in = theirs


def test_without_a_shared_folder_the_heartbeats_come_over_the_stream(stack, tmp_path, mnist_like):
    """Rank 1 stops calling collectives at step 20 and its heartbeat file is out of the
    watch's reach: the marker lines name it, its step and its frames (not "never ran the
    worker"), and none of them reaches the echo or the record's log tail."""
    theirs = tmp_path / "theirs"
    ours = tmp_path / "ours"
    runner = ElsewhereRunner(str(ours), str(mnist_like), str(theirs))
    outcome, lines, elapsed = run(stack, ours, mnist_like, runner=runner, framework="ddp",
                                  backend="gloo", fault="1:20:hang", run_id="stream")
    [r] = outcome.records
    err = r["error"]
    assert err["reason"].startswith(f"stalled: no rank advanced for {STALL_S} s"), err["reason"]
    assert err["rank"] == 1 and err["stalled"]["behind"] == [1]
    one = rank_entry(err, 1)
    assert (one["phase"], one["step"], one["where"]) == ("step", 20, "before")
    assert one["stack"] and one["stack"][0].endswith("in stop_calling_collectives")
    assert "never ran the worker" not in err["reason"]
    assert not (ours / "stream" / "heartbeats").exists()         # only the stream carried them
    assert list((theirs / "stream" / "heartbeats").glob("*/rank-1.json"))
    assert not any("@lab-" in line for line in lines) and "@lab-" not in err["log_tail"]
    assert elapsed < STALL_S + 60
    assert processes_left("--run-id stream ") == []


# -- the stream's lines as the launchers really print them --------------------------

# A rank's marker lines, written as lab.worker.heartbeat writes them (say: one write).
PRINT_MARKER = textwrap.dedent("""
    import os, sys
    from lab.common import heartbeat
    from lab.worker.heartbeat import say
    rank = int(next((os.environ[v] for v in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "RANK")
                     if v in os.environ), 0))
    print("hello from", rank, flush=True)
    say(heartbeat.marker_line(heartbeat.BEAT_MARK, {"rank": rank, "seq": 3, "launch": 7.5,
        "phase": "step", "step": 4, "where": "backward", "bound_s": 20}))
    say(heartbeat.marker_line(heartbeat.STACK_MARK, {"rank": rank, "seq": 3, "launch": 7.5,
        "frames": ["train.py:1 in x"]}))
""")


def launcher_lines(tmp_path, argv_prefix) -> list[str]:
    script = tmp_path / "marker.py"
    script.write_text(PRINT_MARKER)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    cp = subprocess.run([*argv_prefix, str(script)], capture_output=True, text=True, timeout=180,
                        env=env, cwd=tmp_path)
    assert cp.returncode == 0, cp.stdout[-1000:] + cp.stderr[-2000:]
    return cp.stdout.splitlines() + cp.stderr.splitlines()


LAUNCHERS = {
    "torchrun": lambda: [sys.executable, "-m", "torch.distributed.run", "--standalone",
                         "--nproc-per-node=2"],
    "torchrun --tee": lambda: [sys.executable, "-m", "torch.distributed.run", "--standalone",
                               "--nproc-per-node=2", "--tee=3"],
    "horovodrun": lambda: [kit.horovodrun(sys.executable), "-np", "2", "-H", "localhost:2", "--gloo",
                           sys.executable],
    "mpirun": lambda: ["mpirun", "--allow-run-as-root", "--oversubscribe", "--tag-output", "-np", "2",
                       sys.executable],
}


TAG = re.compile(r"(\[[\w,]+\](?:<std(?:out|err)>)?:)")


def by_tag(lines: list[str]) -> dict[str | None, str]:
    """Each launcher tag's text, its pieces put together, whitespace left out (None: the
    text of a launcher that tags nothing)."""
    out: dict[str | None, str] = {}
    for line in lines:
        parts = TAG.split(line)
        out[None] = out.get(None, "") + "".join(parts[0].split())
        for tag, text in zip(parts[1::2], parts[2::2]):
            out[tag] = out.get(tag, "") + "".join(text.split())
    return out


@pytest.mark.parametrize("launcher", [
    "torchrun", "torchrun --tee", pytest.param("horovodrun", marks=requires_horovod),
    pytest.param("mpirun", marks=requires_mpirun)])
def test_marker_lines_are_read_behind_each_launchers_prefix(tmp_path, launcher):
    lines = launcher_lines(tmp_path, LAUNCHERS[launcher]())
    markers = [line for line in lines if "@lab-" in line]
    assert len(markers) == 4, lines
    w = StallWatch(str(tmp_path), 2, 20, 7.5, stop=lambda: None, channel="stream")
    kept = [own for line in lines if (own := w.line(line)) is not None]
    assert not [line for line in kept if "@lab-" in line], lines
    # The rest is echoed as before: each rank's text, put together from the pieces its
    # launcher tagged (mpirun --tag-output tags each piece it reads: a rank's line can come
    # in pieces between other ranks' lines, MPIRUN_MERGED below).
    texts = by_tag(kept)
    tagged = sorted(v for k, v in texts.items() if k)
    assert tagged == ["hellofrom0", "hellofrom1"] or (
        not tagged and all(f"hellofrom{r}" in texts[None] for r in (0, 1))), lines
    beats = w.beats()
    assert {r: (b["step"], b["where"]) for r, b in beats.items()} == {0: (4, "backward"), 1: (4, "backward")}
    assert w._stream_stacks == {0: ["train.py:1 in x"], 1: ["train.py:1 in x"]}
    if launcher != "torchrun":       # the prefix each launcher puts before a rank's line
        assert all(not line.startswith("@lab-") for line in markers), markers


# mpirun --tag-output's stdout as this machine printed it for PRINT_MARKER under load
# (Open MPI 4.1.4, 2 ranks): rank 1's "hello from 1", written in pieces, read in three, with
# rank 0's marker after its first piece.
MPIRUN_MERGED = [
    '[1,0]<stdout>:hello from 0',
    '[1,1]<stdout>:hello from[1,0]<stdout>:@lab-beat {"rank":0,"seq":3,"launch":7.5,"phase":"step",'
    '"step":4,"where":"backward","bound_s":20}',
    '[1,0]<stdout>:@lab-stack {"rank":0,"seq":3,"launch":7.5,"frames":["train.py:1 in x"]}',
    '[1,1]<stdout>: [1,1]<stdout>:1',
    '[1,1]<stdout>:@lab-beat {"rank":1,"seq":3,"launch":7.5,"phase":"step","step":4,"where":"backward",'
    '"bound_s":20}',
]


def test_a_ranks_text_before_another_ranks_marker_is_echoed_without_the_marker(tmp_path):
    w = StallWatch(str(tmp_path), 2, 20, 7.5, stop=lambda: None, channel="stream")
    assert [w.line(line) for line in MPIRUN_MERGED] == [
        MPIRUN_MERGED[0], "[1,1]<stdout>:hello from", None, MPIRUN_MERGED[3], None]
    assert {r: b["step"] for r, b in w.beats().items()} == {0: 4, 1: 4}
    # behind the other launchers' tags, nothing of the rank's is left to echo
    beat = heartbeat.marker_line(heartbeat.BEAT_MARK, {"rank": 1, "seq": 4, "launch": 7.5, "phase": "step"})
    for tag in ("[1]<stderr>:", "[default1]:", "1: ", ""):
        assert w.line(tag + beat) is None, tag
    assert w.line("[default1]:loss 0.5[default0]:" + beat) == "[default1]:loss 0.5"


def test_a_marker_of_another_launch_or_cut_short_is_not_a_heartbeat(tmp_path):
    w = StallWatch(str(tmp_path), 2, 20, 7.5, stop=lambda: None, channel="stream")
    line = heartbeat.marker_line(heartbeat.BEAT_MARK, {"rank": 0, "seq": 1, "launch": 1.0, "phase": "step"})
    assert w.line(line) is None and w.beats() == {0: None, 1: None}      # kept out, not ours
    assert heartbeat.parse_marker(line[:-3]) is None
    assert heartbeat.parse_marker("[1,0]<stdout>:" + line)[1]["launch"] == 1.0


# -- the rules, on heartbeats and a real process ------------------------------------

def test_the_state_of_a_stopped_process_on_this_machine(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        beat = {"host": os.uname().nodename, "pid": p.pid}
        assert process_state(beat) is None                       # asleep: it can answer
        os.kill(p.pid, signal.SIGSTOP)
        time.sleep(0.2)
        assert process_state(beat) == "stopped"
        assert process_state({**beat, "host": "elsewhere"}) is None   # not judged from here
    finally:
        p.kill()
        p.wait()
    assert process_state(beat) == "gone"


def beats_of(*ranks):
    return {r: dict(rank=r, seq=seq, phase="step", step=5, where=where, stack=stack, host="h", pid=0)
            for r, (seq, where, stack) in enumerate(ranks)}


def test_the_rank_outside_the_collective_is_the_culprit_even_when_it_is_ahead():
    """Rank 1 is ahead by its sequence (it marked its forward) but sleeps outside any
    collective; rank 0 waits in the backward's all-reduce: rank 1 is the culprit."""
    beats = beats_of((10, "backward", ["base.py:80 in backward", "train.py:190 in train"]),
                     (12, "forward", ["train.py:88 in load_batch", "train.py:185 in train"]))
    assert culprits(beats, dumped={0, 1}) == ([1], {}, "not in a collective")
    # the same ranks without the rule's evidence: progress decides
    assert culprits(beats_of((10, "in", []), (12, "in", [])), dumped={0, 1})[0] == [0]
    # a rank that gave no stack while the others did: not answering
    assert culprits(beats, dumped={0}) == ([1], {1: "it wrote no stack (its own watchdog did not run)"},
                                           "not answering")
    # stopped when the stall was seen: not answering, whatever stack it left before
    beats[1]["process"] = "stopped"
    assert culprits(beats, dumped={0, 1}) == ([1], {1: "its process is stopped"}, "not answering")
    # a peer that gave its stack, then exited during the wait, still answered
    beats[0]["process"] = "gone"
    assert culprits(beats, dumped={0})[:2] == ([1], {1: "its process is stopped"})


def test_a_step_that_takes_too_long_is_said_so(tmp_path):
    from lab.host.watch.stall_diagnosis import diagnose
    beats = beats_of((4, "backward", ["x.py:1 in backward"]), (4, "backward", ["x.py:1 in backward"]))
    err = diagnose(beats, 30.0, 2, silence_s=31.4)
    assert "step 5 has taken 31 s, its bound is 30 s" in err["reason"]
    assert json.dumps(err)          # the record's error is JSON


class LauncherThatHangs(LocalRunner):
    """The kit's own local DDP launch, then a launcher that never exits (as one stuck in
    its teardown after its ranks finished)."""

    def commands(self, job):
        (cmd,) = super().commands(job).values()
        return {"localhost": ["sh", "-c", '"$@"; sleep 3600', "sh", *cmd]}


def test_a_launcher_that_hangs_after_its_ranks_finished_is_ended_and_the_result_kept(
        stack, tmp_path, mnist_like):
    runner = LauncherThatHangs(str(tmp_path), str(mnist_like))
    outcome, lines, elapsed = run(stack, tmp_path, mnist_like, runner=runner, framework="ddp",
                                  backend="gloo", stall_s=5, run_id="hung-launcher")
    assert outcome.failed == 0, "\n".join(lines[-20:])
    [r] = outcome.records
    assert r["status"] == "ok" and results.missing_fields(r) == []
    assert r["world"]["launcher_ended"].startswith("the launcher had not exited 5 s after every rank ended")
    assert elapsed < 120, f"took {elapsed:.0f} s"
    assert processes_left("--run-id hung-launcher ") == []
