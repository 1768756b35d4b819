"""Kubernetes manifests (lab.host.places.k8s.manifest, `invoke k8s`), validated offline: each job against
its operator's published CRD schema (tests/fixtures/k8s/, repository, path and release
named in each file's header and in the README there), strictly (an unknown field fails,
as kubectl's default --validate=strict does on the server), and every pod template in it
against kubernetes-validate's core schemas of Kubernetes 1.37. The commands inside are
parsed by the real programs' own argument parsers (horovodrun, torchrun, the worker's)
and mpirun's options run through the real mpirun. No cluster runs here: whether the jobs
run on a live one is untested (README, "Running on Kubernetes")."""
import copy
import gzip
import inspect
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from lab.common.config import parse_args
from lab.host.errors import BenchError
from lab.host.places.k8s import jobs as k8s_jobs
from lab.host.places.k8s import manifest as k8s
from lab.host.request.checks import settings_from_flags

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures" / "k8s"
CRDS = {"MPIJob": "mpi-operator-v0.8.0-kubeflow.org_mpijobs.yaml.gz",
        "TrainJob": "trainer-v2.3.0-trainer.kubeflow.org_trainjobs.yaml.gz",
        "PyTorchJob": "training-operator-v1.9.0-kubeflow.org_pytorchjobs.yaml.gz"}
