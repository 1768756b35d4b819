"""The stall watch (lab.host.watch.stall, lab.worker.heartbeat): real ranks that really hang —
one that stops calling collectives, one asleep in its data loading, a rendezvous whose
world is larger than the ranks started — end within a minute of the stall with a failed
record naming the rank behind, its phase and step and its stack's top frames; runs that
do not stall are left alone (tests/test_runs.py's runs go through the same watch)."""
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from lab.common import heartbeat, results
from lab.common.config import SLOW_SAVE_S, ConfigError, RunConfig
from lab.host.errors import BenchError
from lab.host.places.local import LocalRunner
from lab.host.request.checks import parse_stall
from lab.host.run import bench
from lab.host.settings import BenchSettings
from lab.host.watch.stall import StallWatch
from tests.conftest import requires_horovod, requires_mpirun
from tests.test_runs import processes_left

# The tests' stall bound (--stall-s). It bounds only the silences outside steps (rendezvous,
# setup, finish) and is a floor for steps: the import has its own bound (IMPORT_S, 120 s),
# a rank not heard yet or in its first step before a timed forward counts under the largest
# bound of any rank (StallWatch.bound), and the silences left here last well under a second
# (startup_phases_s: rendezvous 0.4-0.6 s, data and setup 0.1 s at np 2): 10 s is tens of
# times that. The README's own command (--stall-s 20) runs as given below.
STALL_S = 10


def run(stack, tmp_path, mnist_like, runner=None, **kw):
    settings = dict(np=[2], data="mnist", data_dir=str(mnist_like), epochs=1, batch_size=32,
                    warmup_steps=3, results_dir=str(tmp_path), timeout_s=300, stall_s=STALL_S)
    settings.update(kw)
    lines = []
    t0 = time.monotonic()
    outcome = bench.run(BenchSettings(**settings), echo=lines.append, stack=stack, runner=runner)
    return outcome, lines, time.monotonic() - t0


def stalled_record(outcome):
    [r] = outcome.records
    assert r["status"] == "failed" and results.missing_fields(r) == []
    assert r["error"]["reason"].startswith(f"stalled: no rank advanced for {STALL_S} s")
    return r["error"]


def rank_entry(err, rank):
    return next(e for e in err["stalled"]["ranks"] if e["rank"] == rank)


def test_ddp_hang_through_invoke_names_rank_1_its_step_and_frames(tmp_path, mnist_like):
    """The issue's command: ends within a minute of the stall, with rank 1, its phase and
    step, and the top frames of its stack in the record."""
    t0 = time.monotonic()
    cp = subprocess.run([sys.executable, "-m", "invoke", "bench", "--local", "--np", "2",
                         "--framework", "ddp", "--fault", "1:20:hang", "--stall-s", "20",
                         "--data", "mnist", "--data-dir", str(mnist_like), "--batch-size", "32",
                         "--results-dir", str(tmp_path), "--run-id", "hang"],
                        capture_output=True, text=True, timeout=300)
    elapsed = time.monotonic() - t0
    assert cp.returncode != 0 and "1 run(s) failed" in cp.stderr, cp.stdout[-2000:] + cp.stderr
    [r] = results.read_records(tmp_path / "hang" / results.RESULTS_FILE)[0]
    err = r["error"]
    assert err["reason"].startswith("stalled: no rank advanced for 20 s")
    assert err["rank"] == 1 and err["stalled"]["behind"] == [1]
    one, zero = rank_entry(err, 1), rank_entry(err, 0)
    assert (one["phase"], one["step"], one["where"]) == ("step", 20, "before")
    assert one["stack"][0].startswith("train.py:") and one["stack"][0].endswith("in stop_calling_collectives")
    assert "rank 1 on" in err["reason"] and "at step 20" in err["reason"]
    assert "stop_calling_collectives" in err["reason"]
    # rank 0 went on into step 20 and waits in its collectives (the backward's all-reduce)
    assert (zero["phase"], zero["step"], zero["where"], zero["behind"]) == ("step", 20, "backward", False)
    assert any("backward" in f for f in zero["stack"])
    # start-up, 20 steps, 20 s of silence, the stacks, the stop: well within a minute after it
    assert elapsed < 20 + 60, f"took {elapsed:.0f} s"
    assert processes_left("--run-id hang") == []


