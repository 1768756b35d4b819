"""`invoke bench --launcher k8s` (lab.host.places.k8s.runner): the runner through the official
`kubernetes` client, over real HTTP, against tests/k8s_fake_api.py, which serves objects
captured from real clusters (tests/fixtures/k8s/api/README.md names each source). The
record a successful job prints is a real worker record (tests/fixtures/example-report/)
written with lab.common.results' own writer and printed after RECORD_PREFIX, as the
manifest's command prints it, so the parse is tested end to end. Never a live cluster."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lab.common import results
from lab.common.config import parse_args
from lab.host import places
from lab.host.errors import BenchError
from lab.host.places.base import RunnerError
from lab.host.places.k8s import cluster as k8s_cluster
from lab.host.places.k8s import manifest as k8s
from lab.host.places.k8s import runner as k8s_runner
from lab.host.settings import BenchSettings
from tests.k8s_fake_api import FakeAPI, Scenario, captured, pod

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "tests" / "fixtures" / "example-report" / "results.jsonl"
IMAGE = "reg.example/lab/dl-lab-kit:cpu"


def worker_config(job: dict):
    """The RunConfig the created job's rank-0 command carries (after lab.worker.train)."""
    if job["kind"] == "MPIJob":
        cmd = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"]
    elif job["kind"] == "PyTorchJob":
        cmd = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["command"]
    else:
        cmd = job["spec"]["trainer"]["command"]
    script = cmd[2]
    argv = shlex.split(script[:script.index("; rc=$?")])
    return parse_args(argv[argv.index("lab.worker.train") + 1:])


def record_lines(job: dict, folder: Path) -> list[str]:
    """What the job's command prints after training: rank 0's results file, each line
    after RECORD_PREFIX. The record is a real worker record given this run's id and
    configuration, appended with results.append_record as a rank does."""
    cfg = worker_config(job)
    real = next(r for r in map(json.loads, EXAMPLE.read_text().splitlines())
                if r["status"] == "ok" and r["world"]["np"] == cfg.expected_np
                and r["config"]["framework"] == cfg.framework and r["config"]["backend"] == cfg.backend)
    real.update(run_id=cfg.run_id, config=cfg.as_record())
    rfile = folder / f"pod-{cfg.attempt}" / results.RESULTS_FILE    # each pod its own emptyDir
    rfile.parent.mkdir(parents=True, exist_ok=True)
    results.append_record(rfile, real)
    return [k8s.RECORD_PREFIX + line for line in rfile.read_text().splitlines()]


def mpijob_pods(status: dict, worker_status: dict | None = None):
    """The pods mpi-operator v0.8.0 makes for a job (its labels; the launcher Job's pod
    and worker 0), each with a captured status."""
    def pods(job):
        name = job["metadata"]["name"]
        out = [pod(f"{name}-worker-0", {k8s_cluster.JOB_NAME: name, k8s_cluster.JOB_ROLE: "worker"},
                   worker_status or status)]
        if worker_status is None:
            out.append(pod(f"{name}-launcher-x7k2p", {k8s_cluster.JOB_NAME: name,
                                                      k8s_cluster.JOB_ROLE: "launcher"}, status))
        return out
    return pods


RUNNING = captured("pod-running.yaml")["status"]


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """Start a fake API for a scenario and point KUBECONFIG at it."""
    apis = []

    def start(scenario: Scenario) -> FakeAPI:
        api = FakeAPI(scenario).__enter__()
        apis.append(api)
        monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig(tmp_path / "kubeconfig")))
        return api
    yield start
    for api in apis:
        api.__exit__(None, None, None)


def bench_run(tmp_path, api="auto", pending_s=30.0, **flags):
    from lab.host.run import bench
    s = BenchSettings(**{"np": [2], "framework": "horovod", "backend": "gloo", "data": "synthetic",
                         "epochs": 1, "batch_size": 8, "synthetic_size": 64, "warmup_steps": 1,
                         "results_dir": str(tmp_path / "results"), "launcher": "k8s", "stall_s": -1,
                         "timeout_s": 60, **flags})
    runner = k8s_runner.K8sRunner(s.nodes, "cpu", IMAGE, s.results_dir, s.data_dir, k8s_runner.Settings(
        opts=k8s.K8sOptions(api=api), pending_s=pending_s, poll_s=0.05, max_restarts=s.max_restarts))
    lines: list[str] = []
    outcome = bench.run(s, echo=lines.append, runner=runner)
    return outcome, lines


