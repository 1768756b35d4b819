"""The places a job's ranks run in: the registry (one line per place, as lab.models) and
the factory over it. It imports the concrete runners, which import the interface
(lab.host.places.base) — never the other way, so there is no circle. Bench, the plan,
the sweep, doctor and tasks.py name no place: they ask the runner (its interface)."""
from __future__ import annotations

import dataclasses
import importlib

from lab.common import docker_api
from lab.common import options as opts
from lab.common.forwarded_env import forwarded
from lab.host.errors import RunnerError
from lab.host.images import choice as images
from lab.host.places.base import WHERE, Runner
from lab.host.places.launch import resolve_framework
from lab.host.places.local import LocalRunner

# name -> "module:class", imported only when chosen (asking never imports Docker or Kubernetes).
PLACES = {
    "local": "lab.host.places.local:LocalRunner",
    "image": "lab.host.places.image:ImageRunner",
    "compose": "lab.host.places.compose.runner:ClusterRunner",
    "slurm": "lab.host.places.slurm.runner:SlurmClusterRunner",
    "hosts": "lab.host.places.hosts:HostsRunner",
    "k8s": "lab.host.places.k8s.runner:K8sRunner",
}

# The places other flags choose (--local, --image or where: auto, --nodes, --hosts);
# every other place above is a launcher of its own, which --launcher names.
CHOSEN_BY_FLAGS = ("local", "image", "compose", "hosts")


def launchers() -> tuple[str, ...]:
    """What --launcher takes: direct (the cluster's ranks started over SSH or docker
    exec), or a registered place that is a launcher of its own (slurm, k8s)."""
    return ("direct", *(n for n in PLACES if n not in CHOSEN_BY_FLAGS))


