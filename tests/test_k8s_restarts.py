"""--max-restarts and --checkpoint-every in the Kubernetes manifests (lab.host.places.k8s.jobs,
lab.host.places.k8s.manifest): the retry settings validated against the operators' CRD
schemas (tests/test_k8s.py's validators), the fields carrying K, the manifests without the
flags exactly as before, and the refusals one sentence each. No cluster runs here: whether
the operators retry as their sources say is untested (docs/pages/kubernetes.md)."""
import json
import os
import re
import shlex
import subprocess

import pytest
import yaml

from lab.common import restarts
from lab.common.forwarded_env import PREFIXES
from lab.host.errors import BenchError
from lab.host.places.k8s import jobs as k8s_jobs
from lab.host.places.k8s import manifest as k8s
from lab.host.request.checks import settings_from_flags
from tests.test_k8s import FIXTURES, container, invoke, put, validate

PVC = "lab-results"


def request(**flags):
    flags.setdefault("run_id", "t1")
    settings, _ = settings_from_flags(flags, {"np": "2", "timeout_s": 3600})
    return settings


def manifest(opts=None, **flags) -> dict:
    o = opts or k8s.K8sOptions(registry="reg.example/lab")
    return k8s.manifest_for_request(request(**flags), o, env={}).body


def hvd(**flags):
    return manifest(k8s.K8sOptions(registry="reg.example/lab", pvc=flags.pop("pvc", "")),
                    np="4", nodes="2", framework="horovod", backend="gloo", **flags)


def torch_job(**flags):
    return manifest(k8s.K8sOptions(registry="reg.example/lab", api="pytorchjob",
                                   pvc=flags.pop("pvc", "")), np="4", nodes="2", **flags)


def test_without_the_flags_the_manifests_are_exactly_as_before(monkeypatch):
    """The fixture holds what the kit wrote before restarts reached Kubernetes, on a host
    with none of the variables the pods are handed (a process that initialised CUDA has
    CUDA_MODULE_LOADING, which torch sets: the suite's workers may have)."""
    for name in [k for k in os.environ if k.startswith(PREFIXES)]:
        monkeypatch.delenv(name)
    before = json.loads((FIXTURES / "manifests-without-restarts.json").read_text())
    for name, flags, opts in before["cases"]:
        s, _ = settings_from_flags({"run_id": "gold", **flags}, {"np": "2", "timeout_s": 3600})
        body = k8s.manifest_for_request(s, k8s.K8sOptions(image="me/lab:1", **opts), env={}).body
        assert body == before["bodies"][name], name
    assert {b["kind"] for b in before["bodies"].values()} == {"MPIJob", "TrainJob", "PyTorchJob"}
    assert all(b["spec"].get("runPolicy", {"backoffLimit": 0})["backoffLimit"] == 0
               for b in before["bodies"].values())


@pytest.mark.parametrize("k", [1, 3])
def test_an_mpijob_retries_its_launcher_k_times(k):
    body = hvd(max_restarts=str(k))
    validate(body)
    spec = body["spec"]
    assert spec["runPolicy"]["backoffLimit"] == k
    assert spec["mpiReplicaSpecs"]["Launcher"]["restartPolicy"] == "OnFailure"
    # the workers serve sshd and do not fail with the ranks: not restarted
    assert "restartPolicy" not in spec["mpiReplicaSpecs"]["Worker"]


@pytest.mark.parametrize("k", [1, 3])
def test_a_pytorchjob_retries_its_pods_k_times(k):
    body = torch_job(max_restarts=str(k))
    validate(body)
    spec = body["spec"]
    assert spec["runPolicy"]["backoffLimit"] == k
    assert {r["restartPolicy"] for r in spec["pytorchReplicaSpecs"].values()} == {"OnFailure"}


# What each operator accepts for a replica's restartPolicy (the CRDs type it as a plain
# string): mpi-operator v0.8.0 pkg/apis/kubeflow/validation/validation.go,
# validRestartPolicies; training-operator v1.9.0 pkg/apis/kubeflow.org/v1/common_types.go,
# the RestartPolicy constants.
ACCEPTED = {"MPIJob": {"Never", "OnFailure"},
            "PyTorchJob": {"Always", "OnFailure", "Never", "ExitCode"}}


@pytest.mark.parametrize("make", [hvd, torch_job])
def test_the_restart_policies_are_ones_the_operators_accept_and_the_limit_is_typed(make):
    body = make(max_restarts="2")
    replicas = body["spec"][f"{'mpi' if body['kind'] == 'MPIJob' else 'pytorch'}ReplicaSpecs"]
    assert {r.get("restartPolicy", "Never") for r in replicas.values()} <= ACCEPTED[body["kind"]]
    assert "OnFailure" in {r.get("restartPolicy") for r in replicas.values()}
    with pytest.raises(AssertionError):     # the schema types backoffLimit as an integer
        validate(put(body, "2", "spec", "runPolicy", "backoffLimit"))
    with pytest.raises(AssertionError):     # and refuses a field it does not name
        validate(put(body, 2, "spec", "runPolicy", "maxRestarts"))


