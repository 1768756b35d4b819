"""The one job loop (lab.host.places.jobs) with real processes, and the failure watch per
stream (lab.host.watch.launcher_output.StreamWatches) on real launcher output read as two nodes
printing at once."""
import sys
import time
from pathlib import Path

from lab.common import proc
from lab.host.places import jobs
from lab.host.watch.launcher_output import LauncherWatch, StreamWatches

FIXTURES = Path(__file__).parent / "fixtures" / "launchers"


def shell(script):
    return [sys.executable, "-c", script]


def run_job(scripts: dict, timeout_s=60):
    shown = []
    job = jobs.Job(list(scripts), shown.append)

    def start(host, out):
        return jobs.ProcessPart(host, proc.start(shell(scripts[host]), echo=out, keep_output=False))

    def stop_all():
        for part in job.parts.values():
            part.process.stop(grace=1)
    return job.run(start, timeout_s, stop_all, poll_s=0.05), shown


def test_the_exit_status_is_the_first_failure_not_the_peers_killed_after_it():
    """node2 fails with 1; node1 would run on and is stopped (killed by TERM: -15). The
    job's status is 1, the failure's own (max by absolute value would say -15)."""
    t0 = time.monotonic()
    o, shown = run_job({"node1": "import time; print('up', flush=True); time.sleep(60)",
                        "node2": "import sys, time; time.sleep(0.5); sys.exit(1)"})
    assert o.returncode == 1 and o.first_failed == "node2" and o.why == "node2's launcher failed"
    assert time.monotonic() - t0 < 20
    assert "[node1] up" in shown and "[node1] up" in o.tail


def test_the_earlier_of_two_failures_wins():
    o, _ = run_job({"node1": "import sys, time; time.sleep(1.5); sys.exit(7)",
                    "node2": "import sys, time; time.sleep(0.2); sys.exit(3)"})
    assert o.returncode == 3 and o.first_failed == "node2"


def test_all_parts_exiting_normally_and_the_time_limit():
    o, shown = run_job({"a": "print('one')", "b": "print('two')"})
    assert (o.returncode, o.why) == (0, "exited") and sorted(shown) == ["[a] one", "[b] two"]
    o, _ = run_job({"a": "import time; time.sleep(60)"}, timeout_s=1)
    assert o.returncode is None and o.why.startswith("did not finish within 1 s")


def lines(name, host):
    return [f"[{host}] {line}" for line in (FIXTURES / name).read_text().splitlines()]


def first_alone(stream):
    w = LauncherWatch(lambda line: None)
    for line in stream:
        w.line(line)
    w.close()
    return w.first


def test_failure_blocks_of_two_nodes_printed_at_once_are_read_apart():
    """Two launchers' output, line by line in turn (as two pump threads may deliver it):
    each stream is parsed on its own, so neither rank is blamed with the other's host,
    exit code or signal."""
    a = lines("horovodrun-mpi-rank1-sigkill.txt", "node1")
    b = lines("torchrun-rank1-sigkill-root-cause-rank0.txt", "node2")
    alone = [first_alone(a), first_alone(b)]
    assert alone[0] != alone[1] and None not in alone
    interleaved = [x for pair in zip(a, b) for x in pair] + a[len(b):] + b[len(a):]
    watches = StreamWatches(lambda line: None)
    for line in interleaved:
        watches.line(line)
    watches.close()
    assert sorted(watches.ends, key=alone.index) == alone
    assert watches.first in alone


def test_a_watch_per_stream_sees_what_one_stream_alone_says():
    w = StreamWatches(lambda line: None)
    for line in lines("torchrun-rank1-sigkill.txt", "node2"):
        w.line(line)
    w.close()
    assert w.first == first_alone(lines("torchrun-rank1-sigkill.txt", "node2"))
    assert (w.first.rank, w.first.signal) == (1, 9)


