"""Kubernetes as a place to run: the same bench request as a manifest for Kubeflow's
operators, built by pure functions (settings in, a dict out; nothing is submitted here):
- an MPIJob (mpi-operator, kubeflow.org/v2beta1) for Horovod: a launcher pod runs
  horovodrun or mpirun, which reach the worker pods over SSH;
- a TrainJob (Kubeflow Trainer, trainer.kubeflow.org/v1alpha1, runtime torch-distributed)
  for DDP and the torch strategies: torchrun in every node;
- a PyTorchJob (training-operator, kubeflow.org/v1, `--api pytorchjob`) for clusters
  that still run the older operator.
The shapes follow the operators' releases (named where each fact is used); tests check
them against their CRD schemas (tests/fixtures/k8s/). Never run on a live cluster here."""
from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass

from lab.common.docker_api import LABEL_PREFIX, MANAGED_BY
from lab.host.request import BenchError, resolve_framework, script_config

APIS = ("auto", "mpijob", "trainjob", "pytorchjob")
KINDS = {"mpijob": ("kubeflow.org/v2beta1", "MPIJob"),
         "trainjob": ("trainer.kubeflow.org/v1alpha1", "TrainJob"),
         "pytorchjob": ("kubeflow.org/v1", "PyTorchJob")}
RUN_ID_LABEL = LABEL_PREFIX + "run-id"
# The user who runs jobs in the image (docker/Dockerfile: lab, uid 1000, home /home/lab).
# Results and data go under one folder, /lab: the PVC when one is named, else an emptyDir;
# the pods' fsGroup makes either writable by that user.
LAB_UID, LAB_HOME, LAB_DIR = 1000, "/home/lab", "/lab"
RESULTS_IN_POD, DATA_IN_POD = f"{LAB_DIR}/results", f"{LAB_DIR}/data"
# The prefix of Open MPI in each flavor (docker/Dockerfile's PATH: /opt/openmpi/bin in the
# GPU flavor; the CPU flavor has Debian's openmpi-bin in /usr). Ranks started over SSH do
# not get the image's ENV PATH, and mpirun --prefix tells the remote side where orted is
# (Open MPI 4.1 mpirun(1), "Remote Execution").
OPENMPI_PREFIX = {"cuda": "/opt/openmpi", "cpu": "/usr"}
# sshd of the worker pods, as the user lab: mpi-operator's non-root example runs it on
# port 2222 with the job's SSH key (mounted at sshAuthMountPath from the Secret the
# operator makes) as host key and StrictModes off (mpi-operator v0.8.0 build/base/
# sshd_config and Dockerfile; examples/v2beta1/pi/pi.yaml: runAsUser 1000, sshd -De -f).
SSH_PORT = 2222
SSH_DIR = f"{LAB_HOME}/.ssh"
# A line the jobs print for each record when no volume keeps the results folder: the
# records can then be read back from the log (`sed -n 's/^lab-record: //p'`).
RECORD_PREFIX = "lab-record: "


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
    """The kit's image for the run, from the version matrix's tags (lab.host.images.tags)
    under the user's registry (a cluster cannot see this machine's images), and the local
    tag it is pushed from."""
    if image:
        return image, image
    if not registry:
        from lab.host.images import IMAGE_REPO
        raise BenchError(f"a cluster pulls the image from a registry: give --registry "
                         f"REGISTRY/PATH (after `docker tag` and `docker push` of the built "
                         f"image) or --image with the whole reference (on a kind cluster, "
                         f"`kind load docker-image {IMAGE_REPO}:cpu` then --image {IMAGE_REPO}:cpu)")
    from lab.common.kit import kit_version
    from lab.host.images import BuildSettings, tags
    ops = "MPI" if (framework == "horovod" and backend == "mpi") else ""
    build = BuildSettings(flavor="gpu", gpu_ops=ops) if device == "cuda" else BuildSettings(flavor="cpu")
    tag = tags(build, kit_version())[-1]       # the one with the kit's version
    return f"{registry.rstrip('/')}/{tag}", tag


