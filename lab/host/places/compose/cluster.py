"""The simulated cluster of compose.yaml: bringing it up and down through whichever of
`docker compose` / `docker-compose` is installed, waiting for SSH between its nodes,
shaping their links with tc, and running a job from node1 across them.

Pure parts (host lists, the override file for more nodes, link specs and tc commands)
are separate from the edge (compose, the Docker SDK)."""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import time
from pathlib import Path

from lab.common import docker_api, proc
from lab.common.docker_api import CLUSTER as LABEL
from lab.common.kit import REPO_ROOT
from lab.common.link import DELAY, RATE, tbf_burst_bytes
from lab.host.images.choice import candidate_images, gpu_image, matrix_cudas
from lab.host.places.base import RunnerError
from lab.host.places.launch import Host, HostsError, ranks_per_node

COMPOSE_FILE = REPO_ROOT / "compose.yaml"
OVERRIDE_FILE = REPO_ROOT / ".cluster" / "compose.nodes.yaml"
GPU_FILE = REPO_ROOT / "compose.gpu.yaml"
# Compose labels every container with the folder of its compose file and with its
# project (docker-compose 1.29 and the v2 plugin alike); the kit finds this checkout's
# nodes by both and by its own label: `invoke up` and a plain `docker compose up` in the
# checkout are the same project (named after the folder, as Compose names it, unless
# COMPOSE_PROJECT_NAME names another), a cluster started from another checkout is never
# taken for this one, and two projects of one checkout (the test suite's, under a
# COMPOSE_PROJECT_NAME of its own, beside a user's) never meet.
WORKING_DIR = "com.docker.compose.project.working_dir"
PROJECT = "com.docker.compose.project"
# The folders compose.yaml mounts at /results and /data: LAB_RESULTS and LAB_DATA, else
# the checkout's results/ and data/ (a relative path is the checkout's, as Compose reads it).
RESULTS_VAR, DATA_VAR = "LAB_RESULTS", "LAB_DATA"
SSH_WAIT_S = 60
IFACE = "eth0"
# What schedules jobs on the cluster: none (bench starts the ranks over SSH) or slurm
# (slurmctld on node1, slurmd on every node: docker/cluster/slurm.sh).
SCHEDULERS = ("none", "slurm")
SLURM_WAIT_S = 60


class ClusterError(RunnerError):
    """Bad input or a cluster that is not there: one sentence that says what to do."""


# ---------------------------------------------------------------- pure

def mounted(var: str, default: str) -> Path:
    """The host folder compose.yaml mounts for `var` (RESULTS_VAR or DATA_VAR)."""
    return REPO_ROOT / os.path.expanduser(os.environ.get(var) or default)


def state_file() -> Path:
    """"nodes gpu" of the last `up` of this project (one file per project)."""
    return REPO_ROOT / ".cluster" / f"state-{project_name()}"


def node_names(n: int) -> list[str]:
    return [f"node{i}" for i in range(1, n + 1)]


def node_hosts(np: int, nodes: int) -> list[Host]:
    """np ranks spread evenly over the cluster's nodes: node1 with 2 slots, node2 with 2."""
    try:
        per = ranks_per_node(np, nodes)
    except HostsError as e:
        raise ClusterError(str(e)) from None
    return [Host(name, per) for name in node_names(nodes)]


def override_yaml(n: int) -> str:
    """node3..nodeN for `invoke up --nodes N`, each extending node1 (JSON, which is
    YAML too)."""
    services = {name: {"extends": {"file": "compose.yaml", "service": "node1"}, "hostname": name}
                for name in node_names(n)[2:]}
    return json.dumps({"services": services}, indent=2) + "\n"




def parse_link(spec: str) -> tuple[str, str | None]:
    """'10gbit' or '1gbit/1ms' -> (rate, delay or None); one sentence on bad input."""
    rate, _, delay = spec.partition("/")
    if not RATE.match(rate):
        raise ClusterError(f"--link takes RATE[/DELAY] such as 1gbit or 100mbit/1ms, not {spec!r}")
    if delay and not DELAY.match(delay):
        raise ClusterError(f"--link's delay takes a number and us, ms or s (such as 1ms), not {delay!r}")
    return rate.lower(), (delay.lower() or None)


