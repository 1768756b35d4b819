"""Slurm as a launcher, the pure parts: the batch script for each framework (checked by
bash itself), what scontrol and sinfo print (real output captured on the simulated
cluster, tests/fixtures/launchers/), srun's word on the rank that died, and the final
state added to the records the ranks wrote. The jobs themselves run for real in
tests/test_cluster.py."""
import subprocess
from pathlib import Path

import pytest

from lab.common import results
from lab.host.places.slurm import script as slurm
from lab.host.watch.launcher_output import LauncherWatch

FIXTURES = Path(__file__).parent / "fixtures" / "launchers"


def script(**kw) -> str:
    job = dict(framework="ddp", backend="gloo", np=4, nodes=2, worker_args=["--max-steps", "5"])
    job.update(kw)
    return slurm.job_script(slurm.SlurmJob(**job))


def bash_ok(text: str, tmp_path) -> None:
    path = tmp_path / "job.sbatch"
    path.write_text(text)
    cp = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert cp.returncode == 0, cp.stderr


def sbatch_options(text: str) -> dict:
    opts = [line.split(" ", 1)[1].lstrip("-") for line in text.splitlines()
            if line.startswith("#SBATCH ")]
    return dict((o.split("=", 1) + [""])[:2] for o in opts)


def test_ddp_is_one_torchrun_per_node_at_a_c10d_rendezvous(tmp_path):
    text = script(time_limit_s=3600, env={"OMP_NUM_THREADS": "1"})
    bash_ok(text, tmp_path)
    opts = sbatch_options(text)
    assert opts["nodes"] == "2" and opts["ntasks-per-node"] == "1" and opts["cpus-per-task"] == "2"
    assert opts["time"] == "1:00:00" and "no-requeue" in text
    body = text.replace(" \\\n    ", " ")
    # srun is given the CPUs itself (Slurm 22.05-23.02 do not pass sbatch's on)
    assert "srun --ntasks-per-node=1 --cpus-per-task=2 --kill-on-bad-exit=1 python -m " \
           "torch.distributed.run --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d" in body
    assert '--rdzv-endpoint="${hosts[0]}:$((29500 + SLURM_JOB_ID % 500))"' in body
    assert "export OMP_NUM_THREADS=1" in body
    # the endpoint as bash computes it for job 1234 on node1
    out = subprocess.run(["bash", "-c", 'hosts=(node1 node2); SLURM_JOB_ID=1234; '
                          'echo "${hosts[0]}:$((29500 + SLURM_JOB_ID % 500))"'],
                         capture_output=True, text=True).stdout
    assert out.strip() == "node1:29734"
    assert body.rstrip().endswith("-m lab.worker.train --max-steps 5")


def test_horovod_over_mpi_is_one_srun_task_per_rank_with_pmix(tmp_path):
    text = script(framework="horovod", backend="mpi")
    bash_ok(text, tmp_path)
    opts = sbatch_options(text)
    assert opts["ntasks-per-node"] == "2" and opts["cpus-per-task"] == "1" and "time" not in opts
    assert "srun --mpi=pmix --kill-on-bad-exit=1 python -m lab.worker.train" in text


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_horovod_over_gloo_gets_its_hosts_from_the_allocation(backend, tmp_path):
    text = script(framework="horovod", backend=backend)
    bash_ok(text, tmp_path)
    body = text.replace(" \\\n    ", " ")
    assert 'horovodrun -np 4 -H "${slots%,}" --gloo python -m lab.worker.train' in body
    # what the script computes for -H, run by bash with a node list as scontrol prints it
    hosts = "node1 node2"
    out = subprocess.run(["bash", "-c", f'hosts=({hosts}); printf "%s:2," "${{hosts[@]}}" | sed "s/,$//"'],
                         capture_output=True, text=True).stdout
    assert out == "node1:2,node2:2"
    assert [line for line in text.splitlines() if line.startswith("slots=")] == \
        ['slots=$(printf "%s:2," "${hosts[@]}")']