def env_list(env: dict[str, str]) -> list[dict]:
    return [{"name": k, "value": str(v)} for k, v in env.items()]


def job_env(s, device: str, given: dict | None = None) -> dict[str, str]:
    """The bench's per-rank environment (or the one `given`), and what a pod network needs."""
    from lab.host.launch import job_env as bench_env
    env = dict(bench_env(s) if given is None else given)
    if device == "cuda":
        # NCCL says why it failed (NCCL's docs: NCCL_DEBUG=WARN prints an error's cause),
        # and talks over the pod's interface (eth0 on the common CNIs) rather than guessing.
        env.update(NCCL_DEBUG="WARN", NCCL_SOCKET_IFNAME="eth0")
    return env


def volumes(pvc: str) -> tuple[list[dict], list[dict]]:
    """/dev/shm as memory (a container's default is 64 MiB, too small for NCCL and
    DataLoader workers: Kubeflow Trainer v2.3.0 docs/user-guides/megatron.md, NVIDIA/nccl
    issue 525), and /lab on the PVC when one is named (else an emptyDir)."""
    lab = {"persistentVolumeClaim": {"claimName": pvc}} if pvc else {"emptyDir": {}}
    vols = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}, {"name": "lab", **lab}]
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"}, {"name": "lab", "mountPath": LAB_DIR}]
    return vols, mounts


# Pods run as the image's user; fsGroup makes the volumes writable by it (Kubernetes
# docs, "Configure a Security Context for a Pod or Container").
SECURITY = {"runAsUser": LAB_UID, "runAsGroup": LAB_UID, "fsGroup": LAB_UID}


def resources(device: str, gpus: int, cpus: int) -> dict:
    """A node's resources: its GPUs as a limit (the device plugin's nvidia.com/gpu is set
    in limits; Kubernetes docs, "Schedule GPUs"), and CPUs for its ranks as a request."""
    out: dict = {"requests": {"cpu": str(cpus)}}
    if device == "cuda":
        out["limits"] = {"nvidia.com/gpu": gpus}
    return out


def with_records(cmd: list[str], results_file: str, pvc: str, via: str = "") -> list[str]:
    """The command, and after it (its exit status kept) rank 0's records printed with
    RECORD_PREFIX when no volume keeps them; `via` runs the printing where rank 0 ran
    (a shell prefix such as an ssh to that pod)."""
    if pvc:
        return cmd
    show = f"{via}cat {shlex.quote(results_file)} 2>/dev/null | sed {shlex.quote(f's/^/{RECORD_PREFIX}/')}"
    script = f"{shlex.join(cmd)}; rc=$?; {show}; exit $rc"
    return ["bash", "-c", script]