def place(name: str) -> type[Runner]:
    """The runner class registered as `name`."""
    module, _, cls = PLACES[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def place_of(s) -> str | None:
    """The place a request (BenchSettings) runs in when the request alone decides it;
    None where the engine decides (`where: auto`: the image if built, else local)."""
    if s.hosts or s.hostfile:
        return "hosts"
    if s.launcher in PLACES:
        return s.launcher
    if s.nodes > 1:
        return "compose"
    if s.where == "local":
        return "local"
    return "image" if s.where == "image" or s.image else None


# Whether a request asks for an option of reach "place" (lab.common.options): its value is
# not the default, except these two, which say where the ranks run.
ASKED = {"local": lambda s: s.where == "local",        # --local, or invoke.yaml's where: local
         "where": lambda s: s.where == "image"}        # --image, or invoke.yaml's where: image
AUTO = ("local", "image")       # where: auto: the engine picks one of these (choose_runner)


def asked(s, o: opts.Option) -> bool:
    """Whether request `s` asks for option `o` (one of reach "place")."""
    if o.name in ASKED:
        return ASKED[o.name](s)
    return getattr(s, o.name) != o.value


def shown(s, o: opts.Option) -> str:
    """How the user asked for option `o`: its flag (and value), or invoke.yaml's key."""
    if o.name == "where":
        return f"--image {s.image}" if s.image else "invoke.yaml's where: image"
    if o.kind is bool:
        return f"--{o.flag}"
    return f"--{o.flag} {getattr(s, o.name)}"


def refusal(s, where) -> str | None:
    """The one sentence refusing the first option of reach "place" that request `s` asks
    for and where it runs does not honour (Runner.honours), naming the places that do;
    None when it honours all it is asked. `where`: a place's name; None for `where: auto`
    before the engine picks (local processes or the image: refused only what neither
    honours); or the Runner class the engine picked (bench asks again, lab.host.run.bench)."""
    classes = ([where] if isinstance(where, type) else [place(where)] if where
               else [place(n) for n in AUTO])
    for o in opts.OPTIONS:
        if o.reach == "place" and asked(s, o) and not any(o.name in c.honours for c in classes):
            title = " or ".join(c.title for c in classes)
            line = f"{shown(s, o)} is not honoured by {title}, where this request runs: leave it out"
            there = [place(n).title.split(" (")[0] for n in PLACES if o.name in place(n).honours]
            if there:
                line += (f", or run where it is ({', '.join(there[:-1])} or {there[-1]})" if len(there) > 1
                         else f", or run where it is ({there[0]})")
            return line
    return None


def for_request(s, sections=None, echo=None, sweep: dict | None = None) -> tuple:
    """(the request as it runs in its place, the place's options: from its section of
    invoke.yaml, `sections` (invoke's Config or a dict, by place name), or from the
    request): an option the place does not honour (refusal; a sweep over --nodes: where
    its most nodes run) and what else cannot work there refused in one line
    (RunnerError), and a feature the place cannot offer turned off with its one line told
    (`echo`)."""
    if s.launcher not in launchers():
        raise RunnerError(f"--launcher is one of {', '.join(launchers())}, not {s.launcher!r}")
    name = place_of(s)
    # A sweep over --nodes runs where its most nodes run (its 1-node runs on the
    # cluster's node1: Runner.sweep_shares).
    most = dataclasses.replace(s, nodes=max((sweep or {}).get("nodes") or [s.nodes]))
    line = refusal(most, place_of(most))
    if line:
        raise RunnerError(line)
    cls = place(name) if name else None
    options = None
    if cls is not None:
        s, options = cls.for_request(s, dict((sections or {}).get(name, {}) or {}), sweep)
    if cls is None:
        return s, None
    for line in told(cls, s):
        if echo:
            echo(line)
    if cls.cannot("stall watch") and s.stall_s >= 0:
        s = dataclasses.replace(s, stall_s=-1)
    return s, options


def told(cls: type[Runner], s) -> list[str]:
    """The one line of each feature this request uses that its place cannot offer (the
    ceiling is refused outright, by Runner.for_request)."""
    import os

    used = {"stall watch": s.stall_s > 0,           # asked for in seconds (auto is quiet)
            "forwarded variables": bool(forwarded(os.environ)),
            "progress": True, "oversubscription": True, "failure naming": True, "resume": True}
    return [cls.cannot(f) for f, asked in used.items() if asked and cls.cannot(f)]


def runner_for(s, options=None, echo=print) -> tuple[Runner, str | None]:
    """(the runner of request `s`, bench's settings; a line saying where its ranks run):
    the place the request names makes it (Runner.from_request, with the options its
    for_request made); where the engine decides (local processes or the image),
    choose_runner."""
    name = place_of(s)
    if name in (None, "local", "image"):
        return choose_runner(where=s.where, image=s.image, frozen=s.frozen, device=s.device,
                             framework=s.framework, backend=s.backend,
                             results_dir=s.results_dir, data_dir=s.data_dir, echo=echo)
    runner = place(name).from_request(s, options, echo)
    return runner, runner.describe()


def choose_runner(*, where: str = "auto", nodes: int = 1, image: str = "", frozen: bool = False,
                  device: str = "cpu", framework: str = "auto", backend: str = "gloo",
                  results_dir: str = "results", data_dir: str | None = "data",
                  check_gpu_code: bool = True, echo=print) -> tuple[Runner, str | None]:
    """(runner, a line saying where the ranks run or why not where asked). `nodes` > 1:
    the cluster's nodes. `auto`: the lab image when an engine and an image are there,
    else local processes with one line saying why; `image` (or a named image) insists on
    the image; `local` never looks. For GPU runs the image must have code for the
    host's GPUs (refused in one sentence, unless check_gpu_code is False: doctor
    reports it as a finding instead)."""
    if where not in WHERE:
        raise RunnerError(f"where the job runs must be one of {', '.join(WHERE)}, not {where!r}")
    if nodes > 1:
        runner = place("compose")(nodes, frozen=frozen, echo=echo)
        return runner, runner.describe()
    if where == "local":
        return LocalRunner(results_dir, data_dir), None
    # Which image: auto as for the lab images' stack, which has Horovod (docker/Dockerfile).
    tags = [image] if image else images.candidate_images(
        device, resolve_framework(framework, {"horovod": True})[0], backend, images.matrix_cudas())
    insist = where == "image" or bool(image) or frozen     # --frozen: the image's copy of the kit
    try:
        cli = docker_api.client()
    except docker_api.DockerUnavailable as e:
        if insist:
            raise RunnerError(f"{e}: {docker_api.START_HINT}, or run with --local") from None
        return LocalRunner(results_dir, data_dir), (
            f"running as local processes: {e} (--local says so and skips the check)")
    img = docker_api.find_image(cli, tags)
    if device == "cuda" and img is not None:
        img = images.gpu_image(cli, tags, check=check_gpu_code) or img
    if img is None:
        if insist:
            raise RunnerError(f"no image {' or '.join(tags)} is built: run `invoke build`, "
                              f"or run with --local")
        return LocalRunner(results_dir, data_dir), (
            f"running as local processes: no lab image ({', '.join(tags)}) is built "
            f"(`invoke build` makes one; --local skips the check)")
    runner = place("image")(cli, img, frozen=frozen, gpus=device == "cuda",
                         results_dir=results_dir, data_dir=data_dir)
    note = images.driver_note(img) if device == "cuda" else None
    return runner, runner.describe() + (f"; note: {note}" if note else "")
