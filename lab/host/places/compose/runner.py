"""The simulated cluster as a runner: one command per node started at once through
`docker exec` as the user lab, output prefixed by node, the job ended when a node's
launcher fails, a node stops, or the time limit passes; the nodes are lab.host.places.compose.cluster's."""
from __future__ import annotations

import copy
import json
import os

from lab.common.forwarded_env import forwarded
from lab.common.kit import REPO_ROOT
from lab.common.link import rate_gbs
from lab.host.places import hold, jobs, launch, stack_cache
from lab.host.places.base import JobResult, Runner
from lab.host.places.compose import cluster, cores
from lab.host.places.compose.cluster import (
    ClusterError,
    engine,
    exec_out,
    node_hosts,
    node_names,
    nodes,
    wait_ssh,
)
from lab.host.places.image import DATA_IN, RESULTS_IN, SOURCE_IN, hand_over


def run_on(found: dict, commands: dict[str, list[str]], env: dict, timeout_s: float,
           echo, started: dict | None = None) -> JobResult:
    """Run one command per node (host name -> command) at once through `docker exec`, as
    the user lab, in the one job loop (lab.host.places.jobs): output prefixed by node; ends when
    all have exited, one fails (the others are then stopped), a node stops, at the time
    limit, or on Ctrl-C. The exit status is that of the node whose launcher failed first."""
    client = next(iter(found.values())).client
    job = jobs.Job(list(commands), echo)

    def start(host, out):
        ex = client.api.exec_create(found[host].id, commands[host], user="lab", environment=env,
                                    workdir="/tmp")["Id"]
        if started is not None:     # what the engine was given to run, as it says
            config = client.api.exec_inspect(ex).get("ProcessConfig") or {}
            started[host] = [config.get("entrypoint"), *(config.get("arguments") or [])]
        return jobs.StreamPart(host, lambda: client.api.exec_start(ex, stream=True),
                               lambda: client.api.exec_inspect(ex)["ExitCode"], out)

    def stop_all():
        stop_jobs(found)
        for part in job.parts.values():
            part.thread.join(timeout=10)

    o = job.run(start, timeout_s, stop_all, poll_s=0.5,
                lost=lambda: [h for h, c in found.items() if _status(c) != "running"])
    return JobResult(o.returncode, o.tail, o.why)


def _status(container) -> str:
    try:
        container.reload()
        return container.status
    except Exception:
        return "gone"


def stop_jobs(found: dict) -> None:
    """End every job process of user lab on the nodes that are still running."""
    for c in found.values():
        if _status(c) == "running":
            exec_out(c, ["pkill", "-KILL", "-u", "lab", "-f", "python|horovodrun|mpirun|orted|torch"],
                     user="root")


def dead_nodes(found: dict) -> dict[str, str]:
    """Nodes that are not running, with their state."""
    out = {}
    for host, c in found.items():
        status = _status(c)
        if status != "running":
            code = c.attrs.get("State", {}).get("ExitCode") if status != "gone" else None
            out[host] = f"{status}" + (f", exit code {code}" if code is not None else "")
    return out


def cluster_commands(framework: str, backend: str, np: int, n: int,
                     args: list[str], key: str = "", stack: dict | None = None) -> dict[str, list[str]]:
    """Node -> the command it runs: Horovod from node1 over all nodes (NCCL rides on the
    Gloo controller, as locally: launch.framework_for_backend), through the checkout's
    launcher where `stack` (the nodes' stack probe) says what Horovod was built with
    (launch.lean_horovodrun); DDP on every node."""
    if framework == "horovod":
        hosts = node_hosts(np, n)
        return {"node1": launch.lean_horovodrun(launch.horovod_command(
            np, hosts, launch.framework_for_backend(framework, backend), args, python="python"),
            stack, "python")}
    if framework == "ddp":
        # A rendezvous of this launch's own (port and id from its run id and attempt, as
        # --hosts and Slurm do): a run left over on node1 never meets the next one.
        node_hosts(np, n)       # spread evenly, or refused
        return {h: launch.ddp_command(np // n, args, nnodes=n, node_rank=i,
                                      rdzv_endpoint=f"node1:{launch.rendezvous_port(key)}",
                                      rdzv_id=key.replace("/", "-"), python="python")
                for i, h in enumerate(node_names(n))}
    raise ClusterError("--nodes needs a distributed framework: --framework horovod or ddp")