def tc_commands(spec: str, iface: str = IFACE) -> list[list[str]]:
    """The tc command that shapes one node's cluster interface. Rate alone: a token
    bucket (tbf), with a bucket of at least one 1500-byte frame and about 4 ms of
    traffic; rate and delay: netem, which needs the kernel's sch_netem."""
    rate, delay = parse_link(spec)
    if delay:
        return [["tc", "qdisc", "replace", "dev", iface, "root", "netem", "delay", delay, "rate", rate]]
    return [["tc", "qdisc", "replace", "dev", iface, "root", "tbf", "rate", rate,
             "burst", str(tbf_burst_bytes(rate)), "latency", "50ms"]]


def compose_program() -> list[str]:
    """`docker compose` (the v2 plugin) when it answers, else `docker-compose`."""
    if shutil.which("docker"):
        if proc.run(["docker", "compose", "version"], timeout=30).ok:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise ClusterError("neither `docker compose` nor `docker-compose` is installed: "
                       "apt-get install docker-compose (or the Compose plugin)")


# ---------------------------------------------------------------- edge

def _compose(args: list[str], nodes: int, image: str | None = None, check=True,
             gpu: bool = False, timeout: float = 600, scheduler: str = "none") -> proc.Completed:
    files = ["-f", str(COMPOSE_FILE)]
    if gpu:
        files += ["-f", str(GPU_FILE)]
    if nodes > 2:
        files += ["-f", str(OVERRIDE_FILE)]
    env = dict(os.environ, LAB_NODES=str(nodes), LAB_SCHEDULER=scheduler)
    if image:
        env["LAB_IMAGE"] = image
    res = proc.run([*compose_program(), *files, *args], cwd=str(REPO_ROOT), env=env,
                   timeout=timeout)
    if check and not res.ok:
        tail = [line for line in res.tail if line.strip()][-3:]
        how = "did not finish in time" if res.timed_out else "failed"
        raise ClusterError(f"`compose {' '.join(args)}` {how}{': ' + ' / '.join(tail) if tail else ''}")
    return res


def engine():
    try:
        return docker_api.client()
    except docker_api.DockerUnavailable as e:
        raise ClusterError(f"{e}: {docker_api.START_HINT}") from None


def ours(labels: dict, root=REPO_ROOT) -> bool:
    """Whether a container Compose made belongs to the checkout at `root` and to its
    project (project_name: COMPOSE_PROJECT_NAME, else the folder's)."""
    where = labels.get(WORKING_DIR)
    return (bool(where) and os.path.realpath(where) == os.path.realpath(root)
            and labels.get(PROJECT) == project_name(root))


def nodes(client) -> dict[str, object]:
    """This checkout's node containers by host name (running or not)."""
    found = {}
    for c in client.containers.list(all=True, filters={"label": f"{LABEL}=node"}):
        if ours(c.labels):
            found[c.attrs["Config"]["Hostname"]] = c
    return dict(sorted(found.items(), key=lambda kv: int(kv[0][4:]) if kv[0][4:].isdigit() else 0))


def _gpu_image(client) -> str | None:
    """For `up --gpu`: the GPU image bench would take on this host (code for its GPUs, a
    CUDA its driver runs: lab.host.images.choice.gpu_image), None when no GPU image is built."""
    try:
        img = gpu_image(client, candidate_images("cuda", "ddp", "nccl", matrix_cudas()))
    except RunnerError as e:
        raise ClusterError(str(e)) from None
    return img.tags[0] if img is not None and img.tags else None


