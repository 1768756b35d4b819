"""Kubernetes as a place to run: the same bench request as a manifest for Kubeflow's
operators, built by pure functions (settings in, a dict out; nothing is submitted here):
- an MPIJob (mpi-operator, kubeflow.org/v2beta1) for Horovod: a launcher pod runs
  horovodrun or mpirun, which reach the worker pods over SSH;
- a TrainJob (Kubeflow Trainer, trainer.kubeflow.org/v1alpha1, runtime torch-distributed)
  for DDP and the torch strategies: torchrun in every node;
- a PyTorchJob (training-operator, kubeflow.org/v1, `--api pytorchjob`) for clusters
  that still run the older operator.
The objects themselves are lab.host.places.k8s.jobs'; here: the options, the API for a
framework and strategy, the image, the environment, the names, the files. The shapes follow
the operators' releases (named where each fact is used); tests check them against their CRD
schemas (tests/fixtures/k8s/). Never run on a live cluster here."""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass

from lab.common import restarts, results
from lab.common.docker_api import IMAGE_REPO, LABEL_PREFIX, MANAGED_BY
from lab.common.forwarded_env import forwarded
from lab.common.kit import NO_MPI_IN_PIP_TORCH, horovod_gpu_path_problem, kit_version
from lab.host.errors import BenchError
from lab.host.images.build import BuildSettings, tags
from lab.host.places.k8s.jobs import (  # noqa: F401 (the job objects' facts, used here and by k8s_runner)
    DATA_IN_POD,
    KINDS,
    RECORD_PREFIX,
    RESULTS_IN_POD,
    mpijob,
    pytorchjob,
    trainjob,
)
from lab.host.places.launch import framework_for_backend, resolve_framework
from lab.host.places.launch import job_env as bench_env
from lab.host.places.scripts import gpus_per_node, script_config
from lab.host.settings import check_max_restarts

APIS = ("auto", "mpijob", "trainjob", "pytorchjob")
RUN_ID_LABEL = LABEL_PREFIX + "run-id"


@dataclass
class K8sOptions:
    api: str = "auto"                 # auto | mpijob | trainjob | pytorchjob
    registry: str = ""                # REGISTRY[/PATH] the cluster pulls the kit's image from
    image: str = ""                   # or the whole image reference
    gpus_per_node: int | None = None  # default with --device cuda: the ranks per node
    pvc: str = ""                     # a PersistentVolumeClaim for results/ and data/
    namespace: str = ""
    runtime: str = "torch-distributed"   # TrainJob: the ClusterTrainingRuntime


