"""The Kubeflow job objects of lab.host.places.k8s.manifest, as pure functions (a job's pieces in, a dict
out): the pods' user, folders and volumes, the resources of a node, the run policy, and
the three kinds — mpi-operator's MPIJob, Kubeflow Trainer's TrainJob, training-operator's
PyTorchJob. lab.host.places.k8s.manifest decides what goes in them (API, image, environment, names)."""
from __future__ import annotations

import shlex

from lab.common import ompi

KINDS = {"mpijob": ("kubeflow.org/v2beta1", "MPIJob"),
         "trainjob": ("trainer.kubeflow.org/v1alpha1", "TrainJob"),
         "pytorchjob": ("kubeflow.org/v1", "PyTorchJob")}
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


def env_list(env: dict[str, str]) -> list[dict]:
    return [{"name": k, "value": str(v)} for k, v in env.items()]


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


def run_policy(timeout_s: float, max_restarts: int = 0) -> dict:
    """Pods that still run are removed when the job ends, a failed job is not retried
    (a benchmark that restarts measures something else) unless --max-restarts K asks for
    K retries, and the job's deadline is --timeout-s (kubeflow.org runPolicy:
    cleanPodPolicy, backoffLimit, activeDeadlineSeconds; the RunPolicy.BackoffLimit of
    training-operator v1.9.0 pkg/apis/kubeflow.org/v1/common_types.go and of mpi-operator
    v0.8.0 pkg/apis/kubeflow/v2beta1/types.go, "number of retries before marking this job
    failed")."""
    policy = {"cleanPodPolicy": "Running", "backoffLimit": max(int(max_restarts or 0), 0)}
    if timeout_s and timeout_s > 0:
        policy["activeDeadlineSeconds"] = int(-(-timeout_s // 1))
    return policy


# The replica restart policy that retries a failed pod, with --max-restarts (else Never):
# - mpi-operator v0.8.0 accepts Never or OnFailure for a replica (pkg/apis/kubeflow/
#   validation/validation.go, validRestartPolicies); the launcher is a batch/v1 Job whose
#   BackoffLimit is runPolicy.backoffLimit (pkg/controller/mpi_job_controller.go,
#   newLauncherJob) and whose pod gets the replica's policy (setRestartPolicy); OnFailure
#   is the operator's own default for the launcher (v2beta1/constants.go,
#   DefaultLauncherRestartPolicy): the launcher's container is rerun, and with it mpirun
#   or horovodrun over the workers' sshd (which do not fail, so stay Never).
# - training-operator v1.9.0: Always, OnFailure, Never or ExitCode (v1/common_types.go,
#   RestartPolicy). ExitCode retries only exit codes 128-255 (pkg/util/train/
#   train_util.go, IsRetryableExitCode) by deleting the pod, and the pod it makes runs
#   with Never (pkg/core/pod.go, SetRestartPolicy), so its containers'
#   restart counts, which backoffLimit is checked against (pkg/core/job.go,
#   PastBackoffLimit: OnFailure, Always or ExitCode pods, their containers' RestartCount
#   summed), stay 0; and the container's process is torchrun, which exits 1 when a rank
#   dies (even a SIGKILLed one, 137): a permanent error under ExitCode. OnFailure retries
#   any failed container in place (pkg/controller.v1/common/pod.go, ReconcilePods) and
#   counts against backoffLimit.
RETRY_POLICY = "OnFailure"


def restart_policy(max_restarts: int) -> str:
    return RETRY_POLICY if max_restarts else "Never"


def resuming(cmd: list[str], folder: str) -> list[str]:
    """The command as a retried pod resumes it: the worker's --restart 1 (it loads the
    newest checkpoint and --fault does not fire again: lab.worker.checkpoint.resume,
    lab.worker.train) once the checkpoint folder of the manifest's attempt exists on the
    volume; --restart 0 before. The folder is keyed by the attempt the host wrote into
    the manifest (lab.host.places.k8s.manifest.new_attempt), so only the pods of this
    manifest make it (at their first checkpoint, after every rank has started): a folder
    left by another attempt is never resumed. A PyTorchJob's pods each decide, and their
    ranks then agree on the largest (lab.common.restarts.AGREE_VAR), so a pod retried
    while rank 0 was writing the first checkpoint does not resume alone."""
    script = (f"r=0; if [ -d {shlex.quote(folder)} ]; then r=1; fi; "
              f"exec {shlex.join(cmd)} --restart \"$r\"")
    return ["bash", "-c", script]


def mpijob(meta: dict, image: str, s, np: int, per: int, gpus: int, worker_args: list[str],
           env: dict[str, str], pvc: str, results_file: str, controller: str, resume: str = "") -> dict:
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
        # The same transports as horovodrun --mpi's (lab.common.ompi.TRANSPORTS).
        mpirun = ["mpirun", "--prefix", OPENMPI_PREFIX[s.device], "-np", str(np),
                  "-bind-to", "none", "-map-by", "slot", *ompi.mca_args(), "-mca",
                  "plm_rsh_args", ssh]
        cmd = [*mpirun, "-x", "PATH", *[w for k in env for w in ("-x", k)], *worker]
    if resume:
        cmd = resuming(cmd, resume)
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
            "runPolicy": run_policy(s.timeout_s, s.max_restarts),
            "mpiImplementation": "OpenMPI",
            "sshAuthMountPath": SSH_DIR,
            # the launcher starts when every worker is Ready, so its first SSH finds sshd
            "launcherCreationPolicy": "WaitForWorkersReady",
            "mpiReplicaSpecs": {
                # not restarted without --max-restarts: the operator's default for the
                # launcher is OnFailure (mpi-operator v0.8.0 pkg/apis/kubeflow/v2beta1/
                # default.go, setDefaultsTypeLauncher), which reruns a benchmark that failed
                "Launcher": {"replicas": 1, "restartPolicy": restart_policy(s.max_restarts),
                             "template": {"metadata": labels, "spec": {
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
               env: dict[str, str], pvc: str, results_file: str, resume: str = "") -> dict:
    """training-operator v1.9.0's PyTorchJob (manifests/base/crds/kubeflow.org_pytorchjobs
    .yaml): a Master and nodes-1 Workers, the container named `pytorch` (the operator's
    default container, pkg/apis/kubeflow.org/v1/pytorch_types.go), nprocPerNode a string."""
    vols, mounts = volumes(pvc)
    cmd = torchrun(s.nodes, per, worker_args)
    if resume:
        cmd = resuming(cmd, resume)

    def replicas(n: int) -> dict:
        container = {"name": "pytorch", "image": image,
                     "command": with_records(cmd, results_file, pvc),
                     "env": env_list(env), "resources": resources(s.device, gpus, per * s.threads),
                     "volumeMounts": mounts}
        return {"replicas": n, "restartPolicy": restart_policy(s.max_restarts), "template": {
            "metadata": {"labels": dict(meta["labels"])},
            "spec": {"securityContext": SECURITY, "containers": [container], "volumes": vols}}}
    specs = {"Master": replicas(1)}
    if s.nodes > 1:
        specs["Worker"] = replicas(s.nodes - 1)
    return {"apiVersion": KINDS["pytorchjob"][0], "kind": KINDS["pytorchjob"][1], "metadata": meta,
            "spec": {"nprocPerNode": str(per), "runPolicy": run_policy(s.timeout_s, s.max_restarts),
                     "pytorchReplicaSpecs": specs}}
