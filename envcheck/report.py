"""Rendering the doctor's results: a table (where, check, status, value, fix), a
one-line summary, or JSON. Nothing here measures anything."""
from __future__ import annotations

import json

from envcheck.probes import FAIL, PASS, SKIP, WARN

ORDER = (PASS, WARN, FAIL, SKIP)


def short(name: str, value) -> str:
    """One readable cell for a probe's value."""
    if value is None:
        return ""
    if name == "allreduce_sweep" and isinstance(value, dict):
        big = value["rows"][-1]
        return (f"{value['backend']}, {value['ranks']} ranks: busbw {big['busbw_gbs']:.3g} GB/s, "
                f"algbw {big['algbw_gbs']:.3g} GB/s at {big['size_bytes'] / 2**20:g} MiB; "
                f"{value['rows'][0]['time_us']:.0f} us at {value['rows'][0]['size_bytes'] / 1024:g} KiB")
    if name == "nccl_all_reduce_perf" and isinstance(value, dict):
        big = value["rows"][-1]
        return (f"{value['gpus']} GPU(s): busbw {big['busbw_gbs']:.3g} GB/s, algbw "
                f"{big['algbw_gbs']:.3g} GB/s at {big['size_bytes'] / 2**20:g} MiB")
    if name == "mpi_hello" and isinstance(value, dict):
        return (f"{len(value['ranks'])}/{value['np']} ranks on {', '.join(value['hosts'])}; "
                f"all-reduce {'OK' if value['allreduce_ok'] else 'WRONG'}; MPIX_Query_cuda_support "
                f"(the library's build): {value.get('cuda_support_query')}")
    if name == "horovod" and isinstance(value, dict):
        return (f"{value['version']}: {'/'.join(value.get('frameworks', []))}; controllers "
                f"{'/'.join(value.get('controllers', []))}; ops {'/'.join(value.get('tensor_operations', []))}; "
                f"GPU ops {value.get('gpu_operations')}")
    if name == "gpus" and isinstance(value, dict):
        names = sorted({d["name"] for d in value.get("devices", [])})
        return f"{value.get('count')} x {', '.join(names)}; driver {value.get('driver')}"
    if name == "lab_images" and isinstance(value, dict):
        return "; ".join(f"{tag} ({v.get('flavor')}, torch {v.get('torch_version')}"
                         + (f", CUDA {v['cuda_version']}, {v.get('horovod_gpu_operations')}" if v.get("cuda_version") else "")
                         + ")" for tag, v in value.items())
    if name == "mpi_cuda_build":
        return "CUDA-aware (ompi_info)" if value else "not CUDA-aware (ompi_info)"
    if name == "memlock" and isinstance(value, int):
        return f"{value / 2**20:g} MiB"
    if name == "shm" and isinstance(value, dict):
        return f"{value['bytes'] / 2**30:.2f} GiB"
    if isinstance(value, dict):
        text = ", ".join(f"{k}={v}" for k, v in value.items())
    else:
        text = str(value)
    return text if len(text) <= 90 else text[:89] + "…"


def rows(checks: list[dict]) -> list[list[str]]:
    return [[c["where"], c["name"], c["status"], short(c["name"], c["value"]), c["fix"]] for c in checks]


def table(checks: list[dict]) -> str:
    """A plain-text table for the terminal (tabulate's "simple" format)."""
    from tabulate import tabulate
    return tabulate(rows(checks), headers=["where", "check", "status", "value", "fix"],
                    tablefmt="simple", disable_numparse=True)


def counts(checks: list[dict]) -> dict:
    return {s: sum(1 for c in checks if c["status"] == s) for s in ORDER}


def summary(checks: list[dict], seconds: float) -> str:
    n = counts(checks)
    verdict = "problems found" if n[FAIL] else "nothing failed"
    return (f"doctor: {len(checks)} checks in {seconds:.1f} s: {n[PASS]} PASS, {n[WARN]} WARN, "
            f"{n[FAIL]} FAIL, {n[SKIP]} SKIP; {verdict}")


def as_json(checks: list[dict], seconds: float, notes: list[str]) -> str:
    return json.dumps({"checks": checks, "counts": counts(checks), "seconds": round(seconds, 2),
                       "notes": notes}, default=str)
