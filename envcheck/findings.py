"""Contradictions between what the probes measured, each its own finding. Pure: takes
the probes' results (by name, host side and where-the-ranks-run side) and returns
Results."""
from __future__ import annotations

from envcheck.probes import FAIL, PASS, SKIP, WARN, Result
from lab.common import versions
from lab.common.versions import archs_cover, cuda_entry_for


def _value(results: dict, name: str):
    r = results.get(name)
    return r.value if r is not None and r.status == PASS else None


def find(host: dict, ranks: dict, np: int, in_image: bool,
         visible: int | None = None, cores: int | None = None) -> list[Result]:
    """host, ranks: {probe name: Result}. np: the rank count asked for. visible: how many
    GPUs the image was given (the host's CUDA_VISIBLE_DEVICES), None for all. cores: the
    cores the ranks may run on (lab.common.kit.cores), None when not known."""
    out = []
    name = "finding: a core per rank"
    if cores is not None and np > cores:
        # bench says the same before such a run and marks its record (world.oversubscribed)
        out.append(Result(name, WARN, {"np": np, "cores": cores},
                          f"{np} ranks on {cores} core(s) share them: time per step and efficiency "
                          f"then measure the scheduler; use --np {cores} or fewer here, or more nodes"))
    else:
        out.append(Result(name, PASS if cores is not None else SKIP, {"np": np, "cores": cores},
                          "" if cores is not None else "the cores where the ranks run are not known"))
    hvd = _value(ranks, "horovod") or {}
    aware = _value(ranks, "mpi_cuda_build")
    name = "finding: MPI GPU operations need a CUDA-aware MPI"
    if hvd.get("gpu_operations") == "MPI" and aware is False:
        out.append(Result(name, FAIL, {"gpu_operations": "MPI", "mpi_cuda_aware": False},
                          "Horovod hands GPU buffers to an MPI that cannot read them: build the image "
                          "with --gpu-ops MPI (its Open MPI is CUDA-aware) or use --gpu-ops NCCL"))
    else:
        out.append(Result(name, PASS if hvd.get("gpu_operations") == "MPI" else SKIP,
                          hvd.get("gpu_operations"),
                          "" if hvd.get("gpu_operations") == "MPI" else "Horovod has no MPI GPU operations"))

    torch_v = _value(ranks, "torch") or {}
    gpus = torch_v.get("device_count", 0)
    name = "finding: one GPU per rank with NCCL"
    if gpus and np > gpus:
        # Not a fault of the machine: every GPU probe clamps itself to the GPUs present
        # (stack.py: min(np, gpus)), so a one-GPU workstation under doctor's default
        # --np 2 is fine. What it says is what bench will refuse on this host.
        out.append(Result(name, PASS, {"np": np, "gpus": gpus},
                          f"the GPU checks ran on {gpus} GPU(s), not {np}; NCCL needs one GPU "
                          f"per rank, so bench here takes --np {gpus} or fewer with --device cuda"))
    else:
        out.append(Result(name, PASS if gpus else SKIP, {"np": np, "gpus": gpus},
                          "" if gpus else "no GPU where the ranks run"))

    host_gpus = (_value(host, "gpus") or {}).get("count", 0)
    name = "finding: a CUDA torch sees the GPUs"
    if torch_v.get("cuda_build") and not torch_v.get("cuda_available"):
        if host_gpus:
            out.append(Result(name, FAIL, {"host_gpus": host_gpus, "visible": 0},
                              "the host has GPUs but the ranks see none: run the container with "
                              "the GPUs (--gpus all; NVIDIA Container Toolkit) or check CUDA_VISIBLE_DEVICES"))
        else:
            out.append(Result(name, WARN, {"cuda_build": torch_v["cuda_build"], "visible": 0},
                              "torch is a CUDA build and no GPU is visible: jobs run on the CPU "
                              "(--device cpu)"))
    else:
        out.append(Result(name, PASS if torch_v.get("cuda_available") else SKIP,
                          torch_v.get("cuda_build"), "" if torch_v.get("cuda_available")
                          else "a CPU build of torch"))

    name = "finding: the GPU images have code for these GPUs"
    devices = (_value(host, "gpus") or {}).get("devices", [])
    images = _value(host, "lab_images") or {}
    missing, uncovered = {}, set()
    for tag, labels in images.items():
        archs = labels.get("cuda_archs")
        if not archs:
            continue
        lacking = [d for d in devices if d.get("compute_capability")
                   and not archs_cover(archs, d["compute_capability"], labels.get("cuda_ptx") == "1")]
        if lacking:
            uncovered.update(d["compute_capability"] for d in lacking)
            missing[tag] = {"built_for": archs, "gpus": sorted(
                {f"{d.get('name', 'GPU')} ({d['compute_capability']})" for d in lacking})}
    fitting = [t for t, labels in images.items() if labels.get("cuda_archs") and t not in missing]
    if missing and fitting:
        # Another built image has the code: bench takes that one; this is for information.
        out.append(Result(name, PASS, {"fits": fitting, "no_code": missing},
                          f"bench uses {', '.join(fitting)}; "
                          + "; ".join(f"{t} has no code for {', '.join(v['gpus'])}"
                                      for t, v in missing.items())))
    elif missing:
        matrix = versions.read()
        entries = {cuda_entry_for(matrix, c) for c in uncovered}
        fix = (f"build an image for them: invoke build --cuda {entries.pop()}"
               if len(entries) == 1 and None not in entries
               else "no one CUDA entry of the version matrix (docker/versions.env) covers them all")
        out.append(Result(name, FAIL, missing,
                          "; ".join(f"{t} is built for {v['built_for']}, not for {', '.join(v['gpus'])}"
                                    for t, v in missing.items()) + f": {fix}"))
    else:
        checked = devices and any(v.get("cuda_archs") for v in images.values())
        out.append(Result(name, PASS if checked else SKIP, None,
                          "" if checked else "no GPU here, or no GPU image built"))

    name = "finding: the ranks see every GPU of the host"
    expected = visible if visible is not None else host_gpus
    if in_image and host_gpus and torch_v and gpus != expected:
        given = "" if visible is None else f" (CUDA_VISIBLE_DEVICES gives it {visible})"
        out.append(Result(name, FAIL, {"host": host_gpus, "given": expected, "in_image": gpus},
                          f"NVML sees {host_gpus} GPU(s) on the host{given}, torch sees {gpus} in "
                          f"the image: check --gpus and CUDA_VISIBLE_DEVICES"))
    else:
        out.append(Result(name, PASS if host_gpus else SKIP, {"host": host_gpus, "ranks": gpus},
                          "" if host_gpus else "no GPU on this host"))
    return out