@pytest.mark.parametrize("framework,backend", [
    pytest.param("horovod", "gloo", marks=requires_horovod),
    pytest.param("horovod", "mpi", marks=[requires_horovod, requires_mpirun])])
def test_horovod_hang_is_stopped_and_explained(stack, tmp_path, mnist_like, framework, backend):
    outcome, lines, elapsed = run(stack, tmp_path, mnist_like, framework=framework,
                                  backend=backend, fault="1:20:hang", run_id=f"h-{backend}")
    err = stalled_record(outcome)
    assert err["rank"] == 1 and err["stalled"]["behind"] == [1]
    one = rank_entry(err, 1)
    assert (one["phase"], one["step"], one["where"]) == ("step", 20, "before")
    assert one["stack"][0].endswith("in stop_calling_collectives")
    # Horovod waits in its synchronize() (marked "communication": the step's parts) or,
    # before it, in the backward's hooks or the optimizer
    assert rank_entry(err, 0)["where"] in ("backward", "communication", "optimizer")
    assert elapsed < STALL_S + 75, f"took {elapsed:.0f} s"
    assert any(line.startswith("!! run stalled and was stopped") for line in lines)
    # its own run id: the other back end's case may run at the same time on another worker
    assert processes_left(f"--run-id h-{backend} ") == []


def test_a_rank_asleep_in_its_data_loading(stack, tmp_path, mnist_like):
    outcome, _, _ = run(stack, tmp_path, mnist_like, framework="ddp", backend="gloo",
                        fault="1:7:hang-data", run_id="d")
    err = stalled_record(outcome)
    one = rank_entry(err, 1)
    assert err["rank"] == 1 and (one["phase"], one["step"]) == ("step", 7)
    assert one["stack"][0].endswith("in load_batch")


class WorldOfThree(LocalRunner):
    """Two ranks started for a world of three: the misconfiguration of a node that never
    came, with torch.distributed's own rendezvous (env://) at a port of this machine."""

    def __init__(self, results_dir, data_dir, port):
        super().__init__(results_dir, data_dir)
        self.port = port

    def commands(self, job):
        script = textwrap.dedent(f"""
            for r in 0 1; do
              RANK=$r LOCAL_RANK=$r WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT={self.port} \\
                {self.python} -m lab.worker.train "$@" &
            done
            wait""")
        return {"localhost": ["sh", "-c", script, "sh", *job.worker_args]}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_rendezvous_that_can_never_complete(stack, tmp_path, mnist_like):
    port = free_port()
    runner = WorldOfThree(str(tmp_path), str(mnist_like), port)
    outcome, _, elapsed = run(stack, tmp_path, mnist_like, framework="ddp", backend="gloo",
                              runner=runner, run_id="rdv")
    err = stalled_record(outcome)
    assert sorted(err["stalled"]["behind"]) == [0, 1]      # both wait: the third never comes
    assert all(e["phase"] == "rendezvous" for e in err["stalled"]["ranks"])
    rdv = err["stalled"]["rendezvous"]
    assert (rdv["world"], rdv["started"], rdv["address"], rdv["port"]) == (3, 2, "127.0.0.1", port)
    assert "the ranks expect a world of 3 but bench started 2" in err["reason"]
    assert f"127.0.0.1:{port}" in err["reason"]
    assert any("init_process_group" in f or "rendezvous" in f
               for f in rank_entry(err, 0)["stack"]), rank_entry(err, 0)["stack"]
    assert elapsed < STALL_S + 60


# -- the pieces, without ranks ------------------------------------------------------

def test_the_main_threads_frames_from_a_real_faulthandler_dump(tmp_path):
    """A dump faulthandler's watchdog really wrote (two threads: the main one asleep in
    inner(), another in its own sleep): the main thread's frames, most recent first."""
    out = tmp_path / "dump"
    code = textwrap.dedent(f"""
        import faulthandler, threading, time
        f = open({str(out)!r}, "w")
        def other(): time.sleep(5)
        def inner(): time.sleep(3)
        threading.Thread(target=other, daemon=True).start()
        print(threading.main_thread().ident, flush=True)
        faulthandler.dump_traceback_later(0.5, file=f)
        inner()
        """)
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    ident = int(cp.stdout.strip())
    frames = heartbeat.main_thread_frames(out.read_text(), ident)
    assert frames == ["<string>:5 in inner", "<string>:9 in <module>"]
    assert heartbeat.main_thread_frames(out.read_text(), None) != []   # some thread, when unknown


