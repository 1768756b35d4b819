"""Reading a Kubernetes cluster for lab.host.places.k8s.runner, through the official client:
the connection from the kubeconfig, the labels and conditions Kubeflow's operators use
(each named with the release it was read from), and what keeps a pod from running, in
words. Tested against captured API objects (tests/fixtures/k8s/api/)."""
from __future__ import annotations

import json
import os

from lab.host.places.base import RunnerError

CLIENT_HINT = ("--launcher k8s submits jobs with the official Kubernetes client, which is not "
               "installed: pip install -e '.[k8s]'")
NO_CONFIG = ("--launcher k8s needs a kubeconfig ({why}): write ~/.kube/config (or point "
             "KUBECONFIG at one), or write the manifest with `invoke k8s` and apply it with kubectl")
PLURALS = {"MPIJob": "mpijobs", "TrainJob": "trainjobs", "PyTorchJob": "pytorchjobs"}
# The labels the operators put on the pods they make:
# - mpi-operator v0.8.0 pkg/apis/kubeflow/v2beta1/constants.go (JobNameLabel, JobRoleLabel),
#   set in pkg/controller/mpi_job_controller.go (defaultLabels: job-role launcher|worker);
# - training-operator v1.9.0 (PyTorchJob): pkg/apis/kubeflow.org/v1/common_types.go
#   (JobNameLabel, ReplicaTypeLabel), the replica type lower-cased on the pod
#   (pkg/controller.v1/common/pod.go: strings.ToLower, SetReplicaType): "master";
# - Trainer v2.3.0 runs a JobSet, whose pods carry jobset.sigs.k8s.io/jobset-name (Trainer
#   v2.3.0 examples/yaml/01-multi-node.yaml: kubectl logs -l jobset.sigs.k8s.io/jobset-name=
#   <name>), replicatedjob-name and job-index (JobSet v0.12.0 api/jobset/v1alpha2/
#   jobset_types.go, pkg/controllers/jobset_controller.go), and the Indexed Job's
#   batch.kubernetes.io/job-completion-index annotation (JobSet v0.12.0 pkg/util/placement:
#   index "0" is the leader): job 0 of the `node` replicated job, index 0, runs rank 0.
JOB_NAME = "training.kubeflow.org/job-name"
JOB_ROLE = "training.kubeflow.org/job-role"
REPLICA_TYPE = "training.kubeflow.org/replica-type"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
JOBSET_INDEX = "jobset.sigs.k8s.io/job-index"
REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
# The container whose log is rank 0's, by kind (the names lab.host.places.k8s.manifest gives them; the
# TrainJob's is the torch-distributed runtime's `node`).
RANK0_CONTAINER = {"MPIJob": "launcher", "TrainJob": "node", "PyTorchJob": "pytorch"}
# The terminal conditions (mpi-operator v0.8.0 and training-operator v1.9.0 JobCondition
# types Succeeded/Failed; Trainer v2.3.0 pkg/apis/trainer/v1alpha1/trainjob_types.go:
# TrainJobComplete "Complete", TrainJobFailed "Failed").
DONE = {"MPIJob": "Succeeded", "PyTorchJob": "Succeeded", "TrainJob": "Complete"}
# Containers waiting for one of these will not start by waiting (Kubernetes docs, "Images":
# ImagePullBackOff; "Debug Pods"; kubelet's reasons).
STUCK = {"ErrImagePull": "its image cannot be pulled", "ImagePullBackOff": "its image cannot be pulled",
         "InvalidImageName": "its image name is not valid",
         "CrashLoopBackOff": "its container keeps exiting",
         "CreateContainerConfigError": "its container cannot be configured"}


def client_modules():
    try:
        from kubernetes import client, config
    except ImportError:
        raise RunnerError(CLIENT_HINT) from None
    return client, config


def connect(namespace: str = ""):
    """(CoreV1Api, CustomObjectsApi, namespace, context) from the kubeconfig (KUBECONFIG or
    ~/.kube/config), or RunnerError in one sentence."""
    client, config = client_modules()
    # KUBECONFIG read now (the client reads it once, when it is imported), may be a list
    path = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    try:
        api = config.new_client_from_config(config_file=path)
        _, active = config.list_kube_config_contexts(config_file=path)
    except (config.ConfigException, OSError, TypeError, ValueError) as e:
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RunnerError(NO_CONFIG.format(why=why[:160])) from None
    ctx = (active or {}).get("context") or {}
    return (client.CoreV1Api(api), client.CustomObjectsApi(api),
            namespace or ctx.get("namespace") or "default", (active or {}).get("name", ""))