KUBERNETES = "1.37.0"   # kubernetes-validate's newest schemas (kubernetes-validate 1.37.0)
# k8s.io/apimachinery pkg/util/validation/validation.go: a qualified name (label key's
# name part, label value) and a DNS-1123 label (object names the operators suffix).
QUALIFIED = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def strict(schema):
    """The CRD's structural schema as a JSON Schema that refuses unknown fields: the API
    server drops (or, with strict field validation, refuses) what the schema does not
    name, unless x-kubernetes-preserve-unknown-fields says to keep it."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out and \
                not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def crd_validator(kind: str) -> jsonschema.Draft7Validator:
    with gzip.open(FIXTURES / CRDS[kind], "rt") as f:
        crd = yaml.safe_load(f)
    assert crd["kind"] == "CustomResourceDefinition" and crd["spec"]["names"]["kind"] == kind
    api = k8s.KINDS[kind.lower()][0]
    group, version = api.split("/")
    assert crd["spec"]["group"] == group
    served = [v for v in crd["spec"]["versions"] if v["name"] == version and v["served"]]
    assert served, f"{kind} {api} is not served by the stored CRD"
    return jsonschema.Draft7Validator(strict(served[0]["schema"]["openAPIV3Schema"]))


def pod_templates(body: dict) -> list[dict]:
    spec = body["spec"]
    if body["kind"] == "MPIJob":
        return [r["template"] for r in spec["mpiReplicaSpecs"].values()]
    if body["kind"] == "PyTorchJob":
        return [r["template"] for r in spec["pytorchReplicaSpecs"].values()]
    return [rj["template"]["spec"]["template"] for p in spec["runtimePatches"]
            for rj in p["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]]


def validate(body: dict) -> None:
    """Raises on the first field, type or requirement either schema refuses."""
    errors = sorted(crd_validator(body["kind"]).iter_errors(body), key=lambda e: list(e.path))
    if errors:
        raise AssertionError(f"{body['kind']}: {errors[0].message} at {list(errors[0].path)}")
    validate_core(body)


def validate_core(body: dict) -> None:
    """The pod templates and the metadata against the core schemas."""
    for t in pod_templates(body):
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate",
                                      "metadata": {"name": "t"}, "template": t},
                                     KUBERNETES, strict=True)
    meta = body["metadata"]
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta},
                                 KUBERNETES, strict=True)
    assert DNS_LABEL.match(meta["name"]) and len(meta["name"]) <= 63
    for key, value in meta["labels"].items():
        assert QUALIFIED.match(key.split("/")[-1]) and len(key.split("/")[-1]) <= 63, key
        assert QUALIFIED.match(value) and len(value) <= 63, value


def request(**flags):
    flags.setdefault("run_id", "t1")
    settings, _ = settings_from_flags(flags, {"np": "2", "timeout_s": 3600})
    return settings


def manifest(opts=None, **flags) -> k8s.Manifest:
    return k8s.manifest_for_request(request(**flags), opts or k8s.K8sOptions(registry="reg.example/lab"))


def container(template: dict) -> dict:
    return template["spec"]["containers"][0]


def horovod_nccl() -> dict:
    return manifest(np="8", nodes="2", device="cuda", framework="horovod", backend="nccl").body


def fsdp() -> dict:
    return manifest(np="8", nodes="2", device="cuda", strategy="fsdp", backend="nccl").body


def test_horovod_over_nccl_on_8_gpus_of_2_nodes_is_a_valid_mpijob():
    body = horovod_nccl()
    validate(body)
    spec = body["spec"]
    assert body["kind"] == "MPIJob" and spec["slotsPerWorker"] == 4
    assert spec["runPolicy"] == {"cleanPodPolicy": "Running", "backoffLimit": 0,
                                 "activeDeadlineSeconds": 3600}
    launcher, worker = spec["mpiReplicaSpecs"]["Launcher"], spec["mpiReplicaSpecs"]["Worker"]
    assert launcher["replicas"] == 1 and worker["replicas"] == 2
    w = container(worker["template"])
    assert w["resources"]["limits"] == {"nvidia.com/gpu": 4}
    assert "nvidia.com/gpu" not in str(container(launcher["template"])["resources"])
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in worker["template"]["spec"]["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in w["volumeMounts"]
    assert w["image"] == "reg.example/lab/dl-lab-kit:gpu-nccl-" + w["image"].rsplit("-", 1)[1]
    assert {"name": "NCCL_SOCKET_IFNAME", "value": "eth0"} in container(launcher["template"])["env"]
    assert body["metadata"]["labels"] == {"org.dl-lab-kit.managed-by": "k8s",
                                          "org.dl-lab-kit.run-id": "t1"}


def test_fsdp_on_8_gpus_of_2_nodes_is_a_valid_trainjob():
    body = fsdp()
    validate(body)
    spec = body["spec"]
    assert body["kind"] == "TrainJob" and spec["runtimeRef"]["name"] == "torch-distributed"
    trainer = spec["trainer"]
    assert trainer["numNodes"] == 2 and trainer["numProcPerNode"] == 4
    assert trainer["resourcesPerNode"]["limits"] == {"nvidia.com/gpu": 4}
    assert spec["activeDeadlineSeconds"] == 3600
    pod = pod_templates(body)[0]["spec"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]
    assert pod["containers"][0]["name"] == "node"      # the runtime's container
    assert trainer["image"].startswith("reg.example/lab/dl-lab-kit:gpu-nccl-")
    # Trainer's webhook refuses the env names its torch plugin sets (v2.3.0 pkg/constants
    # TorchRunReservedEnvNames: PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK,
    # PET_MASTER_ADDR, PET_MASTER_PORT; plugins/torch/torch.go Validate)
    assert not [e for e in trainer["env"] if e["name"].startswith("PET_")]


def test_the_older_operator_gets_a_valid_pytorchjob():
    body = manifest(k8s.K8sOptions(api="pytorchjob", image="me/lab:1", pvc="lab-results"),
                    np="8", nodes="2", device="cuda", strategy="fsdp", backend="nccl").body
    validate(body)
    spec = body["spec"]
    assert spec["pytorchReplicaSpecs"]["Master"]["replicas"] == 1
    assert spec["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1 and spec["nprocPerNode"] == "4"
    c = container(spec["pytorchReplicaSpecs"]["Master"]["template"])
    assert c["name"] == "pytorch" and c["image"] == "me/lab:1"
    vols = spec["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["volumes"]
    assert {"name": "lab", "persistentVolumeClaim": {"claimName": "lab-results"}} in vols
    # with a volume the record stays there: the command is torchrun itself
    assert c["command"][:3] == ["python", "-m", "torch.distributed.run"]


def drop(body, *path):
    out = copy.deepcopy(body)
    node = out
    for p in path[:-1]:
        node = node[p]
    del node[path[-1]]
    return out


def put(body, value, *path):
    out = copy.deepcopy(body)
    node = out
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return out


@pytest.mark.parametrize("make,change", [
    (horovod_nccl, lambda b: drop(b, "spec", "mpiReplicaSpecs")),                     # required
    (horovod_nccl, lambda b: put(b, "4", "spec", "slotsPerWorker")),                   # type
    (horovod_nccl, lambda b: put(b, "OpenMP", "spec", "mpiImplementation")),           # enum
    (horovod_nccl, lambda b: put(b, 4, "spec", "slotPerWorker")),                      # unknown
    (horovod_nccl, lambda b: drop(b, "spec", "mpiReplicaSpecs", "Worker", "template", "spec",
                                  "containers", 0, "name")),                             # required
    (fsdp, lambda b: drop(b, "spec", "runtimeRef")),                                    # required
    (fsdp, lambda b: drop(b, "spec", "runtimeRef", "name")),
    (fsdp, lambda b: put(b, "4", "spec", "trainer", "numNodes")),
    (fsdp, lambda b: put(b, {"gpu": 4}, "spec", "trainer", "resourcesPerNode", "limit")),
    (fsdp, lambda b: drop(b, "spec", "runtimePatches", 0, "manager")),
])
def test_a_wrong_or_missing_field_fails_validation(make, change):
    body = make()
    validate(body)
    with pytest.raises(AssertionError):
        validate(change(body))


def test_the_core_schemas_catch_what_a_pod_template_gets_wrong():
    body = horovod_nccl()
    worker = ("spec", "mpiReplicaSpecs", "Worker", "template", "spec")
    bad = put(body, [{"name": "dshm", "emptyDir": {"medium": "Memory"}, "hostPath": 1}],
              *worker, "volumes")
    validate_core(body)
    with pytest.raises(kubernetes_validate.ValidationError, match="hostPath"):
        validate_core(bad)
    with pytest.raises(kubernetes_validate.ValidationError, match="labels"):
        validate_core(put(body, {"a": 1}, "metadata", "labels"))


def test_the_commands_parse_with_the_real_programs_parsers(monkeypatch):
    """horovodrun's and torchrun's own argument parsers, and the worker's, read the
    commands the manifests hold as intended."""
    pytest.importorskip("horovod")
    from horovod.runner import launch as hvd
    from torch.distributed.run import get_args_parser
    body = manifest(np="8", nodes="2", device="cuda", framework="horovod", backend="nccl",
                    run_id="t1").body
    launcher = container(body["spec"]["mpiReplicaSpecs"]["Launcher"]["template"])
    script = launcher["command"][2]
    argv = shlex.split(script.split(";")[0])
    monkeypatch.setattr(sys, "argv", argv)
    args = hvd.parse_args()
    assert args.num_proc == 8 and args.hostfile == "/etc/mpi/hostfile" and args.ssh_port == 2222
    assert args.use_gloo and args.command[:3] == ["python", "-m", "lab.worker.train"]
    cfg = parse_args(args.command[3:])
    assert (cfg.framework, cfg.backend, cfg.device, cfg.run_id, cfg.expected_np) == \
        ("horovod", "nccl", "cuda", "t1", 8)
    assert cfg.results_dir == k8s.RESULTS_IN_POD
    trainer = fsdp()["spec"]["trainer"]
    argv = shlex.split(trainer["command"][2].split(";")[0])
    assert argv[:3] == ["python", "-m", "torch.distributed.run"]
    ns = get_args_parser().parse_args(argv[3:])
    assert (ns.nnodes, ns.nproc_per_node, ns.module, ns.training_script) == \
        ("2", "4", True, "lab.worker.train")
    cfg = parse_args(ns.training_script_args)
    assert (cfg.strategy, cfg.framework, cfg.backend, cfg.expected_np) == ("fsdp", "ddp", "nccl", 8)


@pytest.mark.mpi
def test_mpiruns_options_are_the_real_mpiruns(tmp_path):
    """The launcher's mpirun options, run by the real mpirun (one local process instead
    of the workers' ranks; ssh is not reached)."""
    import shutil
    if not shutil.which("mpirun"):
        pytest.skip("no mpirun")
    body = manifest(np="4", nodes="2", framework="horovod", backend="mpi").body
    argv = shlex.split(container(body["spec"]["mpiReplicaSpecs"]["Launcher"]["template"])
                       ["command"][2].split(";")[0])
    head = argv[:argv.index("python")]
    head[head.index("-np") + 1] = "1"
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1", OMPI_MCA_mpi_yield_when_idle="1")
    cp = subprocess.run([*head, "echo", "ran"], capture_output=True, text=True, env=env, timeout=60)
    assert cp.returncode == 0 and cp.stdout.strip() == "ran", cp.stderr


