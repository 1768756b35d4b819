"""A bench request: the settings (from the task's flags and invoke.yaml's defaults), the
lists a sweep crosses, and every check that can be made before a rank starts, against
the stack the ranks will see (lab.worker.capabilities, probed by the runner)."""
from __future__ import annotations

import shutil

from lab import models
from lab.common import options, results
from lab.common.config import ConfigError
from lab.common.kit import NO_MPI_IN_PIP_TORCH, horovod_controller, horovod_gpu_path_problem
from lab.common.options import AUTO_FIRST, AUTO_MAX
from lab.common.stats import fewest_to_separate
from lab.host.errors import BenchError
from lab.host.places.launch import resolve_framework
from lab.host.settings import BENCH_FLAGS, BenchSettings, base_config, check_max_restarts, check_run_id

SWEEP_FIELDS = options.SWEEP_FIELDS


def parse_np(spec) -> list[int]:
    """"2" or "1,2,4" (or a list of ints) -> [1, 2, 4]; one clear sentence on bad input."""
    if isinstance(spec, int):
        items = [spec]
    elif isinstance(spec, (list, tuple)):
        items = list(spec)
    else:
        items = []
        for p in (p.strip() for p in str(spec).split(",")):
            try:
                items.append(int(p))
            except ValueError:
                raise BenchError(f"--np takes whole numbers separated by commas "
                                 f"(for example 1,2,4), not {spec!r}") from None
    if not items:
        raise BenchError("--np needs at least one process count")
    for n in items:
        if n < 1:
            raise BenchError(f"--np must be at least 1, not {n}")
    return list(dict.fromkeys(items))