def test_a_job_that_succeeds_appends_the_record_it_printed(tmp_path, cluster):
    sc = Scenario(pods=mpijob_pods(RUNNING), log=lambda job: ["training ...", *record_lines(job, tmp_path)],
                  status=captured("mpijob-succeeded.yaml")["status"])
    cluster(sc)
    outcome, lines = bench_run(tmp_path)
    assert outcome.failed == 0 and len(outcome.records) == 1
    (job,) = sc.jobs.values()
    rec = outcome.records[0]
    cfg = worker_config(job)
    assert rec["status"] == "ok" and rec["run_id"] == cfg.run_id and rec["config"] == cfg.as_record()
    assert rec["config"]["framework"] == "horovod" and rec["world"]["np"] == 2
    assert Path(outcome.run_dir, results.RESULTS_FILE).read_text().count("\n") == 1
    name = job["metadata"]["name"]
    assert ("POST", "/apis/kubeflow.org/v2beta1/namespaces/default/mpijobs") in sc.requests
    assert ("GET", "/api/v1/namespaces/default/pods",
            {"labelSelector": f"training.kubeflow.org/job-name={name}"}) in sc.requests
    log = [r for r in sc.requests if r[1].endswith("/log")]
    assert log[0][1] == f"/api/v1/namespaces/default/pods/{name}-launcher-x7k2p/log"
    assert log[0][2]["follow"] == "true" and log[0][2]["container"] == "launcher"
    assert "training ..." in lines and not any(ln.startswith(k8s.RECORD_PREFIX) for ln in lines)
    assert any("ended: MPIJobSucceeded" in ln for ln in lines)
    assert sc.deleted == [name]             # the job is removed once it ended (names repeat)


def test_a_pytorchjob_streams_the_masters_log(tmp_path, cluster):
    """training-operator v1.9.0's pods: the Master (replica-type master) holds rank 0."""
    def pods(job):
        name = job["metadata"]["name"]
        return [pod(f"{name}-{t}-0", {k8s_cluster.JOB_NAME: name, k8s_cluster.REPLICA_TYPE: t}, RUNNING)
                for t in ("worker", "master")]
    sc = Scenario(pods=pods, log=lambda job: record_lines(job, tmp_path),
                  status=captured("pytorchjob-succeeded-status.yaml")["status"])
    cluster(sc)
    outcome, lines = bench_run(tmp_path, api="pytorchjob", framework="ddp", nodes=2)
    (job,) = sc.jobs.values()
    name = job["metadata"]["name"]
    assert ("POST", "/apis/kubeflow.org/v1/namespaces/default/pytorchjobs") in sc.requests
    (log,) = [r for r in sc.requests if r[1].endswith("/log")]
    assert log[1].endswith(f"/pods/{name}-master-0/log") and log[2]["container"] == "pytorch"
    assert outcome.failed == 0 and outcome.records[0]["config"]["framework"] == "ddp"
    assert any("ended: PyTorchJobSucceeded" in ln for ln in lines)


def test_what_the_k8s_runner_runs_is_its_commands(tmp_path, cluster):
    """commands(launch) is rank 0's command in the job's manifest; what run() started is
    that command as the API server stored the job it created."""
    from lab.common.config import RunConfig
    from lab.host.places.base import Launch
    sc = Scenario(pods=mpijob_pods(RUNNING), log=lambda job: record_lines(job, tmp_path),
                  status=captured("mpijob-succeeded.yaml")["status"])
    cluster(sc)
    runner = k8s_runner.K8sRunner(1, "cpu", IMAGE, str(tmp_path / "results"), None, k8s_runner.Settings(
        opts=k8s.K8sOptions(), poll_s=0.05))
    cfg = RunConfig(framework="horovod", results_dir=runner.results_in, run_id="cmds", expected_np=2,
                    attempt="000-horovod-gloo-none-n1-np2-r0")
    commands = runner.commands(Launch("horovod", "gloo", 2, tuple(cfg.to_args()), (), 60, "cmds",
                                      cfg.attempt, config=cfg))
    res = runner.run(commands, {}, 60, lambda line: None)
    (job,) = sc.jobs.values()
    assert res.returncode == 0 and list(commands) == [job["metadata"]["name"]]
    assert runner.started == commands and "lab.worker.train" in " ".join(*commands.values())