def run_policy(timeout_s: float) -> dict:
    """Pods that still run are removed when the job ends, a failed job is not retried
    (a benchmark that restarts measures something else), and the job's deadline is
    --timeout-s (kubeflow.org runPolicy: cleanPodPolicy, backoffLimit, activeDeadlineSeconds)."""
    policy = {"cleanPodPolicy": "Running", "backoffLimit": 0}
    if timeout_s and timeout_s > 0:
        policy["activeDeadlineSeconds"] = int(-(-timeout_s // 1))
    return policy


def mpijob(meta: dict, image: str, s, np: int, per: int, gpus: int, worker_args: list[str],
           env: dict[str, str], pvc: str, results_file: str, controller: str) -> dict:
    """mpi-operator v0.8.0's MPIJob (manifests/base/kubeflow.org_mpijobs.yaml): a launcher
    that starts the ranks, and one worker pod per node serving SSH with `slotsPerWorker`
    slots. The operator writes the hostfile (/etc/mpi/hostfile, "host slots=N" lines) and
    points Open MPI at it (OMPI_MCA_orte_default_hostfile; pkg/controller/
    mpi_job_controller.go)."""
    ssh = f"-p {SSH_PORT} -o ConnectionAttempts=10 -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"
    # rank 0 runs in the first slot of the hostfile's first host (horovodrun and mpirun
    # -map-by slot number the ranks in the hostfile's order)
    first = "$(head -n1 /etc/mpi/hostfile | cut -d' ' -f1)"
    via = f'ssh {ssh} "{first}" '
    worker = ["python", "-m", "lab.worker.train", *worker_args]
    if controller == "gloo":
        # horovodrun reads the operator's hostfile (the same format; --hostfile) and
        # passes its environment on to the ranks itself.
        cmd = ["horovodrun", "-np", str(np), "--hostfile", "/etc/mpi/hostfile",
               "--ssh-port", str(SSH_PORT), "--gloo", *worker]
    else:
        # Sockets between pods (TCP, not InfiniBand or UCX): mpi-operator's Horovod example
        # (examples/v2beta1/horovod/tensorflow-mnist.yaml) passes -mca pml ob1 -mca btl
        # ^openib. Ranks started over SSH get the environment only through -x. The
        # command line's plm_rsh_args wins over the OMPI_MCA_plm_rsh_args the operator
        # sets (Open MPI reads the command line before the environment), so it keeps
        # the operator's ConnectionAttempts=10 and adds the port.
        mpirun = ["mpirun", "--prefix", OPENMPI_PREFIX[s.device], "-np", str(np),
                  "-bind-to", "none", "-map-by", "slot", "-mca", "pml", "ob1", "-mca", "btl",
                  "^openib", "-mca", "plm_rsh_args", ssh]
        cmd = [*mpirun, "-x", "PATH", *[w for k in env for w in ("-x", k)], *worker]
    vols, mounts = volumes(pvc)
    launcher = {"name": "launcher", "image": image,
                "command": with_records(cmd, results_file, pvc, via),
                "env": env_list(env), "volumeMounts": [m for m in mounts if m["name"] == "lab"],
                "resources": {"requests": {"cpu": "1"}}}
    sshd = {"name": "worker", "image": image,
            "command": ["/usr/sbin/sshd", "-De", "-p", str(SSH_PORT), "-o", f"PidFile={LAB_HOME}/sshd.pid",
                        "-o", f"HostKey={SSH_DIR}/id_rsa", "-o", "StrictModes=no"],
            "env": env_list(env), "resources": resources(s.device, gpus, per * s.threads),
            "volumeMounts": mounts}
    labels = {"labels": dict(meta["labels"])}
    return {
        "apiVersion": KINDS["mpijob"][0], "kind": KINDS["mpijob"][1], "metadata": meta,
        "spec": {
            "slotsPerWorker": per,
            "runPolicy": run_policy(s.timeout_s),
            "mpiImplementation": "OpenMPI",
            "sshAuthMountPath": SSH_DIR,
            # the launcher starts when every worker is Ready, so its first SSH finds sshd
            "launcherCreationPolicy": "WaitForWorkersReady",
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": {"metadata": labels, "spec": {
                    "securityContext": SECURITY, "containers": [launcher],
                    "volumes": [v for v in vols if v["name"] == "lab"]}}},
                "Worker": {"replicas": s.nodes, "template": {"metadata": labels, "spec": {
                    "securityContext": SECURITY, "containers": [sshd], "volumes": vols}}},
            },
        },
    }


def torchrun(nodes: int, per: int, worker_args: list[str]) -> list[str]:
    """torch.distributed.run with its node's place from the operator: both operators set
    PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT
    (Trainer v2.3.0 pkg/runtime/framework/plugins/torch/torch.go; training-operator
    v1.9.0 pkg/controller.v1/pytorch/envvar.go and master.go), which torchrun reads for
    the flags not given. Node 0 holds rank 0 (a static rendezvous keeps the node rank;
    Trainer's node 0 is the master, PET_MASTER_ADDR <job>-node-0-0.<job>)."""
    return ["python", "-m", "torch.distributed.run", f"--nnodes={nodes}",
            f"--nproc-per-node={per}", "-m", "lab.worker.train", *worker_args]


