"""`invoke bench --launcher k8s`: each launch as a Kubeflow job (the manifest of
lab.host.places.k8s.manifest.manifest_for_request, the one place it is made) created with the official
Kubernetes client, its pods followed (a pod that cannot be scheduled or whose image
cannot be pulled becomes one sentence), the launcher's or rank 0's log streamed to
bench's echo as other runners' output is, the job's end read from its conditions, and
the records the job prints after lab.host.places.k8s.manifest.RECORD_PREFIX appended to this machine's
results file. Tested against captured API objects (tests/fixtures/k8s/api/); never run
on a live cluster here."""
from __future__ import annotations

import dataclasses
import json
import os
import threading
import time

from lab.common import results
from lab.host.errors import BenchError
from lab.host.places.base import JobResult, Launch, Runner, RunnerError
from lab.host.places.k8s import manifest as kube
from lab.host.places.k8s.cluster import (
    PLURALS,
    RANK0_CONTAINER,
    advice,
    api_sentence,
    assumed_stack,
    condition,
    connect,
    is_rank0,
    pod_problem,
    selector,
)
from lab.host.settings import BenchSettings

PENDING_S = 300.0     # how long a pod may stay unschedulable (an autoscaler may add a node)


@dataclasses.dataclass
class Settings:
    """What `invoke bench` gives the runner beside the launch: invoke.yaml's `k8s:`
    options and the ranks' threads (each pod asks for ranks x threads CPUs)."""
    opts: kube.K8sOptions = dataclasses.field(default_factory=kube.K8sOptions)
    threads: int = 1
    max_restarts: int = 0       # the operator's retries of a failed job (bench's --max-restarts)
    pending_s: float = PENDING_S
    poll_s: float = 2.0