def parse_list(name: str, spec, allowed=None) -> list:
    """'a,b' (or a list) -> ['a', 'b']; checked against the allowed values."""
    items = spec if isinstance(spec, (list, tuple)) else [x.strip() for x in str(spec).split(",")]
    items = [x for x in items if x != ""]
    if not items:
        raise BenchError(f"--{name} needs at least one value")
    if name == "nodes":
        try:
            items = [int(x) for x in items]
        except ValueError:
            raise BenchError(f"--nodes takes whole numbers separated by commas (1,2), not {spec!r}") from None
        if min(items) < 1:
            raise BenchError("--nodes must be at least 1")
    elif allowed is not None:
        bad = [x for x in items if x not in allowed]
        if bad:
            import difflib
            close = difflib.get_close_matches(bad[0], list(allowed), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise BenchError(f"unknown --{name} {bad[0]!r}: {hint}choose from {', '.join(allowed)}")
    return list(dict.fromkeys(items))


def whole(name: str, value) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise BenchError(f"--{name.replace('_', '-')} takes a whole number, not {value!r}") from None


INT_FIELDS = tuple(o.name for o in options.SETTINGS if o.kind is int and not o.sweeps)


def settings_from_flags(flags: dict, defaults: dict) -> tuple[BenchSettings, dict[str, list]]:
    """The task's flags (None where not given) over invoke.yaml's `bench` defaults ->
    the settings of the first combination and the lists a sweep crosses. `local` and
    `image` decide where the job runs; otherwise invoke.yaml's `where`."""
    flags = dict(flags)
    check_defaults(defaults)
    local = flags.pop("local", False)
    image = flags.pop("image", None) or defaults.get("image") or ""
    values = {k: v for k, v in defaults.items() if k in BENCH_FLAGS}
    # A flag not given is None: invoke.yaml's default holds; a switch's --no- form is False.
    values.update({k: v for k, v in flags.items() if v is not None})
    if "np" not in values:
        raise BenchError("--np needs at least one process count (invoke.yaml's bench.np is missing)")
    values["np"] = parse_np(values["np"])
    if isinstance(values.get("repeat"), str) and values["repeat"].strip().lower().startswith("auto"):
        values["repeat"], values["repeat_max"] = parse_auto(values["repeat"])
    for k in INT_FIELDS:
        if k in values:
            values[k] = whole(k, values[k])
    if "timeout_s" in values:
        try:
            values["timeout_s"] = float(values["timeout_s"])
        except (TypeError, ValueError):
            raise BenchError(f"--timeout-s takes a number of seconds, not {values['timeout_s']!r}") from None
    if "stall_s" in values:
        values["stall_s"] = parse_stall(values["stall_s"])
    lists = {k: parse_list(k, values.pop(k, options.BY_NAME[k].value),
                           options.BY_NAME[k].choices or None) for k in SWEEP_FIELDS}
    values["where"] = "local" if local else ("image" if image else values.get("where", "auto"))
    values["image"] = image
    settings = BenchSettings(**values, **{k: v[0] for k, v in lists.items()})
    check_strategy_options(settings, lists["strategy"], {k for k, v in flags.items()
                                                         if v is not None})
    return settings, lists


def check_strategy_options(s: BenchSettings, strategies: list[str], given: set[str]) -> None:
    """A strategy's own flag given (not its default) where no strategy of the request reads
    it (--zero-stage 2 with ddp) is refused: it would be recorded and change nothing. (A
    default in invoke.yaml is not: it is there for the runs of the strategy that reads it.)"""
    for o in options.OPTIONS:
        if o.strategies and o.name in given and getattr(s, o.name) != o.value \
                and not set(strategies) & set(o.strategies):
            which = " or ".join(o.strategies)
            raise BenchError(f"--{o.flag} is for the {which} strategy, and this runs "
                             f"{', '.join(strategies)}: add --strategy {o.strategies[0]}, "
                             f"or leave out --{o.flag}")


STALL_MAX_S = 86400.0       # a day: past it, a "bound" is no bound (and overflows the ranks' timers)


def parse_auto(value: str) -> tuple[int, int]:
    """'auto' or 'auto:N' -> (the first repeats, the most repeats)."""
    text = str(value).strip().lower()
    most = AUTO_MAX
    if text != "auto":
        _, sep, n = text.partition(":")
        try:
            most = int(n) if sep and text.startswith("auto:") else -1
        except ValueError:
            most = -1
        least = fewest_to_separate()
        if most < least:
            raise BenchError(f"--repeat auto takes its maximum as auto:N with N at least "
                             f"{least} (below it an interval is the runs' whole range, which "
                             f"more runs only widen), not {value!r}")
    return min(AUTO_FIRST, most), most


def check_defaults(defaults: dict) -> None:
    """invoke.yaml's `bench:` section names settings of bench: a misspelt one is one
    sentence naming the closest (it would otherwise be dropped without a word)."""
    import difflib
    for key in sorted(defaults):
        if key not in BENCH_FLAGS:
            close = difflib.get_close_matches(key, sorted(BENCH_FLAGS), n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"one of {', '.join(sorted(BENCH_FLAGS))}"
            raise BenchError(f"invoke.yaml's bench: has no setting {key!r}: {hint}")


def parse_stall(value) -> float:
    """--stall-s: seconds up to a day, `auto` (0: the default bound, lab.common.heartbeat)
    or `off` (-1). inf and nan are refused: `off` says what they would mean."""
    text = str(value).strip().lower()
    if text in ("auto", ""):
        return 0.0
    if text == "off":
        return -1.0
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:         # nan too
        raise BenchError(f"--stall-s takes seconds without progress before a run counts as stalled, "
                         f"`auto` or `off`: not {value!r}")
    if seconds > STALL_MAX_S:   # inf too
        raise BenchError(f"--stall-s takes at most {STALL_MAX_S:.0f} s (a day): not {value!r}; "
                         f"`off` turns the stall watch off")
    return seconds


def check_settings(s: BenchSettings) -> None:
    """What is wrong with the settings themselves, before anything else is looked at;
    the results folder is made here (an unusable one is one sentence, not a traceback)."""
    if s.repeat < 1:
        raise BenchError(f"--repeat is how many times each combination runs, at least 1: not {s.repeat}")
    if s.timeout_s < 0:
        raise BenchError(f"--timeout-s is seconds per run, 0 for no limit: not {s.timeout_s:g}")
    check_max_restarts(s)
    check_run_id(s.run_id)
    try:
        results.check_folder(s.results_dir)
    except results.FolderError as e:
        raise BenchError(str(e)) from None


def check_request(s: BenchSettings, stack: dict) -> tuple[str, list[str]]:
    """Everything that can be known before launching; returns the framework and notes."""
    if "torch_error" in stack or "torch" not in stack:
        raise BenchError(f"torch does not import ({stack.get('torch_error', 'not installed')}): "
                         f"install the training extra, pip install -e '.[train]'")
    framework, note = resolve_framework(s.framework, stack, s.strategy)
    notes = [note] if note else []
    try:
        base_config(s, framework).check()
    except ConfigError as e:
        raise BenchError(str(e)) from None
    check_strategy_stack(s.strategy, stack)
    if s.device == "cuda" and not stack.get("cuda_available"):
        raise BenchError("--device cuda but torch sees no GPU: run `invoke doctor`, "
                         "or use --device cpu")
    refused = refused_counts(s, stack, framework)
    if len(refused) == len(s.np):       # nothing of the request can run: its largest count's reason
        raise BenchError(refused[max(s.np)])
    if framework == "horovod":
        if "horovod_error" in stack:
            raise BenchError(f"Horovod is installed but does not import ({stack['horovod_error']}): "
                             f"rebuild it against this torch with docker/install-horovod.sh")
        if "horovod" not in stack:
            raise BenchError("Horovod is not installed: build it with docker/install-horovod.sh, "
                             "or use --framework ddp")
        if not stack["horovod"].get(s.backend):
            raise BenchError(f"this Horovod was built without {s.backend}: rebuild it with "
                             f"docker/install-horovod.sh, or pick another --backend")
        if s.device == "cuda":
            problem = horovod_gpu_path_problem(stack["horovod"].get("gpu_operations"), s.backend)
            if problem:
                raise BenchError(problem)
        if horovod_controller(s.backend) == "mpi" and not stack.get("mpirun", shutil.which("mpirun") is not None):
            raise BenchError(f"--backend {s.backend} needs mpirun on the PATH: install an MPI "
                             f"(Debian: openmpi-bin)")
    if framework == "ddp" and not stack.get("ddp_backends", {}).get(s.backend):
        if s.strategy != "ddp":     # the strategy, not --framework, asked for torch.distributed
            raise BenchError(f"the {s.strategy} strategy runs on torch.distributed, and this torch "
                             f"has no {s.backend} back end: use --backend gloo, or --strategy ddp")
        hint = NO_MPI_IN_PIP_TORCH if s.backend == "mpi" else "use --backend gloo"
        raise BenchError(f"this torch has no {s.backend} back end for DDP: {hint}")
    for package in models.get(s.model).needs:       # lab.worker.capabilities probes them
        if package not in stack:
            raise BenchError(f"--model {s.model} needs {package}, which does not import here "
                             f"({stack.get(package + '_error', 'not installed')}): install the "
                             f"{package} built for torch {stack['torch']}")
    return framework, notes


def refused_counts(s: BenchSettings, stack: dict, framework: str) -> dict[int, str]:
    """The process counts of the request that cannot run on this stack, each with its
    reason: the rules that depend on the number of processes (the strategy's, --fault's
    rank, one process for --framework none) and, for GPU ranks, a GPU of its own for each
    rank on a node. A sweep skips those counts alone and runs the rest (--np 1,2,4 on two
    GPUs runs 1 and 2); check_request refuses a request none of whose counts can run."""
    cfg, out = base_config(s, framework), {}
    nodes = max(1, int(s.nodes))
    for n in s.np:
        try:
            cfg.check_world(n)
        except ConfigError as e:
            out[n] = str(e)
            continue
        if framework == "none" and s.strategy != "dataparallel" and n != 1:
            out[n] = "--framework none runs one process: use --np 1, or --framework horovod or ddp"
        elif s.device == "cuda":
            # Each rank needs a GPU of its own on its node; the stack was probed on one
            # node (node1 on the cluster, whose nodes are alike), so the check is per node.
            per_node, gpus = -(-n // nodes), stack.get("gpus", 0)
            if per_node > gpus:
                where = "this host" if nodes == 1 else f"each of the {nodes} nodes"
                out[n] = (f"--np {n} puts {per_node} ranks on {where}, each needing a GPU "
                          f"of its own, and torch sees {gpus} there: lower --np")
    return out


def check_strategy_stack(strategy: str, stack: dict) -> None:
    """What a strategy needs from the ranks' stack beyond torch."""
    if strategy == "deepspeed" and "deepspeed" not in stack:
        raise BenchError(f"the deepspeed strategy needs DeepSpeed, which does not import where the "
                         f"ranks run ({stack.get('deepspeed_error', 'not installed')}): "
                         f"pip install -e '.[deepspeed]', or use the lab image")
    if strategy == "rpc-pipeline" and not stack.get("rpc", True):
        raise BenchError("this torch has no torch.distributed.rpc (rpc.is_available() is False; "
                         "RPC is in maintenance mode upstream): use --strategy pipeline")