def test_the_hosts_forwarded_variables_reach_the_pods(tmp_path, cluster, monkeypatch):
    """The shared list (lab.common.forwarded_env): NCCL_DEBUG goes into every container's
    environment; an interface name and CUDA_VISIBLE_DEVICES stay home."""
    from lab.common.config import RunConfig
    from lab.host.places.base import Launch
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("UCX_NET_DEVICES", "mlx5_0:1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    cluster(Scenario(pods=mpijob_pods(RUNNING), log=lambda job: record_lines(job, tmp_path),
                     status=captured("mpijob-succeeded.yaml")["status"]))
    runner = k8s_runner.K8sRunner(1, "cpu", IMAGE, str(tmp_path / "results"), None, k8s_runner.Settings(
        opts=k8s.K8sOptions(), poll_s=0.05))
    assert not runner.cannot("forwarded variables")
    cfg = RunConfig(framework="horovod", results_dir=runner.results_in, run_id="fwd", expected_np=2,
                    attempt="000-horovod-gloo-none-n1-np2-r0")
    (name,) = runner.commands(Launch("horovod", "gloo", 2, tuple(cfg.to_args()), (), 60, "fwd",
                                     cfg.attempt, config=cfg))
    specs = runner._manifests[name].body["spec"]["mpiReplicaSpecs"]
    for spec in specs.values():
        env = {e["name"]: e["value"] for e in spec["template"]["spec"]["containers"][0]["env"]}
        assert env["NCCL_DEBUG"] == "INFO"
        assert "UCX_NET_DEVICES" not in env and "CUDA_VISIBLE_DEVICES" not in env


def test_a_forwarded_nccl_debug_wins_over_the_gpu_default():
    """On GPUs the pods get NCCL_DEBUG=WARN unless the user's own value was forwarded."""
    from lab.host.places.k8s.manifest import job_env
    assert job_env(None, "cuda", {}, environ={"NCCL_DEBUG": "INFO"})["NCCL_DEBUG"] == "INFO"
    assert job_env(None, "cuda", {}, environ={})["NCCL_DEBUG"] == "WARN"
    assert "NCCL_SOCKET_IFNAME" not in job_env(None, "cpu", {}, environ={"NCCL_SOCKET_IFNAME": "ib0"})