def test_a_rank_killed_on_one_node_is_the_cause_though_its_peer_is_seen_first():
    """DDP on the simulated cluster, rank 1 on node2 SIGKILLed (--fault 1:25:kill): node1's
    launcher printed its rank 0's exit 1 (a connection reset by the killed peer) before
    node2's printed the SIGKILL (bench's output, captured 2026-11-26). The signal is the
    cause, as inside one launcher's block."""
    w = StreamWatches(lambda line: None)
    for line in (FIXTURES / "cluster-ddp-rank1-sigkill-node1-seen-first.txt").read_text().splitlines():
        w.line(line)
    w.close()
    assert [(e.rank, e.host, e.signal) for e in w.ends] == [(0, "node1", None), (1, "node2", 9)]
    assert (w.first.rank, w.first.host, w.first.signal) == (1, "node2", 9)


def test_a_slurm_jobs_one_output_with_a_torchrun_per_node_blames_the_killed_rank():
    """A Slurm batch job's output file holds every node's torchrun in one stream (srun
    without --label): the same captured blocks as above, node1's exit 1 printed before
    node2's SIGKILL, read by one watch: the signal is still the cause (a watch keeps the
    rank to blame, not the first seen)."""
    text = (FIXTURES / "cluster-ddp-rank1-sigkill-node1-seen-first.txt").read_text()
    one = [line.split("] ", 1)[1] if line.startswith("[node") else line for line in text.splitlines()]
    w = first_alone(one)
    assert (w.rank, w.host, w.signal) == (1, "node2", 9)


def test_horovodrun_naming_the_killed_ranks_peer_first_still_blames_the_killed_rank():
    """horovodrun over Gloo with rank 1 SIGKILLed: its lines as captured (127.0.0.1,
    2026-11-27, `invoke bench --local --np 2 --framework horovod --backend gloo --fault
    1:15:kill`) in the order it prints them when rank 0's exit 1 (the connection reset)
    is seen first, as under load in a test run: rank 1's signal is the cause."""
    captured = [line for line in (FIXTURES / "horovodrun-gloo-rank1-sigkill.txt").read_text().splitlines()]
    assert "Process 1 exit with status code 137." in captured and "Process 0 exit with status code 1." in captured
    summary = next(line for line in captured if line.endswith("The first process to do so was:"))
    reordered = ["Process 0 exit with status code 1.", "Process 1 exit with status code 137.",
                 summary, "Process name: 0", "Exit code: 1"]
    w = LauncherWatch(lambda line: None)
    for line in reordered:
        w.line(line)
    w.close()
    assert (w.first.rank, w.first.signal) == (1, 9)


def launch_of(framework="ddp", np=1, attempt="000-x"):
    from lab.host.places.base import Launch
    return Launch(framework, "gloo", np, ("--max-steps", "not-a-number", "--run-id", "r", "--attempt", attempt),
                  (("OMP_NUM_THREADS", "1"),), 60, "r", attempt)


def test_the_local_runner_runs_what_its_commands_say(tmp_path):
    from lab.host.places.local import LocalRunner
    runner = LocalRunner(str(tmp_path), None)
    job = launch_of()
    cmds = runner.commands(job)
    res = runner.run(cmds, job.environment, 60, lambda line: None)
    assert res.returncode != 0                      # the worker refuses its argument
    assert runner.started == cmds


def test_the_hosts_runner_runs_what_its_commands_say_environment_included():
    """--hosts with DDP: one ssh per host carrying the job's environment; run() starts
    those very commands (the hosts do not exist, so each ssh fails at once)."""
    from lab.host.places.hosts import HostsRunner
    from lab.host.places.launch import parse_hosts
    runner = HostsRunner(parse_hosts("nohost-a.invalid:1,nohost-b.invalid:1"), "results", None)
    job = launch_of(np=2)
    cmds = runner.commands(job)
    assert list(cmds) == ["nohost-a.invalid", "nohost-b.invalid"]
    assert all("OMP_NUM_THREADS=1" in " ".join(c) for c in cmds.values())
    res = runner.run(cmds, job.environment, 60, lambda line: None)
    assert res.returncode not in (0, None) and runner.started == cmds
