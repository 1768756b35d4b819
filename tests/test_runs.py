"""Real multi-process jobs on the CPU: real launchers (torch.distributed.run,
horovodrun over Gloo and over MPI), real ranks, records checked as written."""
import os
import subprocess
import sys
import time

import pytest

from lab.common import results
from lab.host.run import bench
from lab.host.settings import BenchSettings
from lab.report.bench_output import render
from tests.conftest import TORCHVISION_MISSING, requires_horovod, requires_mpirun


@pytest.fixture(scope="session")
def stack():
    return bench.probe_stack()


def run(stack, tmp_path, mnist_like, **kw):
    settings = dict(np=[2], data="mnist", data_dir=str(mnist_like), epochs=2, batch_size=32,
                    warmup_steps=3, results_dir=str(tmp_path), timeout_s=300)
    settings.update(kw)
    lines = []
    outcome = bench.run(BenchSettings(**settings), echo=lines.append, stack=stack)
    return outcome, lines


def check_ok_record(r, np, controller):
    assert r["status"] == "ok" and results.missing_fields(r) == []
    w, f = r["world"], r["figures"]
    assert w["np"] == np and len(w["hosts"]) == np and w["controller"] == controller
    assert w["nodes"] == 1 and w["devices_per_node"] == np
    for ep in r["epochs"]:  # equal shards every epoch (disjoint: tests/test_data.py)
        assert len(set(ep["shard_sizes"])) == 1
        assert sum(ep["shard_sizes"]) == ep["shard_sizes"][0] * np
    assert r["epochs"][-1]["train_loss"] < r["epochs"][0]["train_loss"]  # it learns
    for key in ("throughput_img_s", "step_time_mean_s", "step_time_p50_s", "step_time_p95_s"):
        assert f[key] > 0
    assert f["step_time_p50_s"] <= f["step_time_p95_s"]
    assert len(r["step_times_s"]) == f["timed_steps"] > 0
    assert len(f["peak_memory_bytes"]) == np and min(f["peak_memory_bytes"]) > 0
    assert f["lr_used"] == pytest.approx(r["config"]["lr"] * np)
    assert 0 <= f["test_accuracy"] <= 1
    m = r["manifest"]
    assert m["torch"] and m["python"] and m["os"] and m["hosts"] == w["hosts"]


def test_ddp_over_gloo_two_processes(stack, tmp_path, mnist_like):
    outcome, _ = run(stack, tmp_path, mnist_like, framework="ddp", backend="gloo")
    assert outcome.failed == 0 and len(outcome.records) == 1
    check_ok_record(outcome.records[0], 2, "gloo")
    # 1536 samples / 2 ranks / batch 32 = 24 steps per epoch, 2 epochs, 3 warm-up steps.
    assert outcome.records[0]["figures"]["timed_steps"] == 2 * 24 - 3


@requires_horovod
def test_horovod_over_gloo_two_processes(stack, tmp_path, mnist_like):
    outcome, lines = run(stack, tmp_path, mnist_like, framework="horovod", backend="gloo")
    assert outcome.failed == 0, "\n".join(lines[-20:])
    check_ok_record(outcome.records[0], 2, "gloo")


@requires_horovod
@requires_mpirun
def test_horovod_over_mpi_two_processes(stack, tmp_path, mnist_like):
    outcome, lines = run(stack, tmp_path, mnist_like, framework="horovod", backend="mpi")
    assert outcome.failed == 0, "\n".join(lines[-20:])
    check_ok_record(outcome.records[0], 2, "mpi")


def test_serial_baseline_and_sweep_speedup(stack, tmp_path, mnist_like):
    outcome, _ = run(stack, tmp_path, mnist_like, framework="ddp", np=[1, 2], epochs=1)
    assert [r["world"]["np"] for r in outcome.records] == [1, 2]
    from lab.report import summary
    rows = summary.rows(outcome.records)
    assert rows[0]["speedup"] == pytest.approx(1.0)
    expected = (outcome.records[1]["figures"]["throughput_img_s"]
                / outcome.records[0]["figures"]["throughput_img_s"])
    assert rows[1]["speedup"] == pytest.approx(expected)
    assert rows[1]["efficiency"] == pytest.approx(expected / 2)
    serial, _ = run(stack, tmp_path, mnist_like, framework="none", np=[1], epochs=1)
    assert serial.records[0]["world"]["controller"] == "none"


