"""Reading records for the report, and the facts about a record that every part of the
report shares: which runs are comparable (their setup), how a configuration is named,
whether it learned (accuracy against chance) and whether its ranks were oversubscribed."""
from __future__ import annotations

import statistics
from pathlib import Path

from lab.common import options, results
from lab.common.config import DATA_PARALLEL_STRATEGIES
from lab.report import summary


class ReportError(Exception):
    """Nothing to report on, or a folder that is not there: one sentence."""


def load(path: str) -> list[dict]:
    """Every record under path: one run folder, or a results folder holding several."""
    p = Path(path)
    if not p.exists():
        raise ReportError(f"{path} does not exist: give a results folder (results/ or results/<run-id>)")
    if not p.is_dir():
        raise ReportError(f"{path} is a file: give the folder that holds {results.RESULTS_FILE} "
                          f"(results/<run-id>) or a folder of such folders (results)")
    files = [p / results.RESULTS_FILE] if (p / results.RESULTS_FILE).exists() else \
        sorted(p.glob(f"*/{results.RESULTS_FILE}"))
    records = []
    for f in files:
        records += results.read_records(f)[0]
    if not records:
        raise ReportError(f"no records in {path}: run `invoke bench` first (its records go to "
                          f"results/<run-id>/results.jsonl)")
    return records


def ok(records):
    return [r for r in records if r.get("status") == "ok"]


# What makes runs comparable besides framework, back end, compression and workers:
# runs that differ in any of these are never put in one group, curve or sentence.
SETUP_FIELDS = options.SETUP_FIELDS     # the option table's `setup` column


def setup_key(r: dict) -> tuple:
    """The setup, the strategy (summary.strategy_name), where the ranks ran and their
    torch (summary.place, summary.stack): runs that differ in any are never one group,
    curve or sentence either."""
    c = r.get("config", {})
    # a field a record lacks (written before its option existed) is the option's default
    return (*(c.get(k, options.BY_NAME[k].value) for k in SETUP_FIELDS), summary.strategy_name(c),
            summary.place(r),
            summary.stack(r))


# setup_key's fields, by name; the last two are unknown (None) on a skipped record, which
# then tells nothing apart.
SETUP_NAMES = (*SETUP_FIELDS, "strategy", "place", "torch")


def setup_label(r: dict, records: list[dict]) -> str:
    """'' when every record shares one setup; else what tells this one apart, such as
    'resnet50, batch 8: ' or 'image, torch 2.9.0+cpu: '."""
    keys = {setup_key(x) for x in records}
    if len(keys) < 2:
        return ""
    mine = dict(zip(SETUP_NAMES, setup_key(r)))
    varying = [k for i, k in enumerate(SETUP_NAMES)
               if len({key[i] for key in keys if key[i] is not None or k not in ("place", "torch")}) > 1]
    parts = [setup_part(k, mine[k], r) for k in varying
             if mine[k] is not None or k not in ("place", "torch")]
    return ", ".join(parts) + ": " if parts else ""


def setup_part(name: str, value, r: dict) -> str:
    """One field of a setup as a label says it ('batch 8', 'no step cap', 'torch 2.9.0')."""
    if name == "batch_size":
        return f"batch {value}"
    if name == "max_steps":
        return _steps_label(value, r.get("config", {}).get("data"))
    if name in ("epochs", "threads", "torch"):
        return f"{name.replace('_', ' ')} {value}"
    if name == "compile":
        return "compiled" if value else "eager"
    return str(value)


def _steps_label(max_steps: int | None, data: str | None) -> str:
    """--max-steps as the epoch takes it (lab.common.config): a cap on a real dataset's
    epoch, the epoch's length on synthetic data; 0: the whole shard."""
    if not max_steps:
        return "no step cap"
    return f"{max_steps} steps an epoch" if data == "synthetic" else f"at most {max_steps} steps an epoch"


