"""The flags and help of the run tasks (`invoke bench`, `invoke sbatch`, `invoke k8s`),
derived from the option table (lab.common.options): bench's, and the one-value subsets
the batch script and the Kubernetes manifest take, each of which writes one run."""
from __future__ import annotations

import functools
import inspect
import re

from invoke import Task
from invoke.parser import Argument

from lab.common import options
from lab.common.kit import REPO_ROOT

BENCH_HELP = {o.flag: o.help for o in options.of_task("bench")}


def one_value(task: str) -> dict[str, str]:
    """The help of the table's options `task` takes, for a task that writes one run: what
    bench's help says of comma lists (a sweep) left out."""
    out = {o.flag: re.sub(r"; a comma list sweeps.*$", "", o.help) for o in options.of_task(task)}
    if "np" in out:
        out["np"] = "the process count (one number)"
    return out


def takes(task: str):
    """A task body `def t(c, own=..., **run)` gets the signature invoke reads its flags
    from: its own parameters, then every option of the table that `task` takes (not
    given: None; a switch that is no setting, such as --resume: False). The body receives
    each of them in `run`, given or not, and a name it does not take is a TypeError, as
    for any function (a call from Python too, not only invoke's parser). A switch that is
    a setting (invoke.yaml may turn it on) is three-state: None (not given), True (--X)
    or False (--no-X); the task's class is SwitchTask (`@task(klass=SwitchTask)`)."""
    def wrap(body):
        sig = inspect.signature(body)
        own = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
        names = {p.name for p in own}
        rows = [o for o in options.of_task(task) if o.name not in names]
        table = [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY,
                                   default=False if o.kind is bool and not o.setting else None)
                 for o in rows]
        signature = sig.replace(parameters=own + table)

        @functools.wraps(body)
        def with_every_flag(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return body(*bound.args, **bound.kwargs)
        with_every_flag.__signature__ = signature
        with_every_flag.switches = frozenset(o.name for o in rows if o.kind is bool and o.setting)
        return with_every_flag
    return wrap


class Switch(Argument):
    """A flag with a --no- form whose value is None when neither is given. invoke makes
    the --no- form only for a bool argument whose default is True (ParserContext.add_arg,
    invoke/parser/context.py), and an Argument's value is its default when it was not
    given (Argument.value): this one's default is True, its value only what was given."""

    def __init__(self, **kwargs):
        super().__init__(kind=bool, default=True, **kwargs)

    @property
    def value(self):
        return self._value

    @value.setter
    def value(self, arg):
        self.set_value(arg, cast=True)


class SwitchTask(Task):
    """An invoke task whose body's `switches` (set by `takes`) are Switch flags."""

    def get_arguments(self, ignore_unknown_help=None):
        switches = getattr(self.body, "switches", ())
        return [Switch(names=a.names, help=a.help, attr_name=a.attr_name) if a.name in switches
                else a for a in super().get_arguments(ignore_unknown_help)]


SBATCH_OWN = {
    "nodes": "nodes the job asks for; --np spreads evenly over them (default: 1)",
    "timeout-s": "the job's time limit in seconds (sbatch --time, rounded up to minutes; 0: none)",
    "partition": "the Slurm partition (sbatch --partition)",
    "gpus-per-node": "GPUs per node (--gres=gpu:N); default with --device cuda: the ranks per node",
    "container": "where the ranks run: pyxis:IMAGE (srun --container-image), apptainer:FILE.sif "
                 "or venv:DIR (a virtual environment on shared storage); default: the job's PATH",
    "output": "write the script to this file instead of printing it",
}


K8S_OWN = {
    "nodes": "pods (one per node) the job asks for; --np spreads evenly over them (default: 1)",
    "results-dir": "where the manifest is written: <results-dir>/<run-id>/k8s/ (default: results); "
                   "in the pods the record goes to the job's log, or to --pvc",
    "timeout-s": "the job's activeDeadlineSeconds (0: none)",
    "api": "auto (MPIJob for Horovod, TrainJob for DDP and the torch strategies), mpijob, "
           "trainjob or pytorchjob (training-operator v1 clusters)",
    "registry": "REGISTRY/PATH the cluster pulls the kit's image from (docker tag + push it there)",
    "image": "the whole image reference instead of --registry's",
    "gpus-per-node": "nvidia.com/gpu per pod; default with --device cuda: the ranks per node",
    "pvc": "a PersistentVolumeClaim for results and data (default: none; the record is printed "
           "in the log)",
    "namespace": "the namespace of the job (default: kubectl's)",
}


# `invoke bench --help` in groups, in the table's order (lab.host.cli.cli_hints prints them).
BENCH_GROUPS = {g: tuple(o.flag for o in options.of_task("bench") if o.group == g)
                for g in options.GROUPS}
BENCH_EXAMPLES = (
    ("invoke bench --np 1,2 --framework horovod,ddp --backend gloo,mpi",
     "a sweep within this server: every combination, each skip said with its reason"),
    ("invoke bench --np 4 --device cuda --backend nccl", "one run on 4 GPUs"),
    ("invoke up && invoke bench --nodes 1,2 --np 1,2 --link 1gbit",
     "across two simulated servers over a 1 Gbit/s link, one node as the baseline"),
    ("invoke bench --run-id my-sweep --repeat 3 --resume", "add what a sweep is missing"),
    ("invoke report results/my-sweep", "its tables, curves and analysis"),
)


def with_defaults(helps: dict[str, str]) -> dict[str, str]:
    """Each help line with its default, where the run has one: invoke.yaml's `bench:`
    section (the kit's), else the option table's."""
    import dataclasses

    import yaml

    given = {}
    try:
        config = yaml.safe_load((REPO_ROOT / "invoke.yaml").read_text())
        given = dict((config or {}).get("bench") or {})
    except (OSError, yaml.YAMLError):
        pass
    out = dict(helps)
    for o in options.SETTINGS:
        flag = o.flag
        value = given.get(o.name, o.value)
        if flag in out and value not in (dataclasses.MISSING, "", None, False) and \
                not isinstance(value, bool) and "default" not in out[flag]:
            out[flag] = f"{out[flag]} (default: {value})"
    return out


BENCH_HELP = with_defaults(BENCH_HELP)
# a script's run options take bench's defaults (invoke.yaml's `bench:`); its own flags say theirs
# (sbatch asks for a wall time only when --timeout-s is given; a Kubernetes job always has
# bench's limit as its activeDeadlineSeconds)
SBATCH_HELP = {**with_defaults(one_value("sbatch")), **SBATCH_OWN}
K8S_HELP = with_defaults({**one_value("k8s"), **K8S_OWN})