def up(n: int = 2, image: str | None = None, gpu: bool = False, echo=print,
       scheduler: str = "none", results_dir: str | None = None) -> dict:
    """Bring up n nodes; `results_dir`: the folder they mount at /results (sets
    RESULTS_VAR for compose and for this process, whose runners read the mount)."""
    if n < 1:
        raise ClusterError("--nodes must be at least 1")
    if scheduler not in SCHEDULERS:
        raise ClusterError(f"--scheduler is one of {', '.join(SCHEDULERS)}, not {scheduler!r}")
    if gpu and n > 2:
        raise ClusterError("compose.gpu.yaml gives GPUs to node1 and node2: add nodes to it for --gpu with more")
    client = engine()
    if image is None and gpu and not os.environ.get("LAB_IMAGE"):
        image = _gpu_image(client)
    if image is None:
        image = os.environ.get("LAB_IMAGE", f"{docker_api.IMAGE_REPO}:{'gpu-nccl' if gpu else 'cpu'}")
    import docker
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        raise ClusterError(f"the image {image} is not built: `invoke build"
                           f"{'' if gpu else ' --flavor cpu'}` (or name another with --image)") from None
    if scheduler == "slurm" and not has_slurm(client, image):
        raise ClusterError(f"the image {image} has no Slurm (built before the kit installed it): "
                           f"rebuild it with `invoke build`, or leave out --scheduler slurm")
    if results_dir:
        os.environ[RESULTS_VAR] = os.path.abspath(os.path.expanduser(results_dir))
    if n > 2:
        OVERRIDE_FILE.parent.mkdir(exist_ok=True)
        OVERRIDE_FILE.write_text(override_yaml(n))
    for var, default in ((RESULTS_VAR, "results"), (DATA_VAR, "data")):
        # made here, as the caller: Docker would make a missing one as root
        mounted(var, default).mkdir(parents=True, exist_ok=True)
    services = ["keygen", *node_names(n)]
    echo(f"bringing up {n} node(s) from {image}"
         f"{' with Slurm' if scheduler == 'slurm' else ''} ({' '.join(compose_program())})")
    state_file().parent.mkdir(exist_ok=True)
    state_file().write_text(f"{n} {int(gpu)}\n")
    _compose(["up", "-d", *services], n, image, gpu=gpu, scheduler=scheduler)
    found = wait_ssh(client, n, echo=echo)
    if scheduler == "slurm":
        wait_slurm(found, n, echo=echo)
    return found


def down(echo=print) -> tuple[list[str], dict[str, list[str]]]:
    """Remove the cluster: (what had to be removed after compose, which should be
    nothing; what is still there after that)."""
    cli = engine()
    n, gpu = max(2, len(nodes(cli))), False
    if state_file().exists():
        parts = state_file().read_text().split()
        n, gpu = max(n, int(parts[0])), parts[1:] == ["1"]
    _compose(["down", "-v", "--remove-orphans"], n, check=False, gpu=gpu)
    state_file().unlink(missing_ok=True)
    return remove_leftovers(cli), leftovers(cli)


def project_name(root=REPO_ROOT) -> str:
    """The project name Compose gives this checkout: COMPOSE_PROJECT_NAME, else the
    folder's name lowercased with what is not a letter, digit, - or _ left out (the
    rule of docker-compose 1.29 and of the v2 plugin)."""
    return os.environ.get("COMPOSE_PROJECT_NAME") or re.sub(
        r"[^-_a-z0-9]", "", Path(root).resolve().name.lower())


def _mine(cli) -> dict[str, list]:
    """This checkout's cluster: its containers (by the folder Compose recorded) and its
    network and key volume (by project), among what carries the cluster's label."""
    project = project_name()

    def of_project(item) -> bool:
        return (item.attrs.get("Labels") or {}).get(PROJECT) == project
    found = docker_api.labelled(cli, (LABEL,))
    return {"containers": [c for c in found["containers"] if ours(c.labels)],
            "networks": [x for x in found["networks"] if of_project(x)],
            "volumes": [v for v in found["volumes"] if of_project(v)]}


def leftovers(cli) -> dict[str, list[str]]:
    """This checkout's cluster containers, networks and volumes that still exist, by name."""
    return {kind: [x.name for x in items] for kind, items in _mine(cli).items()}


def remove_leftovers(cli) -> list[str]:
    import docker
    removed = []
    for kind, items in _mine(cli).items():
        for item in items:
            try:
                item.remove(force=True) if kind != "networks" else item.remove()
                removed.append(f"{kind[:-1]} {item.name}")
            except docker.errors.NotFound:
                continue
    return removed


def exec_out(container, cmd: list[str], user: str = "lab", env: dict | None = None,
             timeout: float = 30) -> tuple[int, str]:
    """Run a short command in a node and return (exit code, output); coreutils'
    `timeout` ends it after `timeout` seconds (exit code 124)."""
    # Whole seconds, at least 1: `timeout 0` would mean no limit at all.
    limit = str(max(1, math.ceil(timeout)))
    res = container.exec_run(["timeout", "-s", "KILL", limit, *cmd], user=user,
                             environment=env or {}, workdir="/tmp")
    return res.exit_code, res.output.decode(errors="replace")