class K8sRunner(Runner):
    """The ranks as the pods of one Kubeflow job per launch, on the kubeconfig's cluster."""

    kind = "k8s"
    title = "Kubernetes (--launcher k8s)"
    holds = ""          # the ranks run on the cluster's machines, not this one's cores
    # The pods run the image's own kit (frozen, always); rank 0's record is streamed into
    # the results folder; their data is the pods' own, never this machine's folder.
    # --max-restarts: the job's operator retries its failed pods (the manifest's backoffLimit
    # and restart policy, lab.host.places.k8s.jobs), not bench; --checkpoint-every needs a
    # volume, which bench cannot give the job (it reads the records from the log).
    honours = frozenset({"where", "image", "frozen", "nodes", "launcher", "results_dir", "max_restarts"})
    retries_in_place = True
    launcher = "k8s"
    # The ranks print their heartbeats into the job's output (lab.common.heartbeat), which
    # _stream_log hands line by line to bench's stall watch: rank 0's pod's log (the
    # MPIJob's launcher carries every rank's lines; a PyTorchJob's master its own ranks').
    heartbeat_channel = "logs"
    rank_files = "logs"
    machine_name = ""
    in_container = True
    unsupported = {
        "ceiling placement": "--ceiling measures the compute ceiling by running processes where the "
                             "ranks run, which a Kubernetes job does not offer: leave out --ceiling "
                             "(--no-ceiling where invoke.yaml's bench: turns it on)",
    }

    def __init__(self, nodes: int = 1, device: str = "cpu", image: str = "",
                 results_dir: str = "results", data_dir: str | None = "data",
                 settings: Settings | None = None, backend: str = "gloo"):
        super().__init__(results_dir, data_dir)
        self.results_in, self.data_in = kube.RESULTS_IN_POD, kube.DATA_IN_POD
        self.settings = settings or Settings()
        self.opts = self.settings.opts
        if image:
            self.opts = dataclasses.replace(self.opts, image=image)
        if self.opts.pvc:
            raise RunnerError(f"--launcher k8s reads the records from the job's log, which a job "
                              f"with a volume ({self.opts.pvc}) does not print: leave pvc out of "
                              f"invoke.yaml's k8s: for bench (invoke k8s keeps it)")
        if not (self.opts.image or self.opts.registry):
            raise RunnerError("a cluster pulls the image from a registry: give --image with the "
                              "whole reference, or registry: REGISTRY/PATH in invoke.yaml's k8s: "
                              "(after `docker tag` and `docker push` of the built image)")
        self.nodes, self.device, self.backend = nodes, device, backend
        self.core, self.custom, self.namespace, self.context = connect(self.opts.namespace)
        self._manifests: dict[str, kube.Manifest] = {}
        self._job: tuple[str, str] | None = None        # (kind, name) created, not yet deleted
        self._lock = threading.Lock()
        self._dead: dict = {}
        self._expired = threading.Event()
        self._stream = None             # the log being read (urllib3's response)
        self._streaming = False         # rank 0's pod runs and its log is read
        self._records: set = set()      # the record ids read from this job's log

    @classmethod
    def for_request(cls, s, config: dict, sweep: dict | None = None) -> tuple:
        return for_bench(s, config)

    @classmethod
    def from_request(cls, s, options, echo=print) -> "K8sRunner":
        return cls(s.nodes, s.device, s.image, s.results_dir, s.data_dir, settings=options,
                   backend=s.backend)

    def describe(self) -> str:
        where = f"context {self.context}, " if self.context else ""
        return (f"running as a Kubeflow job on the kubeconfig's cluster ({where}namespace "
                f"{self.namespace}); its stack is not probed: the request is checked as a "
                f"configuration, against the kit's image")

    def probe_stack(self, timeout_s: float = 120) -> dict:
        return assumed_stack(self.device, self.backend, self.opts.api)

    def machines(self, np: int, stack: dict) -> list[tuple[str, int, int]]:
        per = -(-np // max(self.nodes, 1))
        return [("each pod (its CPU request)", per, per * max(self.settings.threads, 1))]

    def placement(self, np: int) -> dict[str, int]:
        return {"": np}

    def output(self, argv, timeout_s=300):
        raise RunnerError("a Kubernetes job's pods run only the job, not probes: leave out "
                          "--ceiling with --launcher k8s")

    def dead(self) -> dict:
        return dict(self._dead)

    def ranks_started(self) -> bool:
        """Rank 0's pod runs (its log is read): pods pending for a node or an image are
        bounded by pending_s, not by the stall watch."""
        return self._streaming

    def commands(self, job: Launch) -> dict[str, list[str]]:
        """The job's manifest (written to results/<run-id>/k8s/), named by the job; its
        value is the command rank 0's container runs."""
        cfg = job.config
        if cfg is None:
            raise RunnerError("a Kubernetes job is made from the launch's configuration (Launch.config)")
        # The fields the settings share with the configuration, but repeat (a count there,
        # an index here).
        fields = ({f.name for f in dataclasses.fields(BenchSettings)} & set(vars(cfg))) - {"repeat"}
        s = BenchSettings(**{**{k: getattr(cfg, k) for k in fields}, "np": [job.np],
                             "framework": job.framework, "backend": job.backend, "nodes": self.nodes,
                             "timeout_s": job.timeout_s, "max_restarts": self.settings.max_restarts,
                             "stall_s": cfg.stall_s})
        try:
            # bench's rank environment; the host's forwarded variables are added where
            # invoke k8s gets them too (lab.host.places.k8s.manifest.job_env)
            m = kube.manifest_for_request(s, self.opts, run=cfg, env=job.environment)
            kube.write(m, self.results_dir)
        except BenchError as e:
            raise RunnerError(str(e)) from None
        self._manifests[m.name] = m
        return {m.name: rank0_command(m)}

    def run(self, commands, env, timeout_s, echo, name=""):
        (jobname,) = commands
        m = self._manifests.pop(jobname)
        self._dead, tail = {}, []
        self._streaming = False
        self._records = set()
        self._expired.clear()
        group, version = m.body["apiVersion"].split("/")
        body = json.loads(json.dumps(m.body))
        body["metadata"].pop("namespace", None)
        try:
            created = self.custom.create_namespaced_custom_object(group, version, self.namespace,
                                                                  PLURALS[m.kind], body)
        except Exception as e:          # kubernetes.client.ApiException, urllib3's errors
            raise RunnerError(api_sentence(e, f"creating {m.kind} {self.namespace}/{m.name}")) from None
        # What runs: rank 0's command in the job as the API server stored it.
        self.started = {m.name: rank0_command(dataclasses.replace(m, body=created))}
        with self._lock:
            self._job = (m.kind, m.name)
        echo(f"k8s: created {m.kind} {self.namespace}/{m.name}")
        timer = threading.Timer(timeout_s, self._expire) if timeout_s and timeout_s > 0 else None
        if timer:
            timer.daemon = True
            timer.start()
        ended = False
        try:
            res = self._follow(m, echo, tail, timeout_s)
            ended = True
            return res
        finally:
            if timer:
                timer.cancel()
            try:
                self.stop()
            except RunnerError as e:
                if ended:
                    raise
                echo(f"!! {e}")     # Ctrl-C or an error goes on; the job's deletion failed

    def _expire(self) -> None:
        """At --timeout-s (a timer's thread): the job deleted, the log stream cut."""
        self._expired.set()
        try:
            self.stop()
        except RunnerError:             # run() tries again on its way out, and says why
            pass
        stream = self._stream
        if stream is not None:
            try:
                stream.shutdown()
            except Exception:           # already closed by the reader
                pass

    def _follow(self, m: kube.Manifest, echo, tail: list[str], timeout_s: float) -> JobResult:
        s = self.settings
        rfile = results.run_dir(self.results_dir, m.run_id) / results.RESULTS_FILE
        seen: dict[str, float] = {}     # pod -> when its problem was first seen
        streamed: set = set()           # (pod, restart count) of rank 0's containers read
        # --max-restarts: the operator reruns rank 0's container (its restart count grows),
        # whose log is read again
        retries = bool((m.body["spec"].get("runPolicy") or {}).get("backoffLimit"))
        while True:
            if self._expired.is_set():
                return self._timed_out(m, tail, timeout_s)
            job = self._get(m)
            ended = condition(m.kind, job) if job is not None else None
            pods = [] if streamed and not retries else self._pods(m)
            for pod in pods:
                problem = pod_problem(pod)
                if problem is None:
                    seen.pop(pod.metadata.name, None)
                    continue
                if pod.metadata.name not in seen:
                    echo(f"k8s: pod {pod.metadata.name} is waiting: {problem}")
                first = seen.setdefault(pod.metadata.name, time.monotonic())
                if time.monotonic() - first >= s.pending_s:
                    why = (f"pod {pod.metadata.name} did not start within {s.pending_s:g} s: "
                           f"{problem}; {advice(problem)}")
                    echo(f"!! {why}")
                    self._dead = {pod.metadata.name: {"reason": why}}
                    return JobResult(1, [*tail, why], why)
            rank0 = next((p for p in pods if is_rank0(m.kind, p) and p.status
                          and p.status.phase in ("Running", "Succeeded", "Failed")), None)
            run = rank0 and container_run(rank0, RANK0_CONTAINER[m.kind])
            if rank0 is not None and (not streamed or (run[1] and run[0] not in streamed)):
                if streamed:
                    echo(f"k8s: the operator restarted pod {rank0.metadata.name}'s container "
                         f"({run[0][1]} of at most {m.body['spec']['runPolicy']['backoffLimit']} "
                         f"restarts): reading its log again")
                self._stream_log(m, rank0.metadata.name, echo, tail, rfile)
                streamed.add(run[0])
                continue
            if ended:
                state, said = ended
                line = f"k8s: {m.kind} {self.namespace}/{m.name} {'ended' if state == 'ok' else 'failed'}: {said}"
                echo(line)
                tail.append(line)
                return JobResult(0 if state == "ok" else 1, tail[-50:], "exited" if state == "ok" else line)
            if job is None:
                why = f"{m.kind} {self.namespace}/{m.name} was deleted before it ended"
                return JobResult(1, [*tail, why], why)
            self._expired.wait(s.poll_s)

    def _timed_out(self, m, tail, timeout_s) -> JobResult:
        why = (f"did not finish within {timeout_s:g} s and was stopped ({m.kind} "
               f"{self.namespace}/{m.name} deleted)")
        return JobResult(None, tail[-50:], why)

    def _get(self, m: kube.Manifest) -> dict | None:
        group, version = m.body["apiVersion"].split("/")
        try:
            return self.custom.get_namespaced_custom_object(group, version, self.namespace,
                                                            PLURALS[m.kind], m.name)
        except Exception as e:
            if getattr(e, "status", None) == 404:
                return None
            raise RunnerError(api_sentence(e, f"reading {m.kind} {self.namespace}/{m.name}")) from None

    def _pods(self, m: kube.Manifest) -> list:
        try:
            return self.core.list_namespaced_pod(self.namespace, label_selector=selector(m.kind, m.name)).items
        except Exception as e:
            raise RunnerError(api_sentence(e, f"listing the pods of {m.kind} {m.name}")) from None

    def _stream_log(self, m: kube.Manifest, pod: str, echo, tail: list[str], rfile) -> None:
        """Rank 0's log, line by line, to echo (as the launcher printed it); the lines
        after RECORD_PREFIX are records, appended to this machine's results file."""
        echo(f"k8s: streaming the log of pod {pod}")
        self._streaming = True
        try:
            self._stream = self.core.read_namespaced_pod_log(
                pod, self.namespace, container=RANK0_CONTAINER[m.kind], follow=True,
                _preload_content=False)
        except Exception as e:
            raise RunnerError(api_sentence(e, f"reading the log of pod {pod}")) from None
        buf = b""
        try:
            for chunk in self._stream.stream(4096, decode_content=True):
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for raw in lines:
                    self._line(raw.decode("utf-8", "replace").rstrip("\r"), echo, tail, rfile)
        except Exception as e:          # the stream cut (the job deleted, the deadline)
            if not self._expired.is_set():
                raise RunnerError(f"the log of pod {pod} was cut ({type(e).__name__}: {e})") from None
        finally:
            self._stream.release_conn()
            self._stream = None
        if buf:
            self._line(buf.decode("utf-8", "replace"), echo, tail, rfile)

    def _line(self, text: str, echo, tail: list[str], rfile) -> None:
        if text.startswith(kube.RECORD_PREFIX):
            try:
                record = json.loads(text[len(kube.RECORD_PREFIX):])
            except json.JSONDecodeError:
                record = None
            if isinstance(record, dict) and record.get("record_id") in self._records:
                return                  # printed again by a retried container (same emptyDir)
            if isinstance(record, dict):
                self._records.add(record.get("record_id"))
                os.makedirs(rfile.parent, exist_ok=True)
                results.append_record(rfile, record)
                echo(f"k8s: record {record.get('record_id', '')} ({record.get('status')}) read from the log")
                return
        echo(text)
        tail.append(text)
        del tail[:-200]

    def stop(self) -> None:
        """Delete the job this runner created (its pods go with it: Foreground)."""
        with self._lock:               # taken: the timer's thread and run() never both delete
            job, self._job = self._job, None
        if job is None:
            return
        kind, name = job
        group, version = kube.KINDS[kind.lower()][0].split("/")
        from kubernetes import client
        try:
            self.custom.delete_namespaced_custom_object(
                group, version, self.namespace, PLURALS[kind], name,
                propagation_policy="Foreground", body=client.V1DeleteOptions(propagation_policy="Foreground"))
        except Exception as e:
            if getattr(e, "status", None) != 404:
                with self._lock:       # given back: run() tries again on its way out, and says why
                    if self._job is None:
                        self._job = job
                raise RunnerError(api_sentence(e, f"deleting {kind} {self.namespace}/{name}")) from None


def container_run(pod, name: str) -> tuple[tuple[str, int], bool]:
    """((the pod, its container's restart count), whether that run has started: it runs
    or ended, not waiting, say in CrashLoopBackOff's back-off)."""
    for cs in (pod.status.container_statuses or []) if pod.status else []:
        if cs.name == name:
            started = bool(cs.state and (cs.state.running or cs.state.terminated))
            return (pod.metadata.name, cs.restart_count or 0), started
    return (pod.metadata.name, 0), False


def rank0_command(m: kube.Manifest) -> list[str]:
    """The command of the container that holds rank 0 (what bench prints for the launch)."""
    spec = m.body["spec"]
    if m.kind == "MPIJob":
        return spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"]
    if m.kind == "PyTorchJob":
        return spec["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["command"]
    return spec["trainer"]["command"]


def for_bench(s, k8s_config: dict) -> tuple:
    """`invoke bench --launcher k8s`: what cannot work refused in one sentence; the request
    as it runs there and the runner's settings from invoke.yaml's `k8s:` section (the plan
    holds them: lab.host.request.plan.make_plan)."""
    if s.ceiling:
        raise BenchError(K8sRunner.cannot("ceiling placement"))
    # --local, --link and the other options it does not honour: lab.host.places.refusal
    if s.timeout_s <= 0:
        # Nothing else bounds a job whose pods never appear (the stall watch starts with
        # the ranks' first heartbeat lines in the log).
        raise BenchError("--launcher k8s needs a time limit for each job: give --timeout-s "
                         "(seconds; invoke.yaml's bench default is 3600)")
    return s, Settings(opts=kube.options(k8s_config), threads=s.threads, max_restarts=s.max_restarts)