class ClusterRunner(Runner):
    """The ranks run on the cluster's nodes, launched from node1 (Horovod: horovodrun
    over SSH; DDP: torch.distributed.run on each node with a rendezvous at node1). The
    results and data folders are the ones the nodes mount."""

    kind = hold.CLUSTER_PLACE
    title = "the simulated cluster (--nodes)"
    # where: image: its nodes run the image `invoke up` started them with (never another
    # --image); the results and data folders: the ones they mount (bench refuses others);
    # the checkpoints: in the run's folder, which every node mounts, for bench's relaunch.
    honours = frozenset({"where", "frozen", "nodes", "link", "results_dir", "data_dir",
                         "checkpoint_every", "max_restarts"})
    sweep_shares = True
    owns_cores = True      # a run across nodes gives each its own cores (own_cores)
    up_flags = ""          # what `invoke up` needs beside --nodes to bring this place up

    @classmethod
    def from_request(cls, s, options, echo=print) -> "ClusterRunner":
        return cls(s.nodes, frozen=s.frozen, echo=echo)

    def __init__(self, n: int, frozen: bool = False, echo=print):
        self.n = self.nodes = n
        self.frozen = frozen
        self.client = engine()
        found = nodes(self.client)
        missing = [h for h in node_names(n) if h not in found or found[h].status != "running"]
        if missing:
            raise ClusterError(f"this checkout's cluster has no running {', '.join(missing)}: bring "
                               f"it up with `invoke up --nodes {n}{self.up_flags}`"
                               + (f", or `docker compose up -d` in {REPO_ROOT}"
                                  if n == 2 and not self.up_flags else ""))
        self.found = {h: found[h] for h in node_names(n)}
        self.cpusets: dict[str, str] | None = None     # while own_cores holds them
        self.stack: dict | None = None      # what probe_stack found
        wait_ssh(self.client, n, echo=echo)
        node1 = self.found["node1"]
        self.image = self.client.images.get(node1.image.id)
        self.tag = (node1.image.tags or [node1.image.short_id])[0]
        mounts = {m["Destination"]: m["Source"] for m in node1.attrs.get("Mounts", [])}
        if RESULTS_IN not in mounts:
            raise ClusterError("node1 has no /results mount: bring the cluster up with compose.yaml")
        super().__init__(mounts[RESULTS_IN], mounts.get(DATA_IN))
        self.results_in, self.data_in = RESULTS_IN, DATA_IN
        self.results_root = self.results_dir

    @classmethod
    def for_sweep(cls, nodes: int, s, echo=print) -> "ClusterRunner":
        return cls(nodes, frozen=s.frozen, echo=echo)

    def on_nodes(self, n: int) -> "ClusterRunner":
        """This runner on the cluster's first `n` nodes (a sweep over --nodes: one runner
        waited for once, its 1-node runs on node1)."""
        if n > self.n:
            raise ClusterError(f"this runner has {self.n} node(s), not {n}")
        other = copy.copy(self)
        other.n = other.nodes = n
        other.found = {h: self.found[h] for h in node_names(n)}
        return other

    def describe(self) -> str:
        if self.n == 1:
            return f"running on the cluster's node1 ({self.tag}); results in {self.results_dir}"
        return f"running on the cluster's {self.n} nodes ({self.tag}); results in {self.results_dir}"

    def where_text(self) -> str:
        return "on the cluster's node1"

    def env(self, extra: dict) -> dict:
        env = {"PYTHONUNBUFFERED": "1", "LAB_IMAGE_ID": self.image.id,
               "LAB_IMAGE_LABELS": json.dumps(self.image.labels or {}),
               **forwarded(os.environ, own_network=True), **extra}
        if not self.frozen:
            env["PYTHONPATH"] = SOURCE_IN
        return env

    def placement(self, np: int) -> dict[str, int]:
        return {h.name: h.slots for h in node_hosts(np, self.n)}

    def output(self, command: list[str], timeout_s: float = 300) -> tuple[int | None, str]:
        return self.output_on("node1", command, timeout_s)

    def output_on(self, host: str, command: list[str], timeout_s: float = 300) -> tuple[int | None, str]:
        return exec_out(self.found[host], command, env=self.env({}), timeout=timeout_s)

    def prepare(self, path: str) -> None:
        """The ranks write as the image's user over ssh: give it the run's folder."""
        hand_over(path, self.results_dir, everyone=True)

    def hand_back(self, path: str) -> None:
        """The ranks wrote as the image's user: node1, as root, gives the run's folder
        to the user who ran bench (any user: the host's chown would need root)."""
        inside = os.path.join(self.results_in, os.path.relpath(path, self.results_dir))
        rc, out = exec_out(self.found["node1"], ["chown", "-R", f"{os.getuid()}:{os.getgid()}", inside],
                           user="root", timeout=120)
        if rc != 0:
            raise ClusterError(f"giving {path} back to uid {os.getuid()} failed on node1: {out.strip()[-200:]}")

    def probe_stack(self, timeout_s: float = 120) -> dict:
        """The probe's answer on node1, from the cache (lab.host.places.stack_cache) keyed by
        the image the nodes run, the kit's copy and the GPUs they were given (node1's device
        requests, as `invoke up` made them)."""
        requests = (self.found["node1"].attrs.get("HostConfig") or {}).get("DeviceRequests")
        self.stack = stack_cache.cached(
            stack_cache.image_key(self.image.id, self.frozen, bool(requests), kind="cluster", devices=requests),
            lambda: super(ClusterRunner, self).probe_stack(timeout_s), depends=False)
        return self.stack

    def commands(self, job) -> dict[str, list[str]]:
        # an image's own copy of the kit (--frozen) may predate the launcher: horovodrun itself
        return cluster_commands(job.framework, job.backend, job.np, self.n, list(job.worker_args), job.key,
                                None if self.frozen else self.stack)

    def run(self, commands, env, timeout_s, echo, name=""):
        self.started = {}
        return run_on(self.found, commands, self.env(env), timeout_s, echo, self.started)

    def stop(self) -> None:
        stop_jobs(self.found)

    def dead(self) -> dict[str, str]:
        return dead_nodes(self.found)

    def results_folder(self) -> str | None:
        """The folder compose.yaml mounts: the nodes write their records nowhere else."""
        return self.results_dir

    def module_commands(self, module: str, args: list[str], key: str) -> dict[str, list[str]]:
        return {h: launch.ddp_command(1, list(args), nnodes=self.n, node_rank=i,
                                      rdzv_endpoint=f"node1:{launch.rendezvous_port(key)}",
                                      rdzv_id=key, python="python", module=module)
                for i, h in enumerate(node_names(self.n))}

    @classmethod
    def check_link(cls, link: str) -> None:
        if link:
            cluster.parse_link(link)

    @classmethod
    def link_reference(cls, link: str) -> dict | None:
        if not link:
            return None
        rate, _ = cluster.parse_link(link)
        return {"name": f"shaped link, {rate}", "gbs": rate_gbs(rate)}

    def shape_links(self, link: str, echo) -> None:
        if link:
            cluster.shape(self.found, link, echo)

    def unshape_links(self) -> None:
        cluster.unshape(self.found)

    def own_cores(self, echo) -> dict[str, str] | None:
        """Across nodes, each its own share of the machine's cores while the run lasts
        (lab.host.places.compose.cores), else every node on all of them (a run killed
        before it gave them back left some on a share); None on one node or with
        LAB_NODE_CORES=shared."""
        if not self.owns_cores:
            return None
        planned = self.cpusets = cores.planned(list(self.found))
        try:
            if planned:
                cores.give(self.found, planned)
            else:
                cores.give_back(self.found)
        except BaseException:
            self.share_cores()
            raise
        if planned:
            echo("cores of their own: " + ", ".join(f"{h} {c}" for h, c in planned.items()))
        elif len(self.found) > 1:
            why = ("LAB_NODE_CORES=shared" if cores.mode() == "shared" else
                   "fewer physical cores than nodes")
            echo(f"the nodes share the machine's cores ({why})")
        return planned

    def share_cores(self) -> None:
        """Every node on all the machine's cores again (never raises)."""
        if self.owns_cores:
            cores.give_back(self.found)
        self.cpusets = None

    def machines(self, np: int, stack: dict) -> list[tuple[str, int, int]]:
        """Per node, its ranks on its own cores where the run gives each node its own
        (own_cores, or what it will give), else one machine: the nodes share this one's."""
        planned = self.cpusets or (cores.planned(list(self.found)) if self.owns_cores else None)
        if not planned:
            return super().machines(np, stack)
        return [(h, ranks, len(cores.cpuset_list(planned[h]))) for h, ranks in self.placement(np).items()]