def test_the_default_bound_fits_the_phase_and_the_slowest_step():
    assert heartbeat.bound_s(0, "rendezvous", None) == heartbeat.RENDEZVOUS_S
    assert heartbeat.bound_s(0, "setup", None) == heartbeat.STARTUP_S
    assert heartbeat.bound_s(0, "finish", 0.02) == heartbeat.STARTUP_S
    assert heartbeat.bound_s(0, "step", None) == heartbeat.STARTUP_S     # no step timed yet
    assert heartbeat.bound_s(0, "step", 0.02) == heartbeat.STEP_MIN_S
    assert heartbeat.bound_s(0, "step", 30.0) == 300.0                   # ResNet-50 on a loaded CPU
    assert heartbeat.bound_s(0, "evaluation", 1.0, eval_steps=40) == 400.0
    assert heartbeat.bound_s(0, "evaluation", 0.02, eval_steps=16) == heartbeat.STARTUP_S
    assert heartbeat.bound_s(20, "step", 0.02) == 20                     # --stall-s: the floor of a step
    assert heartbeat.bound_s(20, "step", 30.0) == 300.0                  # never a cap on a slow one
    assert heartbeat.bound_s(20, "step", None) == heartbeat.STARTUP_S    # the first forward, untimed
    assert heartbeat.bound_s(20, "step", None, forward_s=4.0) == 120.0   # the rest of the first step
    assert heartbeat.bound_s(20, "setup", None) == 20                    # outside steps: its bound
    assert heartbeat.bound_s(20, "rendezvous", None) == 20
    assert heartbeat.bound_s(20, "evaluation", 1.0, eval_steps=40) == 400.0
    assert heartbeat.bound_s(20, "import", None) == heartbeat.IMPORT_S   # but torch's import is slow


@pytest.mark.parametrize("value, says", [("45", "45.0"), ("", "120.0"), ("soon", None), ("0", None)])
def test_the_import_bound_comes_from_lab_import_s(value, says):
    """LAB_IMPORT_S sets the import's bound; a value that is no positive number is one
    sentence naming it and the way back to the default."""
    cp = subprocess.run([sys.executable, "-c", "from lab.common import heartbeat as h; print(h.IMPORT_S)"],
                        capture_output=True, text=True, timeout=60, env={**os.environ, "LAB_IMPORT_S": value})
    if says:
        assert cp.returncode == 0 and cp.stdout.strip() == says, cp.stderr
    else:
        assert cp.returncode == 1 and "Traceback" not in cp.stderr, cp.stderr
        assert cp.stderr.strip() == (f"LAB_IMPORT_S must be a number of seconds above 0, not {value!r}: "
                                     "unset it for the default 120 s")


class QueuedDevice:
    """A GPU as the rank's clock sees it: a call returns once its work is queued, and
    synchronize() waits until the queue has run."""

    def __init__(self):
        self.done_at, self.waits = 0.0, 0

    def queue(self, seconds: float) -> None:
        self.done_at = max(self.done_at, time.monotonic()) + seconds

    def synchronize(self) -> None:
        self.waits += 1
        time.sleep(max(0.0, self.done_at - time.monotonic()))


def test_a_slow_first_backward_on_a_gpu_is_not_called_stalled(tmp_path):
    """The first step's bound comes from its forward timed to its end: a forward whose
    kernels take 0.5 s (queued in no time) and a first backward silent for 3 s (NCCL's
    lazy set-up, cuDNN's autotuning), under --stall-s 1, are left alone."""
    from lab.worker.heartbeat import Heartbeat
    run_dir, device, forward_s, backward_s = tmp_path / "run", QueuedDevice(), 0.5, 3.0
    stopped = []
    hb = Heartbeat(str(run_dir), "a", 0, stall_s=1.0, launch=7.0)
    hb.synchronize = device.synchronize
    w = StallWatch(heartbeat.folder(run_dir, "a"), 1, 1.0, 7.0, stop=lambda: stopped.append(1),
                   poll_s=0.1).start()
    try:
        hb.beat("warm-up", 0, "in")
        hb.mark("forward")
        device.queue(forward_s)             # the forward's kernels, launched
        hb.mark("backward")
        assert hb.forward_s >= forward_s
        time.sleep(backward_s)              # the first backward: no beat
        hb.mark("optimizer")
        hb.step_took(forward_s + backward_s)
        hb.mark("forward")                  # a later step waits for nothing
        hb.mark("backward")
        assert device.waits == 2
        hb.close()
    finally:
        w.close()
    assert w.error is None and stopped == [], w.error
    assert heartbeat.read(heartbeat.beat_path(run_dir, "a", 0))["phase"] == "done"