def test_a_trainjob_has_no_place_for_restarts_and_is_refused_in_one_sentence():
    body = manifest(np="4", nodes="2")
    validate(body)
    job = ["spec", "runtimePatches", 0, "trainingRuntimeSpec", "template", "spec"]
    # the schema has no field that would carry them (the JobSet's failurePolicy, a Job's backoffLimit)
    with pytest.raises(AssertionError):
        validate(put(body, {"maxRestarts": 2}, *job, "failurePolicy"))
    with pytest.raises(AssertionError):
        validate(put(body, 2, *job, "replicatedJobs", 0, "template", "spec", "backoffLimit"))
    with pytest.raises(AssertionError):
        validate(put(body, 2, "spec", "backoffLimit"))
    with pytest.raises(BenchError) as e:
        manifest(np="4", nodes="2", max_restarts="2")
    said = str(e.value)
    assert "--max-restarts 2 is not honoured by a TrainJob" in said and "--api pytorchjob" in said
    assert said.count(". ") == 0 and "\n" not in said


def test_checkpoints_without_a_volume_are_refused_in_one_sentence():
    for make in (hvd, torch_job):
        with pytest.raises(BenchError) as e:
            make(max_restarts="2", checkpoint_every="5")
        said = str(e.value)
        assert said.startswith("--checkpoint-every 5 needs a persistent volume") and "give --pvc" in said
        assert said.count(". ") == 0 and "\n" not in said


def test_a_negative_count_is_refused():
    with pytest.raises(BenchError, match="0 or more"):
        hvd(max_restarts="-1")


def worker_command(body: dict) -> str:
    if body["kind"] == "MPIJob":
        return container(body["spec"]["mpiReplicaSpecs"]["Launcher"]["template"])["command"]
    return container(body["spec"]["pytorchReplicaSpecs"]["Master"]["template"])["command"]


@pytest.mark.parametrize("make", [hvd, torch_job])
def test_checkpoints_go_to_the_runs_folder_on_the_volume_and_a_retry_resumes(make, tmp_path):
    body = make(max_restarts="2", checkpoint_every="5", pvc=PVC)
    validate(body)
    cmd = worker_command(body)
    assert cmd[:2] == ["bash", "-c"]
    script = cmd[2]
    words = shlex.split(script.split("exec ", 1)[1])
    assert words[words.index("--checkpoint-every") + 1] == "5"
    assert words[words.index("--results-dir") + 1] == k8s.RESULTS_IN_POD
    assert words[-2:] == ["--restart", "$r"]
    folder = re.search(r"\[ -d (\S+) \]", script).group(1)
    assert folder.startswith(f"{k8s.RESULTS_IN_POD}/t1/checkpoints/")
    vols = body["spec"][f"{'mpi' if body['kind'] == 'MPIJob' else 'pytorch'}ReplicaSpecs"]
    assert all({"name": "lab", "persistentVolumeClaim": {"claimName": PVC}} in r["template"]["spec"]["volumes"]
               for r in vols.values())

    # the script as the pod runs it, with the folder under tmp_path and `echo` for the program
    def run(script_text):
        local = script_text.replace(folder, shlex.quote(str(tmp_path / "ckpt"))).replace("exec ", "exec echo ", 1)
        return subprocess.run(["bash", "-c", local], capture_output=True, text=True, timeout=30).stdout.split()
    assert run(script)[-2:] == ["--restart", "0"]       # the first launch
    (tmp_path / "ckpt").mkdir()
    assert run(script)[-2:] == ["--restart", "1"]       # a retry after a checkpoint