def test_without_a_volume_the_record_is_printed_after_the_run(tmp_path):
    """The wrapper that prints rank 0's records into the log, run by bash: the records
    come out prefixed, and the job's exit status is the training command's."""
    rec = tmp_path / "results.jsonl"
    rec.write_text('{"status": "ok"}\n{"status": "ok", "n": 2}\n')
    for code in (0, 3):
        cmd = k8s_jobs.with_records(["bash", "-c", f"echo training; exit {code}"], str(rec), pvc="")
        cp = subprocess.run(cmd, capture_output=True, text=True)
        assert cp.returncode == code
        lines = cp.stdout.splitlines()
        assert lines[0] == "training"
        assert [ln[len(k8s.RECORD_PREFIX):] for ln in lines[1:]] == rec.read_text().splitlines()
    assert k8s_jobs.with_records(["true"], str(rec), pvc="claim") == ["true"]


@pytest.mark.parametrize("flags,opts,words", [
    (dict(np="8", nodes="2", device="cuda"), dict(gpus_per_node=2), "--gpus-per-node is 2"),
    (dict(np="4", nodes="2", framework="horovod"), dict(api="trainjob"), "use --api mpijob"),
    (dict(np="4", nodes="2", strategy="fsdp"), dict(api="mpijob"), "use --api trainjob"),
    (dict(np="4", nodes="2"), dict(registry=""), "give --registry"),
    (dict(np="3", nodes="2"), {}, "does not spread evenly"),
    (dict(np="1", strategy="dataparallel"), {}, "invoke bench"),
    (dict(np="4", nodes="2"), dict(api="slurm"), "--api is one of"),
    (dict(np="4", nodes="2"), dict(gpus_per_node=1), "for --device cuda"),
    (dict(np="4", nodes="2", device="cuda", framework="horovod", backend="gloo"), {}, "would measure NCCL"),
])
def test_bad_input_is_one_sentence(flags, opts, words):
    o = k8s.K8sOptions(**{"registry": "reg.example/lab", **opts})
    with pytest.raises(BenchError, match=re.escape(words)):
        k8s.manifest_for_request(request(**flags), o)