def test_max_restarts_retries_the_failed_step_with_the_ranks_restart_flag(tmp_path):
    """The script of --max-restarts 2, run by bash with srun and scontrol stood in for: a
    step that fails is run again with --restart 1 under relaunch 1's launch name, and
    the job's exit status is its last step's; a step that succeeds ends the retries."""
    args = ["--max-steps", "40", "--checkpoint-every", "10", "--attempt", "000-job"]
    text = script(framework="horovod", backend="mpi", worker_args=args, retries=2)
    bash_ok(text, tmp_path)
    assert script(framework="horovod", backend="mpi", worker_args=args).count("--attempt 000-job") == 1
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "scontrol").write_text("#!/bin/sh\necho node1 node2\n")
    # srun: its arguments to calls.txt, failing the first `fails` calls
    (bin_ / "srun").write_text('#!/bin/bash\necho "$*" >> "$CALLS"\n'
                               'n=$(wc -l < "$CALLS"); [ "$n" -gt "$FAILS" ] || exit 3\n')
    for stub in bin_.iterdir():
        stub.chmod(0o755)
    for fails, rc, runs in ((1, 0, 2), (0, 0, 1), (5, 3, 3)):
        calls = tmp_path / f"calls-{fails}.txt"
        cp = subprocess.run(["bash", "-c", text], capture_output=True, text=True, env={
            "PATH": f"{bin_}:/usr/bin:/bin", "CALLS": str(calls), "FAILS": str(fails),
            "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-2]"})
        assert cp.returncode == rc, cp.stdout + cp.stderr
        made = calls.read_text().splitlines()
        assert len(made) == runs
        for n, line in enumerate(made):
            name = "000-job" if n == 0 else f"000-job-restart{n}"
            assert line.endswith(f"--checkpoint-every 10 --attempt {name} --restart {n}"), line
        if fails:
            assert "lab: the job step failed (exit code 3): retrying it (1 of at most 2)" in cp.stdout
    # DDP's step: each retry's torchrun a rendezvous of its own (the id), not the ended one's
    ddp = script(framework="ddp", backend="gloo", worker_args=args, retries=2)
    bash_ok(ddp, tmp_path)
    assert '--rdzv-id="$SLURM_JOB_ID-$restart"' in ddp and '--rdzv-id="$SLURM_JOB_ID" ' not in ddp
    assert '--rdzv-id="$SLURM_JOB_ID"' in script(framework="ddp", backend="gloo", worker_args=args)


def test_options_of_a_real_cluster(tmp_path):
    text = script(partition="gpu", gpus_per_node=4, container="pyxis:nvcr.io#me/lab:1",
                  mounts=["/scratch/results"], time_limit_s=90)
    bash_ok(text, tmp_path)
    opts = sbatch_options(text)
    assert opts["partition"] == "gpu" and opts["gres"] == "gpu:4" and opts["time"] == "2:00"
    assert "--container-image=nvcr.io#me/lab:1" in text
    assert "--container-mounts=/scratch/results:/scratch/results" in text
    app = script(framework="horovod", backend="mpi", container="apptainer:/shared/lab.sif",
                 gpus_per_node=1, mounts=["/scratch"])
    assert "apptainer exec --nv --bind /scratch /shared/lab.sif python -m lab.worker.train" in \
        app.replace(" \\\n    ", " ")
    venv = script(container="venv:/shared/venv")
    assert "source /shared/venv/bin/activate" in venv


@pytest.mark.parametrize("kw,words", [
    (dict(np=3), "does not spread evenly"),
    (dict(framework="none"), "distributed framework"),
    (dict(framework="horovod", backend="gloo", container="pyxis:img"), "pyxis"),
    (dict(container="docker:img"), "pyxis:IMAGE, apptainer:FILE.sif or venv:DIR"),
])
def test_what_a_script_cannot_do_is_one_sentence(kw, words):
    with pytest.raises(slurm.SlurmError, match=words):
        script(**kw)