@pytest.mark.parametrize("make", [hvd, torch_job])
def test_a_retry_resumes_its_own_attempt_never_a_folder_another_manifest_left(make, tmp_path):
    """Each written manifest is an attempt of its own (the same request and run id written
    twice: two attempts, two checkpoint folders, two job names), and its pods' command
    resumes only its own attempt's checkpoints: run with bash where the volume holds the
    first manifest's folder, the second's command starts afresh (--restart 0); once its
    own folder is there (a retried pod of that job) it resumes (--restart 1). Every pod
    of a job runs the one command, and a PyTorchJob's ranks agree on the decision."""
    first, second = (make(max_restarts="2", checkpoint_every="5", pvc=PVC) for _ in range(2))
    scripts = [worker_command(b)[2] for b in (first, second)]
    folders = [re.search(r"\[ -d (\S+) \]", s).group(1) for s in scripts]
    assert folders[0] != folders[1] and first["metadata"]["name"] != second["metadata"]["name"]
    volume = tmp_path / "volume"

    def restart_said(script_text):
        local = script_text.replace(k8s.RESULTS_IN_POD, shlex.quote(str(volume))).replace("exec ", "exec echo ", 1)
        out = subprocess.run(["bash", "-c", local], capture_output=True, text=True, timeout=30).stdout.split()
        assert out[-2] == "--restart"
        return out[-1]
    assert restart_said(scripts[1]) == "0"                  # a fresh write, an empty volume
    (volume / folders[0][len(k8s.RESULTS_IN_POD) + 1:]).mkdir(parents=True)
    assert restart_said(scripts[1]) == "0"                  # another attempt's folder: not resumed
    assert restart_said(scripts[0]) == "1"                  # that attempt's own retried pod resumes
    (volume / folders[1][len(k8s.RESULTS_IN_POD) + 1:]).mkdir(parents=True)
    assert restart_said(scripts[1]) == "1"
    specs = second["spec"].get("pytorchReplicaSpecs") or {}
    assert len({json.dumps(container(r["template"])["command"]) for r in specs.values()}) <= 1
    for r in specs.values():
        env = {e["name"]: e["value"] for e in container(r["template"])["env"]}
        assert env[restarts.AGREE_VAR] == "1"


def test_restarts_without_checkpoints_run_the_command_as_before():
    plain, retried = hvd(), hvd(max_restarts="2")
    assert worker_command(plain) == worker_command(retried)


@pytest.mark.parametrize("make", [hvd, torch_job])
def test_a_retried_pods_arguments_parse_and_name_the_folder_the_pod_looks_for(make):
    """The worker's own parser reads the retried command, and the folder its checkpoints
    go to (lab.worker.checkpoint.job_folder's formula) is the one the script tests."""
    from lab.common import restarts, results
    from lab.common.config import parse_args
    script = worker_command(make(max_restarts="1", checkpoint_every="3", pvc=PVC))[2]
    words = shlex.split(script.split("exec ", 1)[1].replace('"$r"', "1"))
    cfg = parse_args(words[words.index("lab.worker.train") + 1:])
    assert cfg.restart == 1 and cfg.checkpoint_every == 3 and cfg.attempt
    folder = restarts.folder(results.run_dir(cfg.results_dir, cfg.run_id), cfg.attempt, cfg.restart)
    assert f"[ -d {folder} ]" in script


def test_invoke_k8s_takes_the_flags_and_writes_them(tmp_path):
    cp = invoke("--np", "4", "--nodes", "2", "--framework", "horovod", "--backend", "gloo",
                "--registry", "r", "--max-restarts", "3", "--checkpoint-every", "10", "--pvc", PVC,
                "--results-dir", str(tmp_path), "--run-id", "r1", cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    body = yaml.safe_load((tmp_path / "r1" / "k8s" / "mpijob.yaml").read_text())
    validate(body)
    assert body["spec"]["runPolicy"]["backoffLimit"] == 3
    assert "--checkpoint-every 10" in worker_command(body)[2]
    # what applying it again means, said by the task and in the file, with its attempt
    text = (tmp_path / "r1" / "k8s" / "mpijob.yaml").read_text()
    attempt = re.search(r"^# Attempt (\S+): applying this manifest again continues its job", text, re.M).group(1)
    assert f"--attempt {attempt}" in worker_command(body)[2]
    assert f"{k8s.CONTINUES} (attempt {attempt})" in cp.stderr
    again = invoke("--np", "4", "--nodes", "2", "--framework", "horovod", "--backend", "gloo",
                   "--registry", "r", "--max-restarts", "3", "--checkpoint-every", "10", "--pvc", PVC,
                   "--results-dir", str(tmp_path), "--run-id", "r1", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert f"Attempt {attempt}:" not in (tmp_path / "r1" / "k8s" / "mpijob.yaml").read_text()


@pytest.mark.parametrize("args,words", [
    (["--max-restarts", "2"], "is not honoured by a TrainJob"),
    (["--max-restarts", "2", "--checkpoint-every", "5", "--api", "pytorchjob"], "give --pvc"),
])
def test_invoke_k8s_refuses_in_one_line(tmp_path, args, words):
    cp = invoke("--np", "2", "--registry", "r", *args, "--results-dir", str(tmp_path), cwd=tmp_path)
    assert cp.returncode == 2 and "Traceback" not in cp.stderr
    assert len(cp.stderr.strip().splitlines()) == 1 and words in cp.stderr
    assert not list(tmp_path.rglob("*.yaml"))


def test_the_retry_policy_is_one_each_operator_lists():
    assert k8s_jobs.restart_policy(0) == "Never" and k8s_jobs.restart_policy(2) == "OnFailure"