def invoke(*args, cwd):
    return subprocess.run([sys.executable, "-m", "invoke", "-r", str(REPO), "k8s", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=120)


def test_invoke_k8s_writes_the_manifest_and_the_apply_line(tmp_path):
    cp = invoke("--np", "4", "--nodes", "2", "--framework", "horovod", "--backend", "mpi",
                "--registry", "reg.example/lab", "--results-dir", str(tmp_path), "--run-id", "r1",
                cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    path = tmp_path / "r1" / "k8s" / "mpijob.yaml"
    assert cp.stdout.splitlines()[-1] == f"kubectl apply -f {path}"
    body = yaml.safe_load(path.read_text())
    validate(body)
    assert body["spec"]["slotsPerWorker"] == 2 and body["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2


@pytest.mark.parametrize("args,words", [
    (["--np", "8", "--nodes", "2", "--device", "cuda", "--gpus-per-node", "2"], "GPU of its own"),
    (["--np", "4", "--nodes", "2", "--strategy", "fsdp", "--api", "mpijob"], "torchrun"),
    (["--np", "4", "--nodes", "2", "--registry", ""], "give --registry"),
    (["--np", "2,4", "--registry", "r"], "one process count"),
    (["--np", "2", "--max-steps", "4", "--registry", "r"], "--warmup-steps 5 leaves none to time"),
])
def test_invoke_k8s_bad_input_is_one_line(tmp_path, args, words):
    cp = invoke(*args, "--results-dir", str(tmp_path), cwd=tmp_path)
    assert cp.returncode == 2
    assert "Traceback" not in cp.stderr and len(cp.stderr.strip().splitlines()) == 1
    assert cp.stderr.startswith("error: ") and words in cp.stderr


def test_the_readmes_examples_are_what_invoke_k8s_writes(tmp_path):
    """The README's `invoke k8s` commands, run as written (in an empty folder): the lines
    it shows, and manifests that validate."""
    page = (REPO / "docs" / "pages" / "kubernetes.md").read_text()
    section = page.split("# Running on Kubernetes", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"^(invoke k8s .*)$", section, re.M)
    assert len(commands) == 2
    shown = re.search(r"prints \(.*?\):\n\n```\n(.*?)```", section, re.S).group(1)
    for i, command in enumerate(commands):
        cp = invoke(*command.split()[2:], cwd=tmp_path)
        assert cp.returncode == 0, cp.stderr
        if i == 0:
            assert cp.stdout == shown
        path = tmp_path / cp.stdout.splitlines()[-1].split(" -f ")[1]
        validate(yaml.safe_load(path.read_text()))
    trainjob = yaml.safe_load((tmp_path / "results/fsdp-2x4/k8s/trainjob.yaml").read_text())
    assert trainjob["spec"]["activeDeadlineSeconds"] == 1800


def test_invoke_yamls_k8s_defaults_are_options_and_a_wrong_key_is_one_sentence():
    defaults = yaml.safe_load((REPO / "invoke.yaml").read_text())["k8s"]
    assert k8s.options(defaults).api == "auto"
    with pytest.raises(BenchError, match="has no setting 'regsitry'"):
        k8s.options({"regsitry": "r"})


# The hostfile mpi-operator v0.8.0 writes for a job's workers (the expected ConfigMap in
# its pkg/controller/mpi_job_controller_test.go, "openmpi-without-slots"; one
# "<pod>.<job>.<namespace>.svc slots=N" line per worker, as newConfigMap formats it).
OPERATOR_HOSTFILE = ("openmpi-without-slots-worker-0.openmpi-without-slots.tenant-a.svc slots=1\n"
                     "openmpi-without-slots-worker-1.openmpi-without-slots.tenant-a.svc slots=1\n")


def test_the_operators_hostfile_is_read_by_horovodrun_and_the_record_printer(tmp_path):
    """horovodrun's own reader takes the operator's hostfile, and the launcher's shell
    names its first host (where rank 0 runs) for printing the record."""
    pytest.importorskip("horovod")
    from horovod.runner.common.util.hosts import parse_host_files
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(OPERATOR_HOSTFILE)
    assert parse_host_files(str(hostfile)) == (
        "openmpi-without-slots-worker-0.openmpi-without-slots.tenant-a.svc:1,"
        "openmpi-without-slots-worker-1.openmpi-without-slots.tenant-a.svc:1")
    body = manifest(np="4", nodes="2", framework="horovod", backend="gloo").body
    script = container(body["spec"]["mpiReplicaSpecs"]["Launcher"]["template"])["command"][2]
    first = re.search(r'"(\$\(head .*?\))"', script).group(1).replace("/etc/mpi/hostfile", str(hostfile))
    out = subprocess.run(["bash", "-c", f'echo "{first}"'], capture_output=True, text=True).stdout
    assert out.strip() == "openmpi-without-slots-worker-0.openmpi-without-slots.tenant-a.svc"
    subprocess.run(["bash", "-n", "-c", script], check=True)


def test_every_flag_has_its_help_and_no_odd_short_flag(tmp_path):
    """invoke would make `-` the short flag of a name holding a dash once the letters are
    taken (`--=STRING` in the help): the task takes long flags only."""
    cp = invoke("--help", cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    flags = re.findall(r"^\s+(-\S*)=STRING", cp.stdout, re.M)
    assert "--" not in flags and "--timeout-s" in flags and "--registry" in flags
    switches = re.findall(r"^\s+--\[no-\](\S+)\s", cp.stdout, re.M)
    import tasks
    assert sorted([f[2:] for f in flags] + switches) == sorted(
        p.replace("_", "-") for p in set(inspect.signature(tasks.k8s.body).parameters) - {"c"})


# Kubernetes' own rules (k8s.io/apimachinery pkg/util/validation/validation.go), written
# out here apart from the code's: a label value, a DNS-1123 label, and JobSet's pod name
# (jobset pkg/webhooks/jobset_webhook.go: <jobset>-<replicated job>-<job>-<pod> plus a
# 5-character suffix, a DNS-1035 label of at most 63).
LABEL_VALUE_RULE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
NASTY_RUN_IDS = ["run-", "run.", "run_", "R" * 63, "x" * 64, "Ab.C_d-" * 30, "a.b.c",
                 "sweep-2026_11_24.", "A" * 38, "a" * 39 + "-"]


@pytest.mark.parametrize("run_id", NASTY_RUN_IDS)
@pytest.mark.parametrize("framework,api", [("horovod", "mpijob"), ("ddp", "trainjob"), ("ddp", "pytorchjob")])
def test_any_run_id_gives_names_and_labels_kubernetes_takes(run_id, framework, api):
    nodes = 12
    m = k8s.manifest_for_request(request(np=str(2 * nodes), nodes=str(nodes), framework=framework,
                                         run_id=run_id),
                                 k8s.K8sOptions(registry="reg.example/lab", api=api))
    validate(m.body)
    meta = m.body["metadata"]
    assert DNS_LABEL.match(meta["name"]) and len(meta["name"]) <= 63
    for value in meta["labels"].values():
        assert LABEL_VALUE_RULE.match(value) and len(value) <= 63, value
    if api == "trainjob":   # the JobSet of that name, its longest pod's name
        pod = f"{meta['name']}-node-{nodes - 1}-0-abcde"
        assert DNS1035.match(pod) and len(pod) <= 63, pod


def test_run_ids_that_differ_only_where_a_name_is_cut_keep_different_names():
    ids = ["r" * 70 + "a", "r" * 70 + "b", "Run-A", "run-a", "run-a-"]
    names = {k8s.manifest_for_request(request(np="4", nodes="2", framework="ddp", run_id=i),
                                      k8s.K8sOptions(registry="r")).name for i in ids}
    labels = {k8s.label_value(i) for i in ids}
    assert len(names) == len(ids) and len(labels) == len(ids)
    assert k8s.label_value("plain-run_1.2") == "plain-run_1.2"     # a valid one is kept


@pytest.mark.parametrize("opts,words", [
    (dict(namespace="Bad_NS!"), "--namespace 'Bad_NS!' is no Kubernetes namespace name"),
    (dict(namespace="a" * 64), "is no Kubernetes namespace name"),
    (dict(pvc="UPPER_case"), "--pvc 'UPPER_case' is no PersistentVolumeClaim name"),
    (dict(pvc="claim-"), "is no PersistentVolumeClaim name"),
])
def test_a_namespace_or_claim_kubernetes_refuses_is_one_sentence(opts, words):
    with pytest.raises(BenchError, match=re.escape(words)):
        k8s.manifest_for_request(request(np="4", nodes="2"), k8s.K8sOptions(registry="r", **opts))
    ok = k8s.manifest_for_request(request(np="4", nodes="2"),
                                  k8s.K8sOptions(registry="r", namespace="team-a", pvc="lab.results-1"))
    assert ok.body["metadata"]["namespace"] == "team-a"


def test_ddp_over_mpi_is_refused_as_bench_refuses_it(tmp_path):
    cp = invoke("--np", "4", "--nodes", "2", "--framework", "ddp", "--backend", "mpi", "--registry", "r",
                "--results-dir", str(tmp_path), cwd=tmp_path)
    assert cp.returncode == 2 and "Traceback" not in cp.stderr
    assert "no mpi back end for DDP" in cp.stderr and "--framework horovod" in cp.stderr
    assert not list(tmp_path.rglob("*.yaml"))


def test_the_mpijob_launcher_is_not_restarted():
    launcher = horovod_nccl()["spec"]["mpiReplicaSpecs"]["Launcher"]
    assert launcher["restartPolicy"] == "Never"


def test_the_seed_reaches_the_manifest_and_the_help_promises_no_sweep(tmp_path):
    cp = invoke("--np", "2", "--seed", "7", "--registry", "r", "--results-dir", str(tmp_path),
                "--run-id", "s", cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    body = yaml.safe_load((tmp_path / "s" / "k8s" / "trainjob.yaml").read_text())
    command = " ".join(body["spec"]["trainer"]["command"])
    assert "--seed 7" in command
    helps = subprocess.run([sys.executable, "-m", "invoke", "-r", str(REPO), "k8s", "--help"],
                           capture_output=True, text=True, cwd=tmp_path).stdout
    assert "comma list" not in helps and "sweep" not in helps and "--seed" in helps