HOROVOD_REPORT = [   # horovod/common/stall_inspector.cc's message as horovodrun prefixes it
    "[0]<stderr>:[2026-11-24 06:40:01.1: W /horovod/common/stall_inspector.cc:107] One or more "
    "tensors were submitted to be reduced, gathered or broadcasted by subset of ranks and are "
    "waiting for remainder of ranks for more than 10 seconds. This may indicate that different "
    "ranks are trying to submit different tensors or that only subset of ranks is submitting "
    "tensors, which will cause deadlock. ",
    "[0]<stderr>:Missing ranks:",
    "[0]<stderr>:1: [allreduce.conv1.weight, allreduce.fc2.bias]",
    "[0]<stdout>:something else"]


def test_horovods_stall_report_is_parsed(tmp_path):
    w = StallWatch(str(tmp_path), 2, 20, 0.0, stop=lambda: None)
    for line in HOROVOD_REPORT:
        w.line(line)
    assert w.horovod == {"after_s": 10, "missing": {1: ["allreduce.conv1.weight", "allreduce.fc2.bias"]}}


def test_a_watch_with_nothing_stalled_never_fires(tmp_path):
    """Ranks whose heartbeats keep advancing, and ranks that are done, are left alone."""
    folder = tmp_path / "hb"
    folder.mkdir()
    stopped = []
    w = StallWatch(str(folder), 2, 1.0, 7.0, stop=lambda: stopped.append(1), poll_s=0.1).start()
    try:
        for seq in range(1, 31):                      # 3 s of advancing, over a 1 s bound
            for r in (0, 1):
                heartbeat.write(str(folder / f"rank-{r}.json"),
                                {"rank": r, "seq": seq, "phase": "step", "step": seq,
                                 "bound_s": 1.0, "launch": 7.0})
            time.sleep(0.1)
        for r in (0, 1):
            heartbeat.write(str(folder / f"rank-{r}.json"),
                            {"rank": r, "seq": 99, "phase": "done", "bound_s": 5.0, "launch": 7.0})
        time.sleep(1.5)
    finally:
        w.close()
    assert w.error is None and w.launcher_ended is None and stopped == []


def test_a_launcher_that_outlives_its_finished_ranks_is_ended_within_the_bound(tmp_path):
    """Every rank done, the launcher still there: ended after the done phase's bound,
    and not called a stall."""
    stopped = []
    for r in (0, 1):
        heartbeat.write(str(tmp_path / f"rank-{r}.json"),
                        {"rank": r, "seq": 9, "phase": "done", "bound_s": 1.0, "launch": 7.0})
    w = StallWatch(str(tmp_path), 2, 1.0, 7.0, stop=lambda: stopped.append(time.monotonic()),
                   poll_s=0.1, echo=lambda line: None)
    t0 = time.monotonic()
    w.start()
    try:
        time.sleep(2.0)
    finally:
        w.close()
    assert w.error is None and len(stopped) == 1 and stopped[0] - t0 < 1.6
    assert w.launcher_ended.startswith("the launcher had not exited 1 s after every rank ended")


def test_a_heartbeat_of_an_earlier_launch_is_not_this_ones(tmp_path):
    heartbeat.write(str(tmp_path / "rank-0.json"), {"rank": 0, "seq": 3, "phase": "step", "launch": 1.0})
    assert StallWatch(str(tmp_path), 1, 20, 2.0, stop=lambda: None).beats() == {0: None}


@pytest.mark.parametrize("bad", ["0", "-3", "soon", "nan", "NaN"])
def test_stall_flag_bad_values_are_one_sentence(bad):
    with pytest.raises(BenchError, match="--stall-s takes seconds"):
        parse_stall(bad)
    assert parse_stall("auto") == 0 and parse_stall("off") == -1 and parse_stall("20") == 20