def test_invoke_k8s_and_bench_on_k8s_give_the_pods_one_environment(tmp_path, cluster, monkeypatch):
    """One request and one host environment: the manifest `invoke k8s` writes and the one
    `invoke bench --launcher k8s` creates carry the same env (lab.host.places.k8s.manifest.job_env
    makes it for both): the host's NCCL_DEBUG=INFO over the GPU default, its NCCL_IB_HCA,
    not its interface names. The runner's launch adds only bench's own watch's variable
    (the heartbeat channel), as bench's run_one gives it."""
    from lab.common import heartbeat
    from lab.host.places.base import Launch
    from lab.host.places.launch import job_env as bench_env
    from tests.test_k8s import invoke
    for k in list(os.environ):
        if k.startswith(("NCCL_", "UCX_", "OMPI_MCA_", "CUDA_", "TORCH_NCCL_", "HOROVOD_")):
            monkeypatch.delenv(k)
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("NCCL_IB_HCA", "mlx5_0")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib0")
    cp = invoke("--device", "cuda", "--framework", "ddp", "--backend", "nccl", "--api", "pytorchjob",
                "--np", "2", "--image", IMAGE, "--run-id", "same", "--results-dir", str(tmp_path / "task"),
                cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    written = yaml.safe_load((tmp_path / "task" / "same" / "k8s" / "pytorchjob.yaml").read_text())

    cluster(Scenario(pods=lambda job: [], log=lambda job: []))
    runner = k8s_runner.K8sRunner(1, "cuda", IMAGE, str(tmp_path / "results"), None, k8s_runner.Settings(
        opts=k8s.K8sOptions(api="pytorchjob"), poll_s=0.05), backend="nccl")
    cfg = worker_config(written)        # the same request, as the task's manifest carries it
    s = BenchSettings(np=[2], device="cuda", threads=cfg.threads, stall_s=cfg.stall_s)
    env = {**bench_env(s), heartbeat.CHANNEL_VAR: runner.heartbeat_channel}
    (name,) = runner.commands(Launch("ddp", "nccl", 2, tuple(cfg.to_args()), tuple(env.items()), 60,
                                     cfg.run_id, cfg.attempt, "cuda", cfg))
    created = runner._manifests[name].body

    def envs(body):
        return [c["env"] for r in body["spec"]["pytorchReplicaSpecs"].values()
                for c in r["template"]["spec"]["containers"]]
    theirs = [[e for e in each if e["name"] != heartbeat.CHANNEL_VAR] for each in envs(created)]
    assert envs(written) == theirs
    pod_env = {e["name"]: e["value"] for e in envs(written)[0]}
    assert pod_env["NCCL_DEBUG"] == "INFO" and pod_env["NCCL_IB_HCA"] == "mlx5_0"
    assert pod_env["NCCL_SOCKET_IFNAME"] == "eth0"      # the pod's own interface, not the host's


def test_each_launch_is_a_job_of_its_own(tmp_path, cluster):
    """--np 1,2: two jobs one after the other, each deleted when it ended and each of its
    own name (a deleted job stays visible while its pods go: the fake server refuses a
    name it has seen, 409), each record with its own process count."""
    sc = Scenario(pods=mpijob_pods(RUNNING), log=lambda job: record_lines(job, tmp_path),
                  status=captured("mpijob-succeeded.yaml")["status"])
    cluster(sc)
    outcome, lines = bench_run(tmp_path, np=[1, 2])
    assert outcome.failed == 0 and [r["world"]["np"] for r in outcome.records] == [1, 2]
    assert [r[0] for r in sc.requests if r[0] in ("POST", "DELETE")] == ["POST", "DELETE"] * 2
    assert len(sc.jobs) == 2 and sorted(sc.deleted) == sorted(sc.jobs)


def test_an_unschedulable_pod_is_one_sentence_and_a_failed_record_naming_it(tmp_path, cluster):
    sc = Scenario(pods=mpijob_pods(RUNNING, captured("pod-unschedulable-gpu.yaml")["status"]))
    cluster(sc)
    outcome, lines = bench_run(tmp_path, pending_s=0.3)
    (job,) = sc.jobs.values()
    pod_name = f"{job['metadata']['name']}-worker-0"
    said = [ln for ln in lines if ln.startswith("!! pod")]
    assert len(said) == 1 and "2 Insufficient nvidia.com/gpu" in said[0] and "lower --np" in said[0]
    assert outcome.failed == 1
    err = outcome.records[0]["error"]
    assert outcome.records[0]["status"] == "failed" and err["host"] == pod_name
    assert "Insufficient nvidia.com/gpu" in err["reason"] and pod_name in err["reason"]
    assert sc.deleted == [job["metadata"]["name"]]


def test_an_image_that_cannot_be_pulled_is_one_sentence(tmp_path, cluster):
    sc = Scenario(pods=mpijob_pods(RUNNING, captured("pod-imagepullbackoff.json")))
    cluster(sc)
    outcome, lines = bench_run(tmp_path, pending_s=0.2)
    (said,) = [ln for ln in lines if ln.startswith("!! pod")]
    assert "ImagePullBackOff" in said and "push the image" in said
    assert outcome.records[0]["status"] == "failed" and "ImagePullBackOff" in outcome.records[0]["error"]["reason"]


def test_a_job_whose_condition_is_failed_is_a_failed_record(tmp_path, cluster):
    sc = Scenario(pods=lambda job: [], status={"conditions": [captured("trainjob-failed-condition.json")]},
                  status_now=True)
    cluster(sc)
    outcome, lines = bench_run(tmp_path, api="trainjob", framework="ddp")
    assert ("POST", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs") in sc.requests
    (job,) = sc.jobs.values()
    assert ("GET", "/api/v1/namespaces/default/pods",
            {"labelSelector": f"jobset.sigs.k8s.io/jobset-name={job['metadata']['name']}"}) in sc.requests
    assert outcome.failed == 1 and outcome.records[0]["status"] == "failed"
    assert "DeadlineExceeded: TrainJob exceeded its active deadline" in outcome.records[0]["error"]["reason"]


def test_a_job_past_its_time_limit_is_deleted(tmp_path, cluster):
    sc = Scenario(pods=mpijob_pods(RUNNING), log=lambda job: ["epoch 1 ..."], hold_log=True)
    cluster(sc)
    outcome, lines = bench_run(tmp_path, timeout_s=1)
    (job,) = sc.jobs.values()
    (delete,) = [r for r in sc.requests if r[0] == "DELETE"]
    assert delete[1].endswith(f"/mpijobs/{job['metadata']['name']}")
    assert delete[3].get("propagationPolicy") == "Foreground"
    assert outcome.failed == 1
    assert "did not finish within 1 s" in outcome.records[0]["error"]["reason"]


def test_no_kubeconfig_is_one_sentence(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    with pytest.raises(RunnerError) as e:
        k8s_runner.K8sRunner(1, "cpu", IMAGE, str(tmp_path), None)
    text = str(e.value)
    assert "~/.kube/config" in text and "invoke k8s" in text and len(text.splitlines()) == 1


def test_no_client_is_one_sentence(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "kubernetes", None)
    with pytest.raises(RunnerError, match=r"pip install -e '\.\[k8s\]'"):
        k8s_runner.K8sRunner(1, "cpu", IMAGE, str(tmp_path), None)


def test_what_cannot_run_on_a_cluster_is_refused_in_one_sentence(tmp_path):
    s = BenchSettings(np=[2], launcher="k8s", ceiling=True, where="auto")
    with pytest.raises(BenchError, match="leave out --ceiling"):
        k8s_runner.for_bench(s, {})
    with pytest.raises(RunnerError, match=r"^--local is not honoured by Kubernetes \(--launcher k8s\)"):
        places.for_request(BenchSettings(np=[2], launcher="k8s", where="local", timeout_s=60))
    with pytest.raises(RunnerError, match="give --image"):
        k8s_runner.K8sRunner(1, "cpu", "", str(tmp_path), None)
    with pytest.raises(BenchError, match="has no setting 'regsitry'"):
        k8s_runner.for_bench(BenchSettings(np=[2], launcher="k8s", where="auto", timeout_s=60),
                             {"regsitry": "r"})
    # No time limit: nothing would end a job whose pods never appear (the stall watch starts with the ranks).
    with pytest.raises(BenchError, match="needs a time limit for each job: give --timeout-s"):
        k8s_runner.for_bench(BenchSettings(np=[2], launcher="k8s", where="auto", timeout_s=0), {})


def test_the_operators_labels_pick_rank_0():
    from types import SimpleNamespace as NS

    def p(labels, index=None):
        return NS(metadata=NS(labels=labels, annotations={k8s_cluster.COMPLETION_INDEX: index}))
    assert k8s_cluster.is_rank0("MPIJob", p({k8s_cluster.JOB_ROLE: "launcher"}))
    assert not k8s_cluster.is_rank0("MPIJob", p({k8s_cluster.JOB_ROLE: "worker"}))
    assert k8s_cluster.is_rank0("PyTorchJob", p({k8s_cluster.REPLICA_TYPE: "master"}))
    assert not k8s_cluster.is_rank0("PyTorchJob", p({k8s_cluster.REPLICA_TYPE: "worker"}))
    node0 = {k8s_cluster.REPLICATED_JOB: "node", k8s_cluster.JOBSET_INDEX: "0"}
    assert k8s_cluster.is_rank0("TrainJob", p(node0, "0"))
    assert not k8s_cluster.is_rank0("TrainJob", p(node0, "1"))
    assert not k8s_cluster.is_rank0("TrainJob", p({**node0, k8s_cluster.REPLICATED_JOB: "dataset-initializer"}, "0"))


def test_invoke_bench_launcher_k8s_end_to_end(tmp_path, cluster):
    """`invoke bench --launcher k8s` through invoke's Program, KUBECONFIG pointing at the
    fake server: the table printed from the record the job's log carried."""
    sc = Scenario(pods=mpijob_pods(RUNNING), log=lambda job: record_lines(job, tmp_path),
                  status=captured("mpijob-succeeded.yaml")["status"])
    cluster(sc)
    (line,) = [ln for ln in (REPO / "docs" / "pages" / "kubernetes.md").read_text().splitlines()
               if ln.startswith("invoke bench --launcher k8s")]
    args = shlex.split(line)[1:] + ["--epochs", "1", "--batch-size", "8", "--warmup-steps", "1",
                                    "--results-dir", str(tmp_path / "results")]
    cp = subprocess.run([sys.executable, "-m", "invoke", "-r", str(REPO), *args],
                        capture_output=True, text=True, cwd=tmp_path, timeout=120, env=dict(os.environ))
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "k8s: created MPIJob default/lab-hvd-k8s" in cp.stdout + cp.stderr
    rec = json.loads((tmp_path / "results" / "hvd-k8s" / results.RESULTS_FILE).read_text())
    assert rec["status"] == "ok" and rec["run_id"] == "hvd-k8s" and rec["world"]["np"] == 2
    assert "| horovod" in cp.stdout or "horovod" in cp.stdout       # the table, from the record
    assert (tmp_path / "results" / "hvd-k8s" / "k8s" / "mpijob.yaml").exists()
    cp = subprocess.run([sys.executable, "-m", "invoke", "-r", str(REPO), "bench", "--launcher", "k8s",
                         "--np", "2", "--ceiling", "--results-dir", str(tmp_path / "r2")],
                        capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert cp.returncode == 2 and cp.stderr.strip().splitlines() == [cp.stderr.strip()]
    assert "leave out --ceiling" in cp.stderr
    cp = subprocess.run([sys.executable, "-m", "invoke", "-r", str(REPO), *args],
                        capture_output=True, text=True, cwd=tmp_path, timeout=120,
                        env=dict(os.environ, KUBECONFIG=str(tmp_path / "absent")))
    assert cp.returncode == 2 and cp.stderr.strip().splitlines() == [cp.stderr.strip()]
    assert "write ~/.kube/config" in cp.stderr and "invoke k8s" in cp.stderr


def heartbeat_lines(job: dict) -> list[str]:
    """What the launcher pod's log carries of a job whose rank 1 sleeps in its data
    loading while rank 0 waits in the all-reduce: each rank's heartbeat and stack as
    lab.worker.heartbeat prints them (heartbeat.marker_line), behind the prefix mpirun's
    --tag-output puts before a rank's line (tests/test_stall_culprit.py reads real ones)."""
    from lab.common import heartbeat
    launch = worker_config(job).launched_at
    beat = {"host": "w", "pid": 7, "launch": launch, "phase": "step", "bound_s": 1.0}
    return [
        "[1,0]<stdout>:" + heartbeat.marker_line(heartbeat.BEAT_MARK, {
            **beat, "rank": 0, "seq": 12, "step": 3, "where": "optimizer"}),
        "[1,1]<stdout>:" + heartbeat.marker_line(heartbeat.BEAT_MARK, {
            **beat, "rank": 1, "seq": 10, "step": 3, "where": "before"}),
        "[1,0]<stdout>:" + heartbeat.marker_line(heartbeat.STACK_MARK, {
            "rank": 0, "seq": 12, "launch": launch, "frames": ["mpi_ops.py:1285 in synchronize"]}),
        "[1,1]<stdout>:" + heartbeat.marker_line(heartbeat.STACK_MARK, {
            "rank": 1, "seq": 10, "launch": launch, "frames": ["train.py:88 in load_batch"]}),
    ]


def test_the_stall_watch_reads_the_heartbeats_in_the_jobs_log(tmp_path, cluster):
    """The logs channel: the ranks' marker lines in rank 0's pod's log reach the watch,
    which stops the job (deleted) and names rank 1, outside the collective; none of the
    marker lines is echoed."""
    sc = Scenario(pods=mpijob_pods(RUNNING), log=lambda job: ["epoch 1 ...", *heartbeat_lines(job)],
                  hold_log=True)
    cluster(sc)
    outcome, lines = bench_run(tmp_path, stall_s=1.0)
    (job,) = sc.jobs.values()
    assert sc.deleted == [job["metadata"]["name"]]
    [r] = outcome.records
    err = r["error"]
    assert err["reason"].startswith("stalled: no rank advanced for 1 s"), err["reason"]
    assert err["rank"] == 1 and err["stalled"]["rule"] == "not in a collective"
    assert err["stalled"]["waiting"] == [0]
    assert not any("@lab-" in line for line in lines) and "epoch 1 ..." in lines


def restarted(status: dict, container: str, count: int, waiting: str = "") -> dict:
    """A captured pod status, its container renamed and run `count` times over (the
    kubelet's restartCount), running, or waiting for `waiting` (CrashLoopBackOff)."""
    out = json.loads(json.dumps(status))
    cs = out["containerStatuses"][0]
    cs.update(name=container, restartCount=count)
    if waiting:
        cs["state"] = {"waiting": {"reason": waiting, "message": "back-off 10s restarting failed container"}}
    return out


def test_max_restarts_the_operator_reruns_the_launcher_and_its_log_is_read_again(tmp_path, cluster):
    """--max-restarts 2: the MPIJob carries backoffLimit 2 and an OnFailure launcher; bench
    launches it once (the operator retries, lab.host.run.bench.run_job does not); the rerun
    container's log is read as well, and the record it prints again (the same emptyDir)
    is appended once."""
    printed: list[list[str]] = []
    sc = Scenario(status=captured("mpijob-succeeded.yaml")["status"], logs_before_status=2)

    def pods(job):
        name = job["metadata"]["name"]
        states = [restarted(RUNNING, "launcher", 0), restarted(RUNNING, "launcher", 1, "CrashLoopBackOff"),
                  restarted(RUNNING, "launcher", 1)]
        waits = sum(1 for r in sc.requests if r[1].endswith("/pods")) > 3 + 20 * sc.logs
        state = states[0] if sc.logs == 0 else states[2 if waits else 1]
        return [pod(f"{name}-launcher-x7k2p", {k8s_cluster.JOB_NAME: name, k8s_cluster.JOB_ROLE: "launcher"},
                    state)]

    def log(job):
        if not printed:
            printed.append(record_lines(job, tmp_path))
            return ["training ...", "rank 1 was killed"]
        return ["training again ...", *printed[0], *printed[0]]
    sc.pods, sc.log = pods, log
    cluster(sc)
    outcome, lines = bench_run(tmp_path, max_restarts=2)
    (job,) = sc.jobs.values()
    assert job["spec"]["runPolicy"]["backoffLimit"] == 2
    assert job["spec"]["mpiReplicaSpecs"]["Launcher"]["restartPolicy"] == "OnFailure"
    assert len([r for r in sc.requests if r[0] == "POST"]) == 1      # launched once
    assert len([r for r in sc.requests if r[1].endswith("/log")]) == 2
    assert outcome.failed == 0 and len(outcome.records) == 1 and outcome.records[0]["status"] == "ok"
    assert Path(outcome.run_dir, results.RESULTS_FILE).read_text().count("\n") == 1
    assert "rank 1 was killed" in lines and "training again ..." in lines
    assert any("the operator restarted pod" in ln and "1 of at most 2" in ln for ln in lines)


def test_bench_refuses_checkpoints_on_kubernetes_in_one_sentence():
    s = BenchSettings(np=[2], where="auto", launcher="k8s", nodes=2, checkpoint_every=5, max_restarts=1,
                      timeout_s=60)
    line = places.refusal(s, "k8s")
    assert line.startswith("--checkpoint-every 5 is not honoured by Kubernetes") and "\n" not in line
    assert places.refusal(BenchSettings(np=[2], where="auto", launcher="k8s", max_restarts=1, timeout_s=60),
                          "k8s") is None


def test_max_restarts_a_job_the_operator_gave_up_on_is_not_launched_again_by_bench(tmp_path, cluster):
    sc = Scenario(pods=lambda job: [], status={"conditions": [captured("trainjob-failed-condition.json")]},
                  status_now=True)
    cluster(sc)
    outcome, lines = bench_run(tmp_path, max_restarts=2)
    assert outcome.failed == 1 and outcome.records[0]["status"] == "failed"
    assert len([r for r in sc.requests if r[0] == "POST"]) == 1
    assert not any("relaunching" in ln for ln in lines)


def test_max_restarts_on_a_trainjob_is_one_sentence_before_anything_is_created(tmp_path, cluster):
    sc = Scenario(pods=lambda job: [], status={"conditions": []})
    cluster(sc)
    with pytest.raises((BenchError, RunnerError)) as e:
        bench_run(tmp_path, api="trainjob", framework="ddp", max_restarts=1)
    assert "is not honoured by a TrainJob" in str(e.value) and "\n" not in str(e.value)
    assert not [r for r in sc.requests if r[0] == "POST"]