def test_time_limits_are_whole_minutes_rounded_up():
    assert [slurm.time_limit(s) for s in (0, 1, 60, 61, 3600, 5400)] == \
        [None, "1:00", "1:00", "2:00", "1:00:00", "1:30:00"]


def test_what_scontrol_and_sbatch_print():
    info = slurm.job_fields((FIXTURES / "scontrol-show-job-failed.txt").read_text())
    assert info["JobId"] == "9" and info["JobState"] == "FAILED"
    assert info["Reason"] == "NonZeroExitCode" and info["ExitCode"] == "143:0"
    assert info["NodeList"] == "node[1-2]" and slurm.is_final(info["JobState"])
    assert not slurm.is_final("RUNNING") and not slurm.is_final("")
    assert slurm.job_id_of("12\n") == "12" and slurm.job_id_of("13;lab\n") == "13"
    assert slurm.job_id_of("sbatch: warning: can't honor --ntasks-per-node\n14\nsbatch: note\n") == "14"
    with pytest.raises(slurm.SlurmError, match="did not print a job id"):
        slurm.job_id_of("sbatch: error: Batch job submission failed")
    assert slurm.state_sentence("9", info, []) == \
        "Slurm job 9 ended FAILED (exit code 143:0, as exit:signal), reason NonZeroExitCode"


@pytest.mark.parametrize("answers,stopped,named", [
    # node1's sinfo failed, then answered (the controller busy under load)
    ([(1, ""), (0, "node1 idle\nnode2 down*\n")], set(), ["node2"]),
    # sinfo never named a node: the one whose container stopped is named
    ([(0, "node1 idle\nnode2 idle\n")] * 5, {"node2"}, ["node2"]),
    # neither: none named (the record then says Slurm's own node list)
    ([(0, "node1 idle\nnode2 idle\n")] * 5, set(), []),
])
def test_a_node_fail_names_the_failed_node_when_sinfo_is_slow_to_say(monkeypatch, answers, stopped, named):
    """CI, 2026-11-28: a job whose node2 was killed ended NODE_FAIL and its record named
    "node[1-2]" and no node, node1's one sinfo having shown none down."""
    from lab.host.places.slurm.runner import SlurmClusterRunner

    class Node:
        def __init__(self, name):
            self.name, self.status = name, "running"

        def reload(self):
            self.status = "exited" if self.name in stopped else "running"
    runner = object.__new__(SlurmClusterRunner)
    runner.found = {n: Node(n) for n in ("node1", "node2")}
    runner.POLL_S = 0
    sinfo = iter(answers)

    def on_node1(cmd, timeout=30):
        if cmd[:3] == ["scontrol", "show", "hostnames"]:
            return 0, "node1\nnode2\n"
        return next(sinfo)
    monkeypatch.setattr(runner, "_on_node1", on_node1)
    assert runner._failed_nodes("node[1-2]") == named


def test_a_lost_node_and_a_request_that_never_fits():
    # sinfo -h -N -o '%N %T' while node2 was down after `docker kill` (simulated cluster)
    sinfo = "node1 idle\nnode2 down*\nnode3 idle*\n"
    assert slurm.down_nodes(sinfo, ["node1", "node2"]) == ["node2"]
    assert slurm.down_nodes(sinfo, ["node1", "node3"]) == ["node3"]
    info = {"JobState": "NODE_FAIL", "Reason": "NodeDown", "ExitCode": "0:15", "NodeList": "node[1-2]"}
    assert slurm.state_sentence("5", info, ["node2"]) == \
        "Slurm job 5 ended NODE_FAIL: node node2 stopped responding during the run"
    pending = {"JobState": "PENDING", "Reason": "PartitionConfig", "NumTasks": "6"}
    assert slurm.never_runs(pending) and not slurm.never_runs({**pending, "Reason": "Resources"})
    # limits that clear by themselves when other jobs end are waited out
    for reason in ("QOSJobLimit", "AssocMaxJobsLimit", "PartitionNodeLimit", "Priority"):
        assert not slurm.never_runs({**pending, "Reason": reason})
    assert "cannot run job 8 as asked" in slurm.state_sentence("8", pending, [])