@pytest.mark.parametrize("framework,backend", [
    ("ddp", "gloo"), pytest.param("horovod", "gloo", marks=requires_horovod),
    pytest.param("horovod", "mpi", marks=[requires_horovod, requires_mpirun])])
def test_a_dying_rank_ends_the_job_with_its_rank_and_reason(stack, tmp_path, mnist_like,
                                                            framework, backend):
    # A good run first: it must survive the failure of the next one untouched.
    good, _ = run(stack, tmp_path, mnist_like, framework=framework, backend=backend, epochs=1,
                  run_id="r")
    assert good.failed == 0
    before = (tmp_path / "r" / results.RESULTS_FILE).read_text()
    t0 = time.monotonic()
    bad, lines = run(stack, tmp_path, mnist_like, framework=framework, backend=backend, epochs=2,
                     fault="1:5", run_id="r")
    elapsed = time.monotonic() - t0
    # The whole job (start-up included) ends within a bound, never at the 300 s timeout.
    assert bad.failed == 1 and elapsed < 45, f"took {elapsed:.0f} s"
    after = (tmp_path / "r" / results.RESULTS_FILE).read_text()
    assert after.startswith(before)
    failed = [r for r in bad.records if r["status"] == "failed"]
    assert len(failed) == 1 and results.missing_fields(failed[0]) == []
    err = failed[0]["error"]
    assert err["rank"] == 1 and "fault injected at step 5" in err["reason"]
    assert any("rank 1" in line and "fault injected" in line for line in lines)


@pytest.mark.skipif(TORCHVISION_MISSING is not None, reason=f"torchvision: {TORCHVISION_MISSING}")
def test_resnet50_on_mnist_shaped_data(stack, tmp_path, mnist_like):
    outcome, lines = run(stack, tmp_path, mnist_like, framework="ddp", model="resnet50",
                         epochs=1, batch_size=8, max_steps=3, warmup_steps=1)
    assert outcome.failed == 0, "\n".join(lines[-20:])
    r = outcome.records[0]
    assert r["config"]["model"] == "resnet50" and r["figures"]["timed_steps"] == 2
    assert r["figures"]["throughput_img_s"] > 0


def test_digits_and_synthetic_need_no_network(stack, tmp_path, no_network_mirrors):
    outcome, lines = run(stack, tmp_path, None, framework="ddp", data="digits", np=[1],
                         epochs=10, batch_size=32, data_dir=str(tmp_path / "nodata"))
    assert outcome.failed == 0, "\n".join(lines[-20:])
    assert outcome.records[0]["figures"]["test_accuracy"] > 0.5  # real digits are learnable
    synth, lines = run(stack, tmp_path, None, framework="ddp", data="synthetic", np=[1], epochs=1,
                       max_steps=10, data_dir=str(tmp_path / "nodata"))
    assert synth.failed == 0
    said = "\n".join(lines)
    assert "test accuracy n/a (synthetic data)" in said and "accuracy n/a (synthetic data);" in said


def test_mnist_without_network_is_one_sentence(tmp_path, no_network_mirrors):
    cp = subprocess.run([sys.executable, "-m", "invoke", "bench", "--local", "--np", "1", "--framework", "ddp",
                         "--data", "mnist", "--data-dir", str(tmp_path / "empty"),
                         "--results-dir", str(tmp_path / "res")],
                        capture_output=True, text=True, timeout=300)
    assert cp.returncode == 2
    assert "--data synthetic" in cp.stderr and "--data-dir" in cp.stderr
    assert "Traceback" not in cp.stderr + cp.stdout