@pytest.mark.parametrize("bad", ["inf", "Infinity", "1e10", "86401"])
def test_stall_bounds_past_a_day_are_one_sentence(bad):
    with pytest.raises(BenchError, match=r"--stall-s takes at most 86400 s \(a day\).*`off`") as e:
        parse_stall(bad)
    assert "\n" not in str(e.value)
    assert parse_stall("86400") == 86400


def test_stopping_a_local_runner_as_its_job_ends_is_safe():
    """stop() (the stall watch's thread) reads the running job once: run() may clear it
    between a check and a use."""
    class Job:
        stopped = 0

        def stop(self):
            self.stopped += 1

    job = Job()

    class Racy(LocalRunner):
        reads = 0

        @property
        def _running(self):
            self.reads += 1
            return job if self.reads == 1 else None

        @_running.setter
        def _running(self, value):
            pass
    racy = Racy()
    racy.stop()
    assert job.stopped == 1 and racy.reads == 1


def test_the_hang_fault_modes_parse():
    assert RunConfig(fault="1:20:hang").fault_plan() == (1, 20, "hang")
    assert RunConfig(fault="0:3:hang-data").fault_plan() == (0, 3, "hang-data")
    assert os.path.basename(heartbeat.beat_path("/r", "a", 1)) == "rank-1.json"


def test_the_report_lists_a_stalled_run_with_its_diagnosis(tmp_path):
    from lab.report.analysis import analysis
    from lab.report.lab_report import render
    reason = "stalled: no rank advanced for 20 s; behind: rank 1 on vm at step 20; top frames: x"
    rec = results.make_record("failed", run_id="r", config=RunConfig().as_record(), np=2, nodes=1,
                              started_at=results.now_iso(),
                              error={"rank": 1, "host": "vm", "reason": reason, "log_tail": "",
                                     "stalled": {"bound_s": 20, "behind": [1], "ranks": []}})
    assert any(line.endswith(reason) and "2 workers" in line for line in analysis([rec]).sentences())
    assert reason in render([rec], [], "results/r")


