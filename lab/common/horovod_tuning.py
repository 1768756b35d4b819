"""Horovod's effective tensor-fusion threshold and cycle time, as a rank's Horovod reads
them from its environment, for the run's record and doctor's Horovod sweep. Standard
library only (pure).

Horovod 0.28.1, horovod/common/operations.cc, BackgroundThreadLoop:
- the fusion threshold is 128 MiB (SetTensorFusionThresholdBytes(128 * 1024 * 1024)),
  replaced by HOROVOD_FUSION_THRESHOLD read with std::strtol(value, nullptr, 10), bytes;
  (the default was 64 MB before Horovod PR 2468, commit 3ffe479e);
- the cycle time is 1 ms (SetCycleTimeMs(1)), 0 when HOROVOD_ENABLE_XLA_OPS is set
  (SetBoolFromEnv: strtol(value) > 0), replaced by HOROVOD_CYCLE_TIME read with
  std::strtof, milliseconds;
- HOROVOD_AUTOTUNE (strtol > 0) lets the parameter manager (horovod/common/
  parameter_manager.cc) tune the values that were not set: a set value is passed with
  fixed=true and stays. Under autotune the record holds the starting point.
"""
from __future__ import annotations

import os
import re

DEFAULT_FUSION_THRESHOLD_BYTES = 128 * 1024 * 1024
DEFAULT_CYCLE_TIME_MS = 1.0
FUSION = "HOROVOD_FUSION_THRESHOLD"
CYCLE = "HOROVOD_CYCLE_TIME"


def _strtol(text: str) -> int:
    """C's strtol(text, nullptr, 10): leading blanks, a sign, the digits that follow;
    0 when there are none ("64MB" is 64)."""
    m = re.match(r"\s*([+-]?\d+)", text)
    return int(m.group(1)) if m else 0


def _strtof(text: str) -> float:
    """C's strtof for decimal text: the longest leading number; 0.0 when there is none."""
    m = re.match(r"\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)", text)
    return float(m.group(1)) if m else 0.0


def _flag(environ, name: str) -> bool:
    value = environ.get(name)
    return value is not None and _strtol(value) > 0


def effective(environ=None) -> dict:
    """{"fusion_threshold_bytes", "cycle_time_ms", "set_by" (the variables that set
    them), "autotune"}: what Horovod uses, from `environ` (os.environ by default)."""
    environ = os.environ if environ is None else environ
    set_by = {}
    fusion = DEFAULT_FUSION_THRESHOLD_BYTES
    if FUSION in environ:
        fusion = _strtol(environ[FUSION])
        set_by["fusion_threshold_bytes"] = f"{FUSION}={environ[FUSION]}"
    cycle = 0.0 if _flag(environ, "HOROVOD_ENABLE_XLA_OPS") else DEFAULT_CYCLE_TIME_MS
    if CYCLE in environ:
        cycle = _strtof(environ[CYCLE])
        set_by["cycle_time_ms"] = f"{CYCLE}={environ[CYCLE]}"
    return {"fusion_threshold_bytes": fusion, "cycle_time_ms": cycle, "set_by": set_by,
            "autotune": _flag(environ, "HOROVOD_AUTOTUNE")}