def config_label(r: dict, records: list[dict], sep: str = " over ") -> str:
    """'horovod over mpi with int8' (sep ' over '), 'horovod / mpi / int8' (sep ' / '),
    after the setup label when setups differ."""
    c = r.get("config", {})
    comp = c.get("compression")
    tail = "" if comp in (None, "none") else (f" with {comp}" if sep == " over " else f" / {comp}")
    return f"{setup_label(r, records)}{c.get('framework')}{sep}{c.get('backend')}{tail}"


def link_label(r: dict) -> str:
    """' at 100mbit' for a run across servers on a shaped link (rows that differ by their
    link alone are told apart by it); '' else."""
    link = r.get("config", {}).get("link") or ""
    return f" at {link}" if link and r.get("world", {}).get("nodes", 1) > 1 else ""


PRETTY = {"ddp": "DDP", "horovod": "Horovod", "none": "no framework", "mpi": "MPI", "gloo": "Gloo",
          "nccl": "NCCL", "ccl": "oneCCL"}


def stack_name(framework, backend) -> str:
    """'DDP over MPI': how a sentence names a framework and its back end."""
    return f"{PRETTY.get(framework, framework)} over {PRETTY.get(backend, backend)}"


def data_parallel(r: dict) -> bool:
    """Whether the run split its data over the processes (each a batch of its own: more
    processes, more images a step). The analysis ranks and splits into compute and
    communication only these: a pipeline keeps its batch whatever the process count, so
    its scaling is of another kind (the Parallel strategies table shows it)."""
    return (r.get("config", {}).get("strategy") or "ddp") in DATA_PARALLEL_STRATEGIES


def median_record(runs: list[dict]) -> dict:
    """One record standing for a combination's repeats: the first, with its timing
    figures replaced by the repeats' medians (accuracy and bytes: the first run's
    median too, they are the same from run to run when nothing but timing varies)."""
    if len(runs) == 1:
        return runs[0]
    figs = dict(runs[0]["figures"])
    for k in ("throughput_img_s", "step_time_mean_s", "test_accuracy"):
        vals = [r["figures"][k] for r in runs if r["figures"].get(k) is not None]
        if vals:
            figs[k] = statistics.median(vals)
    return {**runs[0], "figures": figs}


# ---------------------------------------------------------------- learned or not

# The classes of each data set the kit trains on; chance accuracy is one over them.
CLASSES = {"mnist": 10, "digits": 10}
# A run learned when its accuracy is at least this many times chance: the naive 8-bit
# cast ends at chance (9.67% on digits' 300 test images, 10% chance), every run that
# learns at all passes 20% within an epoch or two.
LEARNED_AT = 2.0


def chance(r: dict) -> float | None:
    """Chance accuracy of the run's data set (None where it is not known)."""
    n = CLASSES.get(r.get("config", {}).get("data"))
    return 1 / n if n else None


def learned(r: dict) -> bool | None:
    """True when its accuracy is clearly above chance, False when it is not, None when
    accuracy was not measured (synthetic data) or its chance is not known."""
    acc, ch = summary.accuracy(r), chance(r)
    if acc is None or ch is None:
        return None
    return acc >= LEARNED_AT * ch


# ---------------------------------------------------------------- oversubscription

def oversubscribed(r: dict) -> bool:
    """Whether bench recorded that the run had more busy threads than cores on a host
    (world.oversubscribed): its time measures ranks sharing cores, not scaling."""
    return bool(r.get("world", {}).get("oversubscribed"))


def oversubscription_text(r: dict) -> str:
    """'2 ranks on 1 core' when world.cores is known, else '2 ranks'."""
    w = r.get("world", {})
    per_host = w.get("devices_per_node") or w.get("np")
    cores = w.get("cores")
    ranks = f"{per_host} rank{'s' if per_host != 1 else ''}"
    return f"{ranks} on {cores} core{'s' if cores != 1 else ''}" if cores else ranks


def case_name(row: dict, records: list[dict]) -> str:
    """One configuration at its servers, link and workers: the name prediction.json's
    "case" and model_check's table give it (the "configuration" alone repeats across them)."""
    return (f"{config_label(row['record'], records, ' / ')}, {row['servers']} server(s)"
            f"{link_label(row['record'])}, {row['np']} workers")