def trainjob(meta: dict, image: str, s, per: int, gpus: int, worker_args: list[str],
             env: dict[str, str], pvc: str, results_file: str, runtime: str) -> dict:
    """Kubeflow Trainer v2.3.0's TrainJob (manifests/base/crds/trainer.kubeflow.org_
    trainjobs.yaml) on the torch-distributed ClusterTrainingRuntime. Resources and env
    go in spec.trainer; volumes through runtimePatches, keyed by a manager, on the
    runtime's `node` job and container (examples/yaml/02-runtime-patches.yaml: env of
    the node container is forbidden in patches). TrainJob has no backoffLimit or
    cleanPodPolicy: the runtime's JobSet decides those."""
    vols, mounts = volumes(pvc)
    spec: dict = {
        "runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                       "name": runtime},
        "trainer": {"image": image,
                    "command": with_records(torchrun(s.nodes, per, worker_args), results_file, pvc),
                    "numNodes": s.nodes, "numProcPerNode": per, "env": env_list(env),
                    "resourcesPerNode": resources(s.device, gpus, per * s.threads)},
        "runtimePatches": [{"manager": "dl-lab-kit.org/invoke-k8s", "trainingRuntimeSpec": {
            "template": {"metadata": {"labels": dict(meta["labels"])}, "spec": {"replicatedJobs": [
                {"name": "node", "template": {"spec": {"template": {
                    "metadata": {"labels": dict(meta["labels"])},
                    "spec": {"securityContext": SECURITY, "volumes": vols,
                             "containers": [{"name": "node", "volumeMounts": mounts}]}}}}}]}}}}],
    }
    if s.timeout_s and s.timeout_s > 0:
        spec["activeDeadlineSeconds"] = int(-(-s.timeout_s // 1))
    return {"apiVersion": KINDS["trainjob"][0], "kind": KINDS["trainjob"][1], "metadata": meta,
            "spec": spec}


def pytorchjob(meta: dict, image: str, s, per: int, gpus: int, worker_args: list[str],
               env: dict[str, str], pvc: str, results_file: str) -> dict:
    """training-operator v1.9.0's PyTorchJob (manifests/base/crds/kubeflow.org_pytorchjobs
    .yaml): a Master and nodes-1 Workers, the container named `pytorch` (the operator's
    default container, pkg/apis/kubeflow.org/v1/pytorch_types.go), nprocPerNode a string."""
    vols, mounts = volumes(pvc)

    def replicas(n: int) -> dict:
        container = {"name": "pytorch", "image": image,
                     "command": with_records(torchrun(s.nodes, per, worker_args), results_file, pvc),
                     "env": env_list(env), "resources": resources(s.device, gpus, per * s.threads),
                     "volumeMounts": mounts}
        return {"replicas": n, "restartPolicy": "Never", "template": {
            "metadata": {"labels": dict(meta["labels"])},
            "spec": {"securityContext": SECURITY, "containers": [container], "volumes": vols}}}
    specs = {"Master": replicas(1)}
    if s.nodes > 1:
        specs["Worker"] = replicas(s.nodes - 1)
    return {"apiVersion": KINDS["pytorchjob"][0], "kind": KINDS["pytorchjob"][1], "metadata": meta,
            "spec": {"nprocPerNode": str(per), "runPolicy": run_policy(s.timeout_s),
                     "pytorchReplicaSpecs": specs}}


@dataclass
class Manifest:
    api: str
    kind: str
    name: str
    run_id: str
    body: dict
    notes: list[str]


def manifest_for_request(s, opts: K8sOptions, run=None, env: dict | None = None) -> Manifest:
    """The manifest of one bench request (lab.host.request.BenchSettings) for a cluster
    with Kubeflow's operators. Nothing is probed: the request is checked as a
    configuration; --framework auto means Horovod for --api mpijob, else DDP. `run` and
    `env`: bench's own launch (lab.host.k8s_runner), its RunConfig and rank environment."""
    from lab.common import results
    from lab.host.launch import framework_for_backend
    nps = s.np if isinstance(s.np, list) else [s.np]
    if len(nps) != 1:
        raise BenchError("a Kubernetes job runs one process count: give --np one number")
    np = nps[0]
    notes: list[str] = []
    if s.framework == "auto" and s.strategy == "ddp":
        framework = "horovod" if opts.api == "mpijob" else "ddp"
        notes.append(f"--framework auto is {framework} in a manifest for a cluster (what is "
                     f"installed there is not known here)")
    else:
        framework = resolve_framework(s.framework, {}, s.strategy)[0]
    api = choose_api(opts.api, framework, s.strategy)
    from lab.host.launch import HostsError, ranks_per_node
    try:
        per = ranks_per_node(np, s.nodes)       # the even-spread rule
    except HostsError as e:
        raise BenchError(str(e)) from None
    gpus = 0
    if s.device == "cuda":
        gpus = per if opts.gpus_per_node is None else opts.gpus_per_node
        if gpus < per:
            raise BenchError(f"--np {np} over {s.nodes} node(s) puts {per} ranks on each node, "
                             f"each needing a GPU of its own, and --gpus-per-node is {gpus}: "
                             f"lower --np, add --nodes, or raise --gpus-per-node")
    elif opts.gpus_per_node:
        raise BenchError("--gpus-per-node is for --device cuda: add it, or leave out --gpus-per-node")
    inside = dataclasses.replace(s, results_dir=RESULTS_IN_POD, data_dir=DATA_IN_POD)
    cfg = run or script_config(inside, framework, np)
    run_id = cfg.run_id
    if framework == "horovod" and s.device == "cuda":
        # the image of --backend mpi does its GPU operations over MPI, the others over NCCL
        from lab.common.kit import horovod_gpu_path_problem
        problem = horovod_gpu_path_problem("MPI" if s.backend == "mpi" else "NCCL", s.backend)
        if problem:
            raise BenchError(problem)
    image, local = image_ref(s.device, framework, s.backend, opts.registry, opts.image)
    name = dns_name(f"lab-{run_id}")
    if run is not None and cfg.attempt:
        # bench's launches of one run each get a job of their own: a deleted job stays
        # visible until its pods are gone (Foreground deletion), so a repeated name would
        # meet the last launch's job (409 AlreadyExists).
        import hashlib
        name = f"{name[:43].rstrip('-')}-{hashlib.sha1(cfg.attempt.encode()).hexdigest()[:8]}"
    labels = {MANAGED_BY: "k8s", RUN_ID_LABEL: run_id[:63]}
    meta: dict = {"name": name, "labels": labels}
    if opts.namespace:
        meta["namespace"] = opts.namespace
    results_file = f"{RESULTS_IN_POD}/{run_id}/{results.RESULTS_FILE}"
    env = job_env(inside, s.device, env)
    args = cfg.to_args()
    if api == "mpijob":
        controller = framework_for_backend("horovod", s.backend)
        body = mpijob(meta, image, inside, np, per, gpus, args, env, opts.pvc, results_file, controller)
    elif api == "trainjob":
        body = trainjob(meta, image, inside, per, gpus, args, env, opts.pvc, results_file, opts.runtime)
    else:
        body = pytorchjob(meta, image, inside, per, gpus, args, env, opts.pvc, results_file)
    if not opts.image:
        notes.append(f"the cluster pulls {image}: push it there first with `docker tag "
                     f"{local} {image} && docker push {image}`")
    if not opts.pvc:
        notes.append(f"no --pvc: the record stays in the pod; the job prints it in its log "
                     f"after {RECORD_PREFIX!r}")
    return Manifest(api, KINDS[api][1], name, run_id, body, notes)


def dns_name(text: str) -> str:
    """An object name Kubernetes takes (RFC 1123 label: lower case, digits and '-', at
    most 63; the operators name pods after the job, so it is kept short)."""
    out = "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")
    return out[:52].rstrip("-")


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
    try:
        os.makedirs(folder, exist_ok=True)
        with open(path, "w") as f:
            f.write(header + to_yaml(m.body))
    except OSError as e:
        raise BenchError(f"--results-dir {results_dir} cannot be written ({e.strerror}): give a "
                         f"folder that can be created and written") from None
    return path
