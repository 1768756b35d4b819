"""What the launchers say about the rank that ended first, parsed from their real output
(tests/fixtures/launchers/, captured here: rank 1 of 2 killed with SIGKILL under each
launcher), and the launcher's own traceback condensed to its last line."""
from pathlib import Path

import pytest

from lab.host.watch.failures import RankEnd
from lab.host.watch.launcher_output import LauncherWatch

FIXTURES = Path(__file__).parent / "fixtures" / "launchers"


def watch_file(name):
    shown = []
    w = LauncherWatch(shown.append)
    for line in (FIXTURES / name).read_text().splitlines():
        w.line(line)
    w.close()
    return w, shown


@pytest.mark.parametrize("name,host", [
    ("torchrun-rank1-sigkill.txt", "localhost"),
    # torchrun named rank 0 (exit 1, its reaction) the root cause and listed the killed
    # rank 1 under Failures: the end of a record's log tail from a run of
    # tests/test_runs.py's kill test (2026-11-23)
    ("torchrun-rank1-sigkill-root-cause-rank0.txt", "localhost"),
    ("horovodrun-gloo-rank1-sigkill.txt", None),
    ("horovodrun-mpi-rank1-sigkill.txt", "vm"),
])
def test_the_rank_killed_first_and_how(name, host):
    w, _ = watch_file(name)
    assert w.first is not None and w.first.rank == 1 and w.first.signal == 9
    assert w.first.host == host
    assert w.first.how() == "was killed by signal 9 (SIGKILL)"


def test_a_rank_horovodrun_names_without_its_host_gets_the_host_of_its_heartbeat(tmp_path):
    """horovodrun over Gloo says "Process 1 exit with status code 137." and no host: the
    record's host is where rank 1's last heartbeat came from (node2 on the cluster)."""
    from lab.host.places.base import JobResult
    from lab.host.watch.failures import attribute_failure
    w, _ = watch_file("horovodrun-gloo-rank1-sigkill.txt")
    res = JobResult(1, [], "exited")
    beats = {0: {"rank": 0, "host": "node1"}, 1: {"rank": 1, "host": "node2"}}
    info, reason = attribute_failure(res, tmp_path / "none", {}, w.first, beats)
    assert (info["rank"], info["host"], info["signal"]) == (1, "node2", 9)
    assert reason == "rank 1 on node2 was killed by signal 9 (SIGKILL)"
    assert w.first.host is None                  # the launcher's own word is kept as it was
    info, _ = attribute_failure(res, tmp_path / "none", {}, w.first, {0: None, 1: None})
    assert info["host"] is None                  # no heartbeat: no host
    mpi, _ = watch_file("horovodrun-mpi-rank1-sigkill.txt")
    assert attribute_failure(res, tmp_path / "none", {}, mpi.first, beats)[0]["host"] == "vm"


def test_horovodruns_traceback_is_condensed_to_its_last_line():
    _, shown = watch_file("horovodrun-gloo-rank1-sigkill.txt")
    text = "\n".join(shown)
    assert "Traceback (most recent call last)" not in text and 'File "' not in text
    assert "(the launcher's traceback, condensed) RuntimeError: Horovod detected" in text
    assert "Process name: 1" in text and "[1]<stderr>:Killed" in text   # the rest is kept


def test_exit_codes_signals_and_cluster_prefixes():
    w = LauncherWatch(lambda line: None)
    for line in ["[node1] Process 0 exit with status code 1.",
                 "[node1] Process 1 exit with status code 143.",
                 "[node1] Traceback (most recent call last):",
                 '[node1]   File "x", line 1, in <module>',
                 "[node1] RuntimeError: Horovod detected that one or more processes exited ...",
                 "[node1] Process name: 0", "[node1] Exit code: 1"]:
        w.line(line)
    w.close()
    assert w.first == RankEnd(0, None, 1, None) and w.first.how() == "exited with code 1"
    shown = []
    w = LauncherWatch(shown.append)
    for line in ["  Process name: [[61734,1],3]", "  Exit code: 2", "Traceback (most recent call last):",
                 '  File "y"']:
        w.line(line)
    w.close()
    assert w.first == RankEnd(3, None, 2, None)
    assert shown[-1] == "(the launcher printed a traceback that ended without its exception line)"


def test_horovodrun_over_ssh_status_255_is_not_a_signal():
    """horovodrun over Gloo with rank 1 on node2 SIGKILLed, its lines as captured on the
    simulated cluster (2026-11-27, `invoke bench --nodes 2 --np 2 --framework horovod
    --backend gloo --fault 1:35:kill`): the rank's ssh said 255, ssh's own error status,
    which is not 128 + a signal (there is no signal 127); the shell's 128 + N still is."""
    w = LauncherWatch(lambda line: None)
    for line in ["Process 1 exit with status code 255.",
                 "Terminating remaining workers after failure of Process 1.",
                 "Process 0 exit with status code 1.",
                 "RuntimeError: Horovod detected that one or more processes exited with non-zero "
                 "status, thus causing the job to be terminated. The first process to do so was:",
                 "Process name: 1", "Exit code: 255"]:
        w.line(line)
    w.close()
    assert w.first == RankEnd(1, None, 255, None)
    assert w.first.how().startswith("exited with code 255 (over ssh: the remote command was killed")
    w = LauncherWatch(lambda line: None)
    for line in ["Process 1 exit with status code 137.", "Process name: 1", "Exit code: 137"]:
        w.line(line)
    w.close()
    assert (w.first.rank, w.first.signal) == (1, 9)
    # horovodrun printing the killed rank's peer first: ssh's 255 is still the cause
    w = LauncherWatch(lambda line: None)
    for line in ["Process 0 exit with status code 1.", "Process 1 exit with status code 255.",
                 "Process name: 0", "Exit code: 1"]:
        w.line(line)
    w.close()
    assert (w.first.rank, w.first.exit_code) == (1, 255)