def api_sentence(e, what: str) -> str:
    """An ApiException as one sentence: the server's own message when it sent one."""
    body = getattr(e, "body", None)
    try:
        message = json.loads(body).get("message") if body else None
    except (TypeError, ValueError):
        message = None
    status = getattr(e, "status", None)
    hint = {401: "the kubeconfig's credentials were refused", 403: "your account may not do this here",
            404: "is the operator (its CRD) installed in this cluster?"}.get(status, "")
    said = message or getattr(e, "reason", None) or str(e)
    return f"{what} failed (HTTP {status}: {said})" + (f"; {hint}" if hint else "")


def assumed_stack(device: str, backend: str, api: str) -> dict:
    """What bench checks the request against: the kit's image as built from the version
    matrix (what the manifest pulls), not a probe (a cluster's nodes run no probe before
    the job): configuration checked only, as `invoke k8s` does."""
    unprobed = "not probed (the cluster's image)"
    stack = {"torch": unprobed, "cuda_available": device == "cuda", "gpus": 1 << 16, "cores": 0,
             "ddp_backends": {"gloo": True, "nccl": True, "mpi": False}, "torchvision": unprobed,
             "rpc": True, "deepspeed": unprobed, "mpirun": True, "configuration_only": True}
    if api in ("auto", "mpijob"):     # a TrainJob or PyTorchJob runs torchrun: DDP
        # The CPU image's Horovod has oneCCL's operations (docker/install-horovod.sh).
        stack["horovod"] = {"gloo": True, "mpi": True, "nccl": device == "cuda", "ccl": device == "cpu",
                            "gpu_operations": ("MPI" if backend == "mpi" else "NCCL")
                            if device == "cuda" else None}
    return stack


def pod_problem(pod) -> str | None:
    """What keeps a pod from running, as the words to put in a sentence, or None."""
    status = pod.status
    if status is None:
        return None
    for c in status.conditions or []:
        if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
            return f"it cannot be scheduled ({(c.message or '').strip()})"
    for cs in (status.init_container_statuses or []) + (status.container_statuses or []):
        waiting = cs.state.waiting if cs.state else None
        if waiting and waiting.reason in STUCK:
            said = f": {waiting.message.strip()}" if waiting.message else ""
            return f"{STUCK[waiting.reason]} ({waiting.reason}{said})"
    return None


def advice(problem: str) -> str:
    if "Insufficient nvidia.com/gpu" in problem:
        return ("no node has the GPUs it asks for free: lower --np, add --nodes, or set "
                "gpus_per_node in invoke.yaml's k8s: to what a node has")
    if "Insufficient" in problem:
        return "no node has the CPUs or memory it asks for free: lower --np or --threads, or add --nodes"
    if "cannot be scheduled" in problem:
        return "no node accepts it (taints, selectors or volumes): see kubectl describe pod"
    if "image" in problem:
        return ("push the image to the registry the cluster pulls from (the note of `invoke k8s` "
                "says how) or give --image with a reference it can pull")
    return "see kubectl describe pod and kubectl logs --previous"


def is_rank0(kind: str, pod) -> bool:
    labels = pod.metadata.labels or {}
    if kind == "MPIJob":
        return labels.get(JOB_ROLE) == "launcher"
    if kind == "PyTorchJob":
        return labels.get(REPLICA_TYPE, "").lower() == "master"
    index = (pod.metadata.annotations or {}).get(COMPLETION_INDEX) or labels.get(COMPLETION_INDEX)
    return labels.get(REPLICATED_JOB) == "node" and labels.get(JOBSET_INDEX) == "0" and index == "0"


def selector(kind: str, name: str) -> str:
    return f"{JOBSET_NAME}={name}" if kind == "TrainJob" else f"{JOB_NAME}={name}"


def condition(kind: str, job: dict) -> tuple[str, str] | None:
    """("ok" or "failed", reason and message) once the job's conditions say it ended."""
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("status") != "True":
            continue
        said = ": ".join(x for x in (c.get("reason"), c.get("message")) if x)
        if c.get("type") == DONE[kind]:
            return "ok", said
        if c.get("type") == "Failed":
            return "failed", said
    return None
