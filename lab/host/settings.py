"""What one bench request asks for, as every part of lab.host passes it down: the settings
type (one frozen field per setting of lab.common.options' table), the run configuration
they name, the run-id form and a launch's name. Parsing flags into settings and checking
them against the ranks' stack is lab.host.request's."""
from __future__ import annotations

import dataclasses
import re

from lab.common import options
from lab.common.config import RunConfig
from lab.host.errors import BenchError


def _settings_class():
    """bench's settings: one frozen field per setting of the option table
    (lab.common.options), with its default (`np` has none: invoke.yaml holds the task's)."""
    fields = [(o.name, o.kind if o.kind is not list else list[int],
               dataclasses.field() if o.value is dataclasses.MISSING else dataclasses.field(default=o.value))
              for o in options.SETTINGS]
    cls = dataclasses.make_dataclass("BenchSettings", fields, frozen=True)
    cls.__module__ = __name__
    cls.__doc__ = "What one bench request asks for (lab.common.options declares each field)."
    return cls


BenchSettings = _settings_class()


BENCH_FLAGS = {f.name for f in dataclasses.fields(BenchSettings)}


RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def check_run_id(run_id: str) -> None:
    """The run-id form, the one place it is checked: a folder name inside --results-dir."""
    if run_id and (not RUN_ID.match(run_id) or ".." in run_id):
        raise BenchError(f"--run-id names a folder inside --results-dir: letters, digits, '.', "
                         f"'_' and '-' only, not {run_id!r}")


def base_config(s: BenchSettings, framework: str) -> RunConfig:
    """The run configuration the settings name: every field RunConfig and BenchSettings
    share, carried by name (a field added to both is carried without a line here), but
    the framework (resolved against the stack), --stall-s (auto and off are 0 and -1 in
    the settings) and repeat (the settings' count of repeats, the configuration's index)."""
    shared = {f.name: getattr(s, f.name) for f in dataclasses.fields(RunConfig)
              if f.name in BENCH_FLAGS and f.name not in ("framework", "stall_s", "repeat")}
    shared["run_id"] = s.run_id or RunConfig.run_id
    return RunConfig(**shared, framework=framework, stall_s=max(s.stall_s, 0.0))


def attempt_name(s: BenchSettings, framework: str, np: int, index: int = 0, repeat: int = 0) -> str:
    """The name of one launch (its failures/, heartbeats/ and slurm/ folders): the one form,
    '000-horovod-gloo-none-n1-np2-r0'; a strategy other than data parallelism (ddp) first,
    '000-fsdp-ddp-gloo-none-n1-np2-r0'."""
    what = framework if s.strategy == "ddp" else f"{s.strategy}-{framework}"
    return f"{index:03d}-{what}-{s.backend}-{s.compression}-n{s.nodes}-np{np}-r{repeat}"


def check_max_restarts(s) -> None:
    """--max-restarts counts retries: the one check of its value (bench, invoke sbatch,
    invoke k8s)."""
    if s.max_restarts < 0:
        raise BenchError(f"--max-restarts counts retries: 0 or more, not {s.max_restarts}")