def test_torchruns_failure_report_is_said_in_one_line_and_still_names_the_rank():
    """torchrun's report ("=" border, "<module> FAILED", its Failures and Root Cause blocks)
    is read, then shown as one line: under torchrun (captured), on the cluster's nodes
    (captured) and as the kit's local launcher writes it (its own writer)."""
    from lab.host.launchers import local as local_launcher
    from lab.host.watch.launcher_output import StreamWatches
    w, shown = watch_file("torchrun-rank1-sigkill.txt")
    text = "\n".join(shown)
    assert "Root Cause" not in text and "error_file" not in text and "=" * 60 not in text
    assert ("(the launcher's failure report, condensed) lab.worker.train ended abnormally; first observed: "
            "rank 1 on localhost was killed by signal 9 (SIGKILL); also rank 0 on localhost exited with "
            "code 1") in shown
    assert w.first == RankEnd(1, "localhost", None, 9)
    said = next(i for i, x in enumerate(shown) if "failure report, condensed" in x)
    assert shown[said + 1].startswith("!! run failed after 12.6 s")    # what follows is kept
    shown = []
    s = StreamWatches(shown.append)
    for line in (FIXTURES / "cluster-ddp-rank1-sigkill-node1-seen-first.txt").read_text().splitlines():
        s.line(line)
    s.close()
    said = [x for x in shown if "failure report, condensed" in x]
    assert said == ["[node1] (the launcher's failure report, condensed) lab.worker.train ended abnormally; "
                    "first observed: rank 0 on node1 exited with code 1",
                    "[node2] (the launcher's failure report, condensed) lab.worker.train ended abnormally; "
                    "first observed: rank 1 on node2 was killed by signal 9 (SIGKILL)"]
    assert s.first.rank == 1 and s.first.signal == 9 and not any("Root Cause" in x for x in shown)
    block = local_launcher.failure_block("lab.worker.train", (0, -15, 4242), [])
    shown = []
    w = LauncherWatch(shown.append)
    for line in ["!! stalled: no rank advanced for 10 s", *block.splitlines(), "!! run stalled"]:
        w.line(line)
    w.close()
    assert shown[0] == "!! stalled: no rank advanced for 10 s" and shown[-1] == "!! run stalled"
    assert len(shown) == 3 and shown[1].endswith("first observed: rank 0 on "
                                                 f"{w.first.host} was killed by signal 15 (SIGTERM)")


def test_a_border_that_opens_no_failure_report_and_a_report_cut_short_are_passed_on():
    shown = []
    w = LauncherWatch(shown.append)
    lines = ["=" * 60, "epoch 1/1: loss 0.3", "=" * 60, "lab.worker.train FAILED", "-" * 60, "Failures:"]
    for line in lines:
        w.line(line)
    w.close()
    assert shown == lines


def test_a_report_interrupted_by_other_output_is_passed_on_and_a_traceback_of_its_root_is_said():
    """Two torchruns' reports in one unprefixed output (a Slurm job's file), the first cut
    short by srun's line: nothing is lost, the second still said in one line; a root cause
    whose error file gave a call stack keeps that stack's last line."""
    from lab.host.launchers import local as local_launcher
    a = local_launcher.failure_block("lab.worker.train", (0, 1, 11), []).splitlines()
    b = local_launcher.failure_block("lab.worker.train", (1, -9, 12), []).splitlines()
    shown = []
    w = LauncherWatch(shown.append, srun_tasks_are_ranks=True)
    cut = a[:7] + ["srun: error: node2: task 1: Killed"] + b
    for line in cut:
        w.line(line)
    w.close()
    assert shown[:8] == cut[:8] and len(shown) == 9
    [host] = {x.split(": ", 1)[1].strip() for x in b if x.strip().startswith("host")}
    assert shown[8].endswith(f"first observed: rank 1 on {host} was killed by signal 9 (SIGKILL)")
    # interleaved line by line: the second's lines break the first's, and all are shown
    shown = []
    w = LauncherWatch(shown.append)
    mixed = [x for pair in zip(a, b) for x in pair]
    for line in mixed:
        w.line(line)
    w.close()
    assert sorted(shown) == sorted(mixed)
    # an error file's call stack, indented under the root cause's traceback field
    stack = ["  traceback : Traceback (most recent call last):", '    File "train.py", line 9, in <module>',
             "      main()", "    RuntimeError: CUDA error: out of memory"]
    report = [x for x in a if "traceback :" not in x]
    report[-1:-1] = stack
    shown = []
    w = LauncherWatch(shown.append)
    for line in report:
        w.line(line)
    w.close()
    assert len(shown) == 1 and shown[0].endswith("exited with code 1; its traceback ends: RuntimeError: CUDA "
                                                 "error: out of memory")