def test_srun_task_lines():
    from lab.host.watch.failures import srun_task_end
    assert srun_task_end(3, "n2", "Out Of Memory").signal == 9
    w = LauncherWatch(lambda s: None, srun_tasks_are_ranks=True)
    for line in ["srun: error: node2: tasks 2-3: Exited with exit code 7",
                 "srun: error: node1: tasks 0-1: Terminated"]:
        w.line(line)
    w.close()
    assert (w.first.rank, w.first.host, w.first.exit_code) == (2, "node2", 7)


def test_no_value_of_the_user_is_run_by_the_script(tmp_path):
    """Every word but the kit's own expansions is quoted: a worker argument that looks
    like an expansion stays a string, and a run id is checked before any script."""
    text = script(worker_args=["--run-id", '"$(touch /tmp/x)"'])
    assert """'"$(touch /tmp/x)"'""" in text
    bash_ok(text, tmp_path)
    cp = invoke_sbatch("--np", "2", "--nodes", "2", "--run-id", '"$(touch x)"')
    assert cp.returncode == 2 and "--run-id names a folder" in cp.stderr and cp.stdout == ""
    cp = invoke_sbatch("--np", "2", "--nodes", "2", "--output", str(tmp_path / "no" / "such" / "f"))
    assert cp.returncode == 2 and "cannot be written" in cp.stderr and "Traceback" not in cp.stderr


def test_srun_names_the_rank_that_died_first():
    # Horovod over MPI under Slurm, rank 1 SIGKILLed itself (--fault 1:5:kill); srun
    # then ended rank 0 (Terminated): the job's output file, captured on the cluster.
    lines = (FIXTURES / "srun-horovod-mpi-rank1-sigkill.txt").read_text().splitlines()
    w = LauncherWatch(lambda s: None, srun_tasks_are_ranks=True)
    for line in lines:
        w.line(line)
    w.close()
    assert (w.first.rank, w.first.host, w.first.signal) == (1, "node2", 9)
    # under DDP a task is a node's torchrun, not a rank: srun's lines are not read
    w = LauncherWatch(lambda s: None)
    for line in lines:
        w.line(line)
    w.close()
    assert w.first is None or w.first.host != "node2" or w.first.rank != 1 or w.first.signal != 9


def test_the_final_state_is_added_to_the_records_of_that_job(tmp_path):
    from lab.host.run.records import add_scheduler_state
    rfile = tmp_path / results.RESULTS_FILE
    common = dict(run_id="r", config={}, np=2, nodes=2, started_at=results.now_iso(),
                  figures={"throughput_img_s": 1.0})
    results.append_record(rfile, results.make_record("ok", **common, world={"hosts": ["a", "b"]}))
    for job in ("7", "8"):
        results.append_record(rfile, results.make_record(
            "ok", **common, world={"scheduler": {"name": "slurm", "job_id": job}}))
    with open(rfile, "a") as f:
        f.write("{torn line\n")
    add_scheduler_state(rfile, 1, {"job_id": "8", "state": "COMPLETED", "exit_code": "0:0"})
    recs, bad = results.read_records(rfile)
    assert len(recs) == 3 and bad
    assert "scheduler" not in recs[0]["world"]
    assert recs[1]["world"]["scheduler"] == {"name": "slurm", "job_id": "7"}
    assert recs[2]["world"]["scheduler"] == {"name": "slurm", "job_id": "8", "state": "COMPLETED",
                                             "exit_code": "0:0"}
    assert "{torn line" in rfile.read_text()