@pytest.mark.parametrize("torch_version, buffer, dump_file", [
    ("2.10.0+cu128", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"),
    ("2.4.1", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"),
    (None, "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"),      # not probed
    ("unknown", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"),
    ("2.11.0+cu130", "TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE"),   # warned of the old names
    ("2.13.0", "TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE"),
    ("3.0.0a0", "TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE"),
])
def test_the_flight_recorder_variables_are_named_as_the_ranks_torch_reads_them(torch_version, buffer, dump_file):
    """torch 2.11 warned that TORCH_NCCL_TRACE_BUFFER_SIZE and TORCH_NCCL_DEBUG_INFO_TEMP_FILE
    are deprecated: from it on the new names, before it (and when the ranks' torch is not
    known) the old ones, which every release reads; never both."""
    from lab.host.watch.stall import flight_recorder
    gpu = RunConfig(framework="ddp", backend="nccl", device="cuda", run_id="r", attempt="a")
    env, _ = flight_recorder(gpu, "nccl", {}, "/results", "/runs/r", torch_version)
    assert set(env) == {buffer, dump_file, "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"}
    assert env[buffer] == "2000" and env[dump_file] == "/results/r/flight/a/rank-"


def test_the_rank_makes_the_dump_folder_under_either_name(tmp_path, monkeypatch):
    """lab.worker.heartbeat makes the Flight Recorder's folder from whichever dump-file
    variable bench set (torch writes there and makes no folder)."""
    from lab.worker.heartbeat import Heartbeat
    for name in ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"):
        monkeypatch.delenv("TORCH_FR_DUMP_TEMP_FILE", raising=False)
        monkeypatch.delenv("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", raising=False)
        monkeypatch.setenv(name, str(tmp_path / name / "flight" / "a" / "rank-"))
        Heartbeat(str(tmp_path / "run"), "a", 0)
        assert (tmp_path / name / "flight" / "a").is_dir()


def test_the_flight_recorder_is_for_gpu_runs_of_ddp_over_nccl_and_asked_through_its_pipe(tmp_path):
    """The host's half only (no GPU here: the ranks' half is verified by reading): the
    variables, and a write to each rank's FIFO, read by a real reader as ProcessGroupNCCL's
    DumpPipe would."""
    from lab.host.watch.stall import flight_recorder
    cpu = RunConfig(framework="ddp", run_id="r", attempt="a")
    assert flight_recorder(cpu, "gloo", {"X": "1"}, "/results", tmp_path) == ({"X": "1"}, None)
    gpu = RunConfig(framework="ddp", backend="nccl", device="cuda", run_id="r", attempt="a")
    env, folder = flight_recorder(gpu, "nccl", {}, "/results", tmp_path / "r", "2.13.0+cu130")
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == "/results/r/flight/a/rank-"
    assert env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == env["TORCH_FR_DUMP_TEMP_FILE"]
    assert int(env["TORCH_FR_BUFFER_SIZE"]) > 0 and folder == str(tmp_path / "r" / "flight" / "a")
    os.makedirs(folder)
    os.mkfifo(os.path.join(folder, "rank-1.pipe"))
    reader = os.open(os.path.join(folder, "rank-1.pipe"), os.O_RDONLY | os.O_NONBLOCK)
    try:
        w = StallWatch(str(tmp_path), 2, 20, 0.0, stop=lambda: None, flight=folder)
        assert w.ask_flight_recorder() == [1]          # rank 0 has no pipe: not asked
        assert os.read(reader, 100) == b"dump\n"
    finally:
        os.close(reader)
    (tmp_path / "r" / "flight" / "a" / "rank-1").write_bytes(b"trace")
    assert w.flight_dumps() == ["flight/a/rank-1"]


@pytest.mark.parametrize("env,rank", [
    ({"PMIX_RANK": "3", "SLURM_PROCID": "3"}, 3),           # srun --mpi=pmix
    ({"SLURM_PROCID": "2"}, 2),                              # srun's tasks are the ranks
    ({"RANK": "5", "SLURM_PROCID": "1"}, 5),                 # torchrun under srun: RANK, not the task
    ({"OMPI_COMM_WORLD_RANK": "1", "PMIX_RANK": "1"}, 1),
    ({"HOROVOD_RANK": "4", "PMIX_RANK": "0"}, 4),
    ({}, 0),
])
def test_a_rank_reads_its_rank_from_its_launcher_before_any_framework(env, rank):
    """Each rank's heartbeat and failure file are named by this rank: under srun --mpi=pmix
    every rank would otherwise write rank-0.json."""
    from lab.worker.train import _rank_from_env
    assert _rank_from_env(env) == rank


# ------------------------------------------------------------ the checkpoint phase

def test_a_checkpoints_bound_comes_from_its_bytes_as_the_rank_wrote_them(tmp_path):
    """The watch's bound for a rank saving a checkpoint: its bytes (recorded by the
    rank's own heartbeat writer on entering the phase) at CHECKPOINT_MB_S, never under
    the bound outside steps; back in its steps the bytes are gone and the bound is the
    step's again."""
    from lab.worker.heartbeat import Heartbeat
    run_dir = tmp_path / "run"
    hb = Heartbeat(str(run_dir), "a", 0, stall_s=10.0, launch=7.0)
    watch = StallWatch(heartbeat.folder(run_dir, "a"), 1, 10.0, 7.0, stop=lambda: None)
    big = int(90 * heartbeat.CHECKPOINT_MB_S * 1e6)        # 90 s at the assumed rate
    try:
        hb.beat("step", 20, "before")
        hb.step_took(0.01)
        hb._flush()
        assert watch.bound(watch.beats()) == 10.0
        hb.beat("checkpoint", 20, "save")                   # its size not known yet
        hb._flush()
        assert watch.bound(watch.beats()) == 10.0
        hb.beat("checkpoint", 20, "save", checkpoint_bytes=big)
        hb._flush()
        beat = watch.beats()[0]
        assert beat["phase"] == "checkpoint" and beat["checkpoint_bytes"] == big
        assert watch.bound(watch.beats()) == pytest.approx(90.0)
        hb.beat("checkpoint", 20, "save", checkpoint_bytes=1000)    # small: the floor
        hb._flush()
        assert watch.bound(watch.beats()) == 10.0
        hb.beat("step", 20, "before")
        hb._flush()
        beat = watch.beats()[0]
        assert beat["checkpoint_bytes"] is None and watch.bound(watch.beats()) == 10.0
    finally:
        hb.close()
    assert heartbeat.bound_s(0, "checkpoint", None, checkpoint_bytes=big) == heartbeat.STARTUP_S
    assert heartbeat.bound_s(20, "checkpoint", 30.0, checkpoint_bytes=1000) == 300.0  # a step's
    assert heartbeat.bound_s(20, "checkpoint", None, checkpoint_bytes=big) == pytest.approx(90.0)


def test_a_save_slower_than_the_stall_bound_is_not_called_stalled(tmp_path):
    """A rank 2.5 s in its save under --stall-s 1, its bytes taking 4 s at the assumed
    rate: the watch leaves it alone."""
    from lab.worker.heartbeat import Heartbeat
    run_dir, stopped = tmp_path / "run", []
    hb = Heartbeat(str(run_dir), "a", 0, stall_s=1.0, launch=7.0)
    w = StallWatch(heartbeat.folder(run_dir, "a"), 1, 1.0, 7.0, stop=lambda: stopped.append(1),
                   poll_s=0.1).start()
    try:
        hb.beat("step", 10, "before")
        hb.step_took(0.01)
        hb.beat("checkpoint", 10, "save", checkpoint_bytes=int(4 * heartbeat.CHECKPOINT_MB_S * 1e6))
        time.sleep(2.5)
        hb.beat("step", 10, "before")
        time.sleep(0.3)
        hb.close()
    finally:
        w.close()
    assert w.error is None and stopped == [], w.error


def test_a_stall_in_a_save_says_so_with_its_size(tmp_path):
    """A save that outlasts even its checkpoint bound is a stall, diagnosed as one while
    saving a checkpoint of its size."""
    from lab.worker.heartbeat import Heartbeat
    run_dir, stopped = tmp_path / "run", []
    hb = Heartbeat(str(run_dir), "a", 0, stall_s=1.0, launch=7.0)
    w = StallWatch(heartbeat.folder(run_dir, "a"), 1, 1.0, 7.0, stop=lambda: stopped.append(1),
                   poll_s=0.1, dump_wait_s=3.0).start()
    try:
        hb.beat("checkpoint", 30, "save", checkpoint_bytes=96_000_000 // 100)
        deadline = time.monotonic() + 15
        while w.error is None and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        w.close()
        hb.close()
    assert stopped == [1] and w.error, w.error
    reason = w.error["reason"]
    assert reason.startswith("stalled: no rank advanced for 1 s;"), reason
    assert "at saving a checkpoint after step 30 (0.96 MB)" in reason, reason
    assert "; stalled while saving a checkpoint (0.96 MB); its bound was 1 s" in reason, reason


def test_the_slow_save_fault_needs_checkpoints():
    assert RunConfig(fault="0:10:slow-save", checkpoint_every=10).fault_plan() == (0, 10, "slow-save")
    RunConfig(fault="0:10:slow-save", checkpoint_every=10).check()
    with pytest.raises(ConfigError, match=r"^--fault 0:10:slow-save slows a checkpoint's save, and "
                                          r"this run saves none: add --checkpoint-every N$"):
        RunConfig(fault="0:10:slow-save").check()


def test_a_slow_save_past_the_stall_bound_ends_ok(stack, tmp_path, monkeypatch):
    """Real ranks: rank 0's save after step 10 sleeps SLOW_SAVE_S (15 s) under --stall-s
    10; the rate this test sets (LAB_CHECKPOINT_MB_S, which the local ranks inherit) puts
    the checkpoint's bytes (the MNIST CNN's parameters and SGD's momentum) at 25 s: the
    run ends ok, its slow checkpoint counted."""
    from lab.worker import models
    model, _ = models.build("mnist", 1, 28, 10)
    state = 2 * sum(p.numel() * p.element_size() for p in model.parameters())
    monkeypatch.setenv(heartbeat.CHECKPOINT_VAR, repr(state / 25e6))
    outcome, lines, _ = run(stack, tmp_path, None, framework="ddp", data="synthetic", synthetic_size=1280,
                            max_steps=20, checkpoint_every=10, fault="0:10:slow-save")
    assert outcome.failed == 0, "\n".join(lines[-30:])
    (r,) = outcome.records
    assert r["status"] == "ok", r.get("error")
    assert r["figures"]["checkpoints"]["written"] == 1
    assert r["figures"]["checkpoints"]["total_s"] >= SLOW_SAVE_S