def test_invoke_bench_prints_the_table(tmp_path, mnist_like):
    cp = subprocess.run([sys.executable, "-m", "invoke", "bench", "--local", "--np", "2", "--framework", "ddp",
                         "--data", "mnist", "--data-dir", str(mnist_like), "--batch-size", "32",
                         "--results-dir", str(tmp_path)],
                        capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0, cp.stderr
    header = next(line for line in cp.stdout.splitlines() if "back end" in line)
    for col in ("back end", "servers", "devices per server", "time per step", "throughput",
                "speedup", "efficiency", "accuracy"):
        assert col in header
    recs, _ = results.read_records(next(tmp_path.glob("*/results.jsonl")))
    assert len(recs) == 1 and recs[0]["world"]["np"] == 2


def test_ceiling_is_measured_around_each_run_on_its_own_input(stack, tmp_path, mnist_like, short_ceiling):
    """Each run gets the ceiling measured around it, in its own record (two repeats at the
    same np are two ceilings, not one keyed by np), measured on the input the run trains
    on: MNIST's 1x28x28 with 10 classes. Each of the four measurements times 5 steps:
    how long a ceiling is timed (its own rule, tests/test_gpu_records.py) is not what this
    checks, and at MNIST's 200 steps and 10 s at least it would be most of its time."""
    outcome, _ = run(stack, tmp_path, mnist_like, framework="ddp", np=[2], epochs=1, ceiling=True,
                     repeat=2, max_steps=6)
    ok = [r for r in outcome.records if r["status"] == "ok"]
    assert [r["config"]["repeat"] for r in ok] == [0, 1]
    for r in ok:
        c = r["figures"]["ceiling"]
        assert c["processes"] == 2 and c["before"] > 0 and c["after"] > 0
        assert c["images_per_s"] == pytest.approx((c["before"] + c["after"]) / 2)
        assert c["input"] == [1, 28, 28] and c["classes"] == 10
    assert ok[0]["figures"]["ceiling"] is not ok[1]["figures"]["ceiling"]
    text = render(outcome.records, outcome.run_dir)
    lines = [line for line in text.splitlines() if "of the compute ceiling" in line]
    assert len(lines) == 2 and "repeat 2" in lines[1] and "on 1x28x28 input, 10 classes" in lines[0]


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_ctrl_c_records_the_interruption_and_leaves_no_rank(tmp_path, how):
    """Ctrl-C (SIGINT to the foreground group) and `kill PID` (SIGTERM to bench alone)
    both stop the ranks and record why."""
    import signal
    proc = subprocess.Popen(
        [sys.executable, "-m", "invoke", "bench", "--local", "--np", "1,2", "--framework", "ddp",
         "--max-steps", "5000", "--results-dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        # A background shell may have left SIGINT ignored; a terminal's Ctrl-C is not.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        for line in proc.stdout:  # wait until the first run's ranks are training
            if "== ddp over gloo, 1 process" in line:
                break
        assert training(str(tmp_path / "*"), 0), "rank 0 never reached its steps"
        assert processes_with("--attempt 000-ddp-gloo-none-n1-np1"), "the check below would see no rank at all"
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends to the foreground group
        else:
            proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == (130 if how == "ctrl-c" else 143), out[-2000:]
    word = "interrupted" if how == "ctrl-c" else "stopped (SIGTERM)"
    assert word in out and "Traceback (most recent call last)" not in out.split(word)[-1]
    recs, _ = results.read_records(next(tmp_path.glob("*/results.jsonl")))
    assert [r["status"] for r in recs] == ["failed"]
    assert recs[0]["error"]["reason"] == ("interrupted by the user" if how == "ctrl-c" else
                                          "stopped by SIGTERM") and recs[0]["world"]["np"] == 1
    run_id = recs[0]["run_id"]
    assert processes_left(run_id) == [], "ranks left running after Ctrl-C"


def training(run_dirs: str, rank: int, within_s: float = 120) -> bool:
    """Wait until `rank`'s heartbeat (in any run folder `run_dirs` matches, a glob) says it
    is in its warm-up or timed steps: started, rendezvous done, training."""
    import glob

    from lab.common import heartbeat
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        for path in glob.glob(os.path.join(run_dirs, "heartbeats", "*", f"rank-{rank}.json")):
            b = heartbeat.read(path)
            if b and b.get("phase") in ("warm-up", "step"):
                return True
        time.sleep(0.1)
    return False


def processes_with(text):
    """Command lines of live processes that contain `text` (read from /proc)."""
    import glob
    found = []
    for path in glob.glob("/proc/[0-9]*/cmdline"):
        if path == f"/proc/{os.getpid()}/cmdline":
            continue
        try:
            with open(path, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            found.append(cmd)
    return found


def processes_left(text, within_s=10.0):
    """The processes with `text` still alive `within_s` after a job ended (none, when it
    ended whole): a launcher's wrapper shell may still be exiting as bench returns (seen:
    horovodrun's `/bin/sh -c env ... lab.worker.train` of a SIGSTOPped rank); one left
    that long is left for good."""
    deadline = time.monotonic() + within_s
    while (found := processes_with(text)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


RANK_VARS = ("RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK")


def _kill_job(run_id: str) -> None:
    """Whatever of a job with this run id is left (its launcher runs in a session of
    its own, so a test that gives up on bench must end it itself)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if run_id.encode() in f.read():
                    os.kill(int(pid), 9)
        except OSError:
            continue


def _rank_pid(run_id: str, rank: int):
    """The Python process of `rank` of the job with this run id, found in /proc."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
            # The rank itself: python [-u] -m lab.worker.train, not its launcher or a shell.
            if ("lab.worker.train" not in args or run_id not in args
                    or not os.path.basename(args[0]).startswith("python")
                    or any(a in ("torch.distributed.run", "-c", "lab.host.launchers.local",
                                 "lab.host.launchers.horovod") or a.endswith("horovodrun")
                           for a in args)):
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split("=", 1) for kv in f.read().decode(errors="replace").split("\0")
                           if "=" in kv)
        except OSError:
            continue
        if any(env.get(v) == str(rank) for v in RANK_VARS):
            return int(pid)
    return None


@pytest.mark.parametrize("framework,backend", [
    ("ddp", "gloo"),
    pytest.param("horovod", "gloo", marks=requires_horovod),
    pytest.param("horovod", "mpi", marks=[requires_horovod, requires_mpirun]),
])
def test_a_rank_killed_from_outside_is_named_with_its_signal(tmp_path, framework, backend):
    """SIGKILL to rank 1's process, as the out-of-memory killer sends: the job ends
    within 10 s, the record names rank 1 and signal 9, the earlier record is untouched."""
    import signal as sig
    import uuid
    run_id = f"kill-{framework}-{backend}-{uuid.uuid4().hex[:6]}"
    base = [sys.executable, "-m", "invoke", "bench", "--local", "--np", "2", "--framework", framework,
            "--backend", backend, "--results-dir", str(tmp_path), "--run-id", run_id]
    first = subprocess.run([*base, "--max-steps", "10"], capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr
    rfile = tmp_path / run_id / results.RESULTS_FILE
    before = rfile.read_bytes()
    proc = subprocess.Popen([*base, "--max-steps", "100000"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        pid = None
        for _ in range(240):
            pid = _rank_pid(run_id, 1)
            if pid:
                break
            time.sleep(0.25)
        assert pid, "rank 1 never started"
        assert training(str(tmp_path / run_id), 1), "rank 1 never reached its steps"   # into training
        os.kill(pid, sig.SIGKILL)
        killed = time.monotonic()
        out, _ = proc.communicate(timeout=60)
        took = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, sig.SIGKILL)
        _kill_job(run_id)
    assert proc.returncode == 1, out[-3000:]
    # Ends in 1-2 s; without its handling it would wait for the rendezvous (minutes).
    assert took < 20, f"the job took {took:.1f} s to end after the kill"
    data = rfile.read_bytes()
    assert data.startswith(before)
    failed = results.read_records(rfile)[0][-1]
    assert failed["status"] == "failed" and failed["error"]["rank"] == 1, failed["error"]
    assert failed["error"]["signal"] == 9
    assert "rank 1" in failed["error"]["reason"] and "signal 9 (SIGKILL)" in failed["error"]["reason"]
    assert "Traceback (most recent call last)" not in out


def test_more_ranks_than_cores_is_said_before_the_run_and_recorded(tmp_path):
    """`invoke bench --local --np N` with N x threads over this machine's cores: one line
    before the run, and the record carries world.cores and world.oversubscribed."""
    from lab.common.kit import cores
    n = cores() + 1
    cp = subprocess.run([sys.executable, "-m", "invoke", "bench", "--local", "--np", f"1,{n}", "--framework",
                         "ddp", "--max-steps", "8", "--warmup-steps", "2", "--results-dir", str(tmp_path)],
                        capture_output=True, text=True, timeout=600)
    assert cp.returncode == 0, cp.stdout[-2000:] + cp.stderr[-2000:]
    lines = [line for line in cp.stdout.splitlines() if line.startswith("oversubscribed:")]
    assert lines == [f"oversubscribed: {n} rank(s) x 1 thread(s) on this machine share {cores()} core(s); "
                     f"their time per step measures the scheduler as much as the training, and the "
                     f"report will not read this row as scaling (lower --np or --threads, or add nodes)"]
    assert cp.stdout.index("oversubscribed:") < cp.stdout.index(f"{n} process(es)")   # before it runs
    recs = {r["world"]["np"]: r for r in results.read_records(next(tmp_path.glob("*/results.jsonl")))[0]}
    assert recs[n]["world"]["oversubscribed"] is True and recs[n]["world"]["cores"] == cores()
    assert recs[1]["world"]["oversubscribed"] is False