def invoke_sbatch(*args):
    import sys
    return subprocess.run([sys.executable, "-m", "invoke", "sbatch", *args],
                          cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True,
                          timeout=120)


def test_invoke_sbatch_writes_a_script_for_a_real_cluster(tmp_path):
    cp = invoke_sbatch("--nodes", "2", "--np", "8", "--device", "cuda", "--backend", "nccl",
                       "--partition", "gpu", "--container", "pyxis:nvcr.io#me/lab:1",
                       "--results-dir", "/scratch/results", "--data-dir", "/scratch/data",
                       "--run-id", "demo", "--timeout-s", "1800", "--output", str(tmp_path / "job.sbatch"))
    assert cp.returncode == 0, cp.stderr
    assert "--framework auto is DDP" in cp.stderr and "sbatch " in cp.stderr
    text = (tmp_path / "job.sbatch").read_text()
    bash_ok(text, tmp_path)
    opts = sbatch_options(text)
    assert opts["partition"] == "gpu" and opts["gres"] == "gpu:4" and opts["time"] == "30:00"
    assert opts["output"] == "lab-demo-%j.out" and opts["ntasks-per-node"] == "1"
    body = text.replace(" \\\n    ", " ")
    assert "--nproc-per-node=4" in body and "--backend nccl --device cuda" in body
    assert "--results-dir /scratch/results --run-id demo --expected-np 8" in body
    relative = invoke_sbatch("--nodes", "2", "--np", "2", "--results-dir", "res", "--data-dir", "dat")
    assert f"--results-dir {tmp_path.parent}" not in relative.stdout       # sanity of the check below
    import os
    assert f"--results-dir {os.path.abspath(Path(__file__).resolve().parent.parent / 'res')}" in \
        relative.stdout.replace(" \\\n    ", " ")      # absolute: a container starts elsewhere
    assert "--container-mounts=/scratch/data:/scratch/data,/scratch/results:/scratch/results" in body
    assert "--launched-at" not in body       # bench's own clock, not a submitted job's


@pytest.mark.parametrize("args,words", [
    (["--np", "1,2"], "one process count"),
    (["--np", "2", "--backend", "gloo,mpi"], "runs one combination: give --backend one value"),
    (["--np", "3", "--nodes", "2"], "does not spread evenly"),
    (["--np", "3", "--nodes", "2", "--device", "cuda"], "does not spread evenly"),   # GPUs per node
    (["--np", "2", "--nodes", "2", "--framework", "horovod", "--container", "pyxis:x"], "pyxis"),
    (["--np", "2", "--nodes", "2", "--container", "kubernetes:x"], "--container takes"),
    (["--np", "2", "--nodes", "2", "--gpus-per-node", "two"], "whole number"),
    (["--np", "2", "--device", "cuda", "--backend", "nccl", "--gpus-per-node", "1"],
     "puts 2 ranks on each node, each needing a GPU of its own, and --gpus-per-node is 1"),
    (["--np", "2", "--gpus-per-node", "1"], "--gpus-per-node is for --device cuda"),
    (["--np", "2", "--max-steps", "4"], "--warmup-steps 5 leaves none to time"),
    (["--np", "2", "--max-restarts", "-1"], "--max-restarts counts retries: 0 or more, not -1"),
])
def test_invoke_sbatch_bad_input_is_one_sentence(args, words):
    cp = invoke_sbatch(*args)
    assert cp.returncode == 2 and "Traceback" not in cp.stderr, cp.stderr
    assert words in cp.stderr and cp.stdout == ""


def test_the_wall_time_is_asked_for_only_with_timeout_s():
    """bench's per-run default (invoke.yaml's timeout_s, one hour) is not the cluster's wall
    time: without --timeout-s the partition's own limit applies (no --time line)."""
    plain = invoke_sbatch("--np", "2", "--nodes", "2")
    assert plain.returncode == 0, plain.stderr
    assert "time" not in sbatch_options(plain.stdout)
    timed = invoke_sbatch("--np", "2", "--nodes", "2", "--timeout-s", "5400")
    assert sbatch_options(timed.stdout)["time"] == "1:30:00"