def options(values: dict) -> K8sOptions:
    """invoke.yaml's `k8s:` defaults with the flags over them."""
    known = {f.name for f in dataclasses.fields(K8sOptions)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise BenchError(f"invoke.yaml's k8s: has no setting {unknown[0]!r}: use "
                         f"{', '.join(sorted(known))}")
    return K8sOptions(**values)


def choose_api(api: str, framework: str, strategy: str) -> str:
    """The operator that can start this framework, or one sentence why the chosen one cannot."""
    if api not in APIS:
        raise BenchError(f"--api is one of {', '.join(APIS)}, not {api!r}")
    if framework == "none" or strategy == "dataparallel":
        raise BenchError("dataparallel runs one process on one machine, which needs no "
                         "operator: run it with invoke bench, or pick another --strategy")
    if api == "auto":
        return "mpijob" if framework == "horovod" else "trainjob"
    if framework == "horovod" and api != "mpijob":
        raise BenchError(f"Horovod starts its ranks with horovodrun or mpirun, which a "
                         f"{KINDS[api][1]} cannot do (it runs torchrun in each pod): "
                         f"use --api mpijob")
    if framework == "ddp" and api == "mpijob":
        raise BenchError(f"--strategy {strategy} starts with torchrun, not mpirun (the image's torch, "
                         f"PyTorch's wheels, has no MPI back end): use --api trainjob (or pytorchjob)")
    return api


def image_ref(device: str, framework: str, backend: str, registry: str, image: str) -> tuple[str, str]:
    """The kit's image for the run, from the version matrix's tags (lab.host.images.build.tags)
    under the user's registry (a cluster cannot see this machine's images), and the local
    tag it is pushed from."""
    if image:
        return image, image
    if not registry:
        raise BenchError(f"a cluster pulls the image from a registry: give --registry "
                         f"REGISTRY/PATH (after `docker tag` and `docker push` of the built "
                         f"image) or --image with the whole reference (on a kind cluster, "
                         f"`kind load docker-image {IMAGE_REPO}:cpu` then --image {IMAGE_REPO}:cpu)")
    ops = "MPI" if (framework == "horovod" and backend == "mpi") else ""
    build = BuildSettings(flavor="gpu", gpu_ops=ops) if device == "cuda" else BuildSettings(flavor="cpu")
    tag = tags(build, kit_version())[-1]       # the one with the kit's version
    return f"{registry.rstrip('/')}/{tag}", tag


def job_env(s, device: str, given: dict | None = None, environ=None) -> dict[str, str]:
    """The pods' environment, the one place it is made for `invoke k8s` and `invoke bench
    --launcher k8s` alike: the bench's per-rank environment (or the launch's, `given`),
    the host's NCCL_*, UCX_*, OMPI_MCA_*, ... of `environ` (os.environ by default;
    lab.common.forwarded_env, the one list: a pod has a network of its own, so interface
    names stay home), and what a pod network needs."""
    env = dict(bench_env(s) if given is None else given)
    env.update(forwarded(os.environ if environ is None else environ, own_network=True))
    if device == "cuda":
        # NCCL says why it failed (NCCL's docs: NCCL_DEBUG=WARN prints an error's cause),
        # and talks over the pod's interface (eth0 on the common CNIs) rather than guessing.
        # Defaults only: a value the user forwarded (NCCL_DEBUG=INFO, say) wins, as on
        # every other place.
        for k, v in (("NCCL_DEBUG", "WARN"), ("NCCL_SOCKET_IFNAME", "eth0")):
            env.setdefault(k, v)
    return env


@dataclass
class Manifest:
    api: str
    kind: str
    name: str
    run_id: str
    body: dict
    notes: list[str]
    attempt: str = ""       # a job that resumes: the attempt its pods resume (new_attempt)


def new_attempt(launch: str) -> str:
    """The attempt of one written manifest whose job resumes from its checkpoints: its
    launch name and when it was written, with random digits (lab.common.results.new_run_id),
    so that no two writes share one. The checkpoint folder is keyed by it
    (lab.common.restarts.folder), so a retried pod resumes only what its own job wrote;
    a manifest written again starts afresh beside the old checkpoints."""
    return f"{launch}-{results.new_run_id()}"


def manifest_for_request(s, opts: K8sOptions, run=None, env: dict | None = None) -> Manifest:
    """The manifest of one bench request (lab.host.settings.BenchSettings) for a cluster
    with Kubeflow's operators. Nothing is probed: the request is checked as a
    configuration; --framework auto means Horovod for --api mpijob, else DDP. `run` and
    `env`: bench's own launch (lab.host.places.k8s.runner), its RunConfig and rank environment."""
    nps = s.np if isinstance(s.np, list) else [s.np]
    if len(nps) != 1:
        raise BenchError("a Kubernetes job runs one process count: give --np one number")
    np = nps[0]
    check_names(opts)
    notes: list[str] = []
    # auto as for the stack the API's pods run: an MPIJob's launcher runs horovodrun (the
    # lab image has Horovod), a TrainJob's or PyTorchJob's pods torchrun (ddp).
    framework = resolve_framework(s.framework, {"horovod": True} if opts.api == "mpijob" else {},
                                  s.strategy)[0]
    if s.framework == "auto" and s.strategy == "ddp":
        notes.append(f"--framework auto is {framework} in a manifest for a cluster (what is "
                     f"installed there is not known here)")
    api = choose_api(opts.api, framework, s.strategy)
    if framework == "ddp" and s.backend == "mpi":
        # what bench's check says of a stack without it (lab.host.request.checks.check_request):
        # the image's torch is pip's, whose every pod would fail at init_process_group
        raise BenchError(f"the lab image's torch has no mpi back end for DDP: {NO_MPI_IN_PIP_TORCH}")
    check_restarts(s, api, opts.pvc)
    gpus = gpus_per_node(s, np, opts.gpus_per_node)
    per = np // s.nodes
    inside = dataclasses.replace(s, results_dir=RESULTS_IN_POD, data_dir=DATA_IN_POD)
    cfg = run or script_config(inside, framework, np)
    # a job whose pods are retried from its checkpoints: an attempt of this write's own
    # (bench's launches have theirs: `run`)
    resumes = bool(s.max_restarts and s.checkpoint_every)
    if resumes and run is None:
        cfg = dataclasses.replace(cfg, attempt=new_attempt(cfg.attempt))
    run_id = cfg.run_id
    if framework == "horovod" and s.device == "cuda":
        # the image of --backend mpi does its GPU operations over MPI, the others over NCCL
        problem = horovod_gpu_path_problem("MPI" if s.backend == "mpi" else "NCCL", s.backend)
        if problem:
            raise BenchError(problem)
    image, local = image_ref(s.device, framework, s.backend, opts.registry, opts.image)
    # bench's launches of one run each get a job of their own: a deleted job stays
    # visible until its pods are gone (Foreground deletion), so a repeated name would
    # meet the last launch's job (409 AlreadyExists). So does each attempt of a job that
    # resumes: kubectl apply of a new one creates a job rather than patching the old.
    unique = cfg.attempt if run is not None or resumes else ""
    name = dns_name(f"lab-{run_id}", name_limit(api, s.nodes), unique)
    labels = {MANAGED_BY: "k8s", RUN_ID_LABEL: label_value(run_id)}
    meta: dict = {"name": name, "labels": labels}
    if opts.namespace:
        meta["namespace"] = opts.namespace
    results_file = f"{RESULTS_IN_POD}/{run_id}/{results.RESULTS_FILE}"
    env = job_env(inside, s.device, env)
    args = cfg.to_args()
    # a retried pod resumes from its attempt's checkpoints on the volume (lab.common.restarts.folder)
    resume = restarts.folder(f"{RESULTS_IN_POD}/{run_id}", cfg.attempt) if resumes else ""
    if resumes and api == "pytorchjob":
        # each pod decides for itself: the ranks take the largest decision of them all
        env[restarts.AGREE_VAR] = "1"
    if api == "mpijob":
        controller = framework_for_backend("horovod", s.backend)
        body = mpijob(meta, image, inside, np, per, gpus, args, env, opts.pvc, results_file, controller,
                      resume)
    elif api == "trainjob":
        body = trainjob(meta, image, inside, per, gpus, args, env, opts.pvc, results_file, opts.runtime)
    else:
        body = pytorchjob(meta, image, inside, per, gpus, args, env, opts.pvc, results_file, resume)
    if not opts.image:
        notes.append(f"the cluster pulls {image}: push it there first with `docker tag "
                     f"{local} {image} && docker push {image}`")
    if not opts.pvc:
        notes.append(f"no --pvc: the record stays in the pod; the job prints it in its log "
                     f"after {RECORD_PREFIX!r}")
    if resumes and run is None:
        notes.append(f"{CONTINUES} (attempt {cfg.attempt})")
    return Manifest(api, KINDS[api][1], name, run_id, body, notes, cfg.attempt if resumes else "")


# What applying a manifest that resumes means, said by invoke k8s and in the file.
CONTINUES = ("applying this manifest again continues its job from its checkpoints on the volume; "
             "`invoke k8s` again writes a new attempt, which starts afresh")


# Kubernetes' rules (k8s.io/apimachinery pkg/util/validation/validation.go): a namespace
# is a DNS-1123 label (IsDNS1123Label: at most 63), a PersistentVolumeClaim's name a
# DNS-1123 subdomain (IsDNS1123Subdomain: at most 253), a label value at most 63 of
# IsValidLabelValue's pattern (empty, or alphanumeric at both ends).
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# The longest an operator's pods make of a job's name: mpi-operator's
# <name>-launcher-xxxxx and <name>-worker-<i>, training-operator's <name>-master-0.
NAME_MAX = 52


def check_names(opts: K8sOptions) -> None:
    """--namespace and --pvc as Kubernetes takes them, or one sentence each."""
    if opts.namespace and not (len(opts.namespace) <= 63 and DNS1123_LABEL.match(opts.namespace)):
        raise BenchError(f"--namespace {opts.namespace!r} is no Kubernetes namespace name (at most 63 "
                         f"lower-case letters, digits and '-', a letter or digit at each end): "
                         f"`kubectl get namespaces` lists the cluster's")
    if opts.pvc and not (len(opts.pvc) <= 253 and DNS1123_SUBDOMAIN.match(opts.pvc)):
        raise BenchError(f"--pvc {opts.pvc!r} is no PersistentVolumeClaim name (at most 253 lower-case "
                         f"letters, digits, '-' and '.', a letter or digit at each end): "
                         f"`kubectl get pvc` lists the namespace's claims")


def check_restarts(s, api: str, pvc: str) -> None:
    """--max-restarts and --checkpoint-every as a job can honour them, or one sentence.
    A TrainJob cannot: Kubeflow Trainer v2.3.0's TrainJob has no backoffLimit or restart
    policy, and its runtimePatches reach only the runtime's replicated jobs' pod template
    (manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml: spec.runtimePatches[].
    trainingRuntimeSpec.template.spec holds replicatedJobs alone, each job's spec its
    template alone), not the JobSet's failurePolicy. A checkpoint a retried pod can read
    must outlive the pod and be seen by every node: a PVC (an emptyDir goes with its pod)."""
    check_max_restarts(s)
    if s.max_restarts and api == "trainjob":
        raise BenchError(f"--max-restarts {s.max_restarts} is not honoured by a TrainJob (Kubeflow "
                         f"Trainer v2.3.0 offers no backoffLimit or restart policy in it): leave it "
                         f"out, or use --api pytorchjob (api: pytorchjob in invoke.yaml's k8s:)")
    if s.checkpoint_every and not pvc:
        raise BenchError(f"--checkpoint-every {s.checkpoint_every} needs a persistent volume that a "
                         f"restarted pod can read the checkpoints from (without one they go with the "
                         f"pod): give --pvc CLAIM (pvc: in invoke.yaml's k8s:)")


def name_limit(api: str, nodes: int) -> int:
    """The longest job name the API's pods allow. A TrainJob's JobSet (same name) names
    its pods <name>-node-<job>-<pod>-xxxxx, and JobSet's webhook refuses a JobSet whose
    longest pod name passes 63 (jobset pkg/webhooks/jobset_webhook.go, ValidateCreate:
    placement.GenPodName(...) + "-abcde" through IsDNS1035Label); the torch runtime's
    replicated job is `node`, one pod per job."""
    if api == "trainjob":
        return min(NAME_MAX, 63 - len("-abcde") - len(f"-node-{nodes - 1}-0"))
    return NAME_MAX


def _digest(text: str) -> str:
    import hashlib
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def dns_name(text: str, limit: int = NAME_MAX, unique: str = "") -> str:
    """An object name Kubernetes takes (RFC 1123 label: lower case, digits and '-', a
    letter or digit at each end) within `limit`; cut or lower-cased, or with `unique`
    given, it ends in a digest of what it stands for, so different run ids (or launches)
    never meet in one name."""
    out = "".join(c if c.isalnum() and c.isascii() else "-" for c in text.lower()).strip("-")
    if out == text and len(out) <= limit and not unique:
        return out
    tail = _digest(text + unique)
    return f"{out[:limit - len(tail) - 1].rstrip('-')}-{tail}".lstrip("-")


def label_value(text: str) -> str:
    """A label value for `text` (IsValidLabelValue); one that had to change (too long,
    or a character or an end the rule refuses) ends in a digest of the whole."""
    if len(text) <= 63 and LABEL_VALUE.match(text):
        return text
    kept = re.sub(r"[^-A-Za-z0-9_.]", "-", text)
    return f"{kept[:54].strip('-_.')}-{_digest(text)}".lstrip("-_.")


def to_yaml(body: dict) -> str:
    """YAML as people write it: keys in the kit's order, no anchors for repeated parts."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data):
            return True
    return yaml.dump(body, Dumper=Dumper, sort_keys=False, default_flow_style=False, width=100)


def write(m: Manifest, results_dir: str) -> str:
    """results/<run-id>/k8s/<kind>.yaml; its path (one sentence when it cannot be written)."""
    import os
    folder = os.path.join(results_dir, m.run_id, "k8s")
    path = os.path.join(folder, f"{m.kind.lower()}.yaml")
    header = (f"# dl-lab-kit (invoke k8s): {m.kind} {m.name}, written for a cluster with "
              f"Kubeflow's operator.\n# Apply: kubectl apply -f {path}\n")
    if m.attempt:
        header += f"# Attempt {m.attempt}: {CONTINUES}.\n"
    try:
        os.makedirs(folder, exist_ok=True)
        with open(path, "w") as f:
            f.write(header + to_yaml(m.body))
    except OSError as e:
        raise BenchError(f"--results-dir {results_dir} cannot be written ({e.strerror}): give a "
                         f"folder that can be created and written") from None
    return path