def wait_ssh(client, n: int, timeout: float = SSH_WAIT_S, echo=print) -> dict:
    """Wait, at most `timeout` seconds, until node1 reaches every node over SSH."""
    deadline = time.monotonic() + timeout
    pending = node_names(n)
    last = ""
    while True:
        found = nodes(client)
        missing = [h for h in node_names(n) if h not in found or found[h].status != "running"]
        if not missing and "node1" in found:
            for h in list(pending):
                rc, out = exec_out(found["node1"], ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=3",
                                                     h, "true"])
                if rc == 0:
                    pending.remove(h)
                else:
                    last = out.strip().splitlines()[-1:] or [""]
                    last = last[0]
            if not pending:
                echo(f"cluster ready: {', '.join(node_names(n))} answer on SSH")
                return found
        if time.monotonic() > deadline:
            who = missing or pending
            raise ClusterError(f"{', '.join(who)} did not answer on SSH within {timeout:g} s"
                               f"{' (' + last + ')' if last else ''}: see `docker compose logs "
                               f"{who[0]}`, or bring the cluster up with `invoke up --nodes {n}`")
        time.sleep(1)


def has_slurm(client, image: str) -> bool:
    """Whether the image has Slurm's daemons (docker/install-slurm.sh): a one-second
    container, labelled as the kit's and removed."""
    import docker
    try:
        client.containers.run(image, ["test", "-x", "/usr/sbin/slurmctld"], entrypoint=[],
                              user="root", remove=True, network_mode="none",
                              labels={docker_api.MANAGED_BY: "cluster-check"})
        return True
    except docker.errors.ContainerError:
        return False


def idle_nodes(sinfo: str) -> list[str]:
    """Nodes that `sinfo -h -N -o '%N %t'` shows idle (its short state: idle, alloc,
    down, ...; a trailing * means not responding)."""
    out = []
    for line in sinfo.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] == "idle" and parts[0] not in out:
            out.append(parts[0])
    return out


def wait_slurm(found: dict, n: int, timeout: float = SLURM_WAIT_S, echo=print) -> None:
    """Wait, at most `timeout` seconds, until sinfo on node1 shows every node idle."""
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        rc, out = exec_out(found["node1"], ["sinfo", "-h", "-N", "-o", "%N %t"])
        last = out.strip()
        if rc == 0 and set(idle_nodes(out)) >= set(node_names(n)):
            echo(f"slurm ready: sinfo shows {', '.join(node_names(n))} idle")
            return
        if rc == 127:   # coreutils' timeout: the command was not found
            raise ClusterError("the image has no Slurm (no sinfo): rebuild it with `invoke build`, "
                               "or bring the cluster up without --scheduler slurm")
        if time.monotonic() > deadline:
            raise ClusterError(f"Slurm's nodes were not all idle within {timeout:g} s (sinfo: "
                               f"{' / '.join(last.splitlines()[-n:]) or 'no answer'}): see "
                               f"/var/log/slurm/slurmctld.log on node1 and slurmd.log on each node")
        time.sleep(1)


def shape(found: dict, spec: str, echo=print) -> None:
    """Apply --link to each node's cluster interface (as root, in each node)."""
    cmds = tc_commands(spec)
    for host, c in found.items():
        for cmd in cmds:
            rc, out = exec_out(c, cmd, user="root")
            if rc != 0:
                if "netem" in cmd and any(s in out.lower() for s in (
                        "unknown qdisc", "qdisc kind is unknown", "no such file", "not supported")):
                    raise ClusterError(f"this kernel has no netem (sch_netem), so a delay cannot be "
                                       f"set here: give --link a rate alone (such as "
                                       f"{parse_link(spec)[0]})")
                raise ClusterError(f"shaping {host}'s link failed ({' '.join(cmd)}): {out.strip()[-200:]}")
    echo(f"link shaped on {', '.join(found)}: {spec}")


def unshape(found: dict) -> None:
    """Undo shape on every node that still runs (a stopped one has no link to undo)."""
    for c in found.values():
        try:
            exec_out(c, ["tc", "qdisc", "del", "dev", IFACE, "root"], user="root")
        except Exception:       # the node stopped (docker's APIError: not running)
            pass