def test_the_readmes_script_is_what_invoke_sbatch_writes(tmp_path):
    """The README shows the script of its `invoke sbatch` example: the same bytes."""
    import re
    page = (Path(__file__).resolve().parent.parent / "docs" / "pages" / "slurm.md").read_text()
    cmd = re.search(r"```sh\n(invoke sbatch .*?)```", page, re.S).group(1)
    args = cmd.replace("\\\n", " ").split()[2:]
    args[args.index("--output") + 1] = str(tmp_path / "job.sbatch")
    cp = invoke_sbatch(*args)
    assert cp.returncode == 0, cp.stderr
    shown = re.search(r"writes, without submitting anything:\n\n```\n(.*?)```", page, re.S).group(1)
    assert (tmp_path / "job.sbatch").read_text() == shown


def test_invoke_sbatch_takes_the_seed_and_its_help_promises_no_sweep():
    cp = invoke_sbatch("--np", "2", "--seed", "7")
    assert cp.returncode == 0, cp.stderr
    assert "--seed 7" in cp.stdout
    helps = invoke_sbatch("--help").stdout
    assert "comma list" not in helps and "sweep" not in helps and "--seed" in helps


def test_each_rank_gets_its_threads_cpus_and_srun_is_given_them(tmp_path):
    """--threads T: a DDP node's task asks for its ranks x T CPUs, a Horovod-MPI rank's task
    for T, and srun is told itself (Slurm 22.05 to 23.02 do not pass sbatch's on)."""
    ddp = script(env={"OMP_NUM_THREADS": "4"}, threads=4).replace(" \\\n    ", " ")
    assert sbatch_options(ddp)["cpus-per-task"] == "8" and "srun --ntasks-per-node=1 --cpus-per-task=8 " in ddp
    mpi = script(framework="horovod", backend="mpi", threads=3).replace(" \\\n    ", " ")
    assert sbatch_options(mpi)["cpus-per-task"] == "3"
    assert "srun --mpi=pmix --cpus-per-task=3 --kill-on-bad-exit=1 python -m lab.worker.train" in mpi
    cp = invoke_sbatch("--np", "2", "--nodes", "2", "--threads", "4", "--results-dir", str(tmp_path),
                       "--data-dir", str(tmp_path))
    assert cp.returncode == 0 and sbatch_options(cp.stdout)["cpus-per-task"] == "4", cp.stderr
    assert "must see at the same path" not in cp.stderr
    assert "--results-dir results is a folder under " in invoke_sbatch("--np", "2").stderr
    mnist = invoke_sbatch("--np", "2", "--data", "mnist", "--data-dir", "d").stderr
    assert "--results-dir results and --data-dir d are folders under " in mnist


def test_bench_on_the_clusters_slurm_gives_each_rank_its_threads(tmp_path):
    """`bench --launcher slurm --threads 2` writes the script sbatch would: each rank gets
    its threads' CPUs (the runner made without an engine: only its script is looked at)."""
    from lab.common.config import RunConfig
    from lab.host.places.base import Launch
    from lab.host.places.slurm.runner import SlurmClusterRunner
    r = SlurmClusterRunner.__new__(SlurmClusterRunner)
    r.image = type("Img", (), {"id": "sha256:x", "labels": {}})()
    r.frozen, r.n, r.partition = True, 2, ""
    r.results_dir, r.results_in, r.run_dir = str(tmp_path), "/results", str(tmp_path / "run")
    cfg = RunConfig(framework="horovod", backend="mpi", threads=2)
    r.commands(Launch("horovod", "mpi", 4, tuple(cfg.to_args()), attempt="a", config=cfg))
    text = slurm.job_script(r._job)
    assert sbatch_options(text)["cpus-per-task"] == "2" and "srun --mpi=pmix --cpus-per-task=2 " in text
