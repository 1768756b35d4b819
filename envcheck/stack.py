"""Probes of the training stack, run where the ranks run (inside the lab image, or
locally): torch and its CUDA, cuDNN and NCCL; Horovod's build; the MPI, its CUDA
awareness in three steps (ompi_info's build flag, the library's own answer to
MPIX_Query_cuda_support, a GPU buffer really all-reduced: only the last is a run-time
test); an MPI hello over N ranks; nccl-tests' all_reduce_perf over the GPUs;
and a torch.distributed sweep of nccl-tests' collectives (Gloo on CPU; NCCL on every
GPU, or one GPU's device copy). Each returns a Result and never raises; torch and
Horovod are imported inside the probes."""
from __future__ import annotations

import json
import os
import shutil
import sys

from envcheck.horovod_build import check_build_facts, horovod_frameworks
from envcheck.nccl_tests import parse_nccl_tests
from envcheck.probes import (
    FAIL,
    PASS,
    SKIP,
    WARN,
    ProbeError,
    Result,
    cuda_available,
    cuda_init_problem,
    parse_ompi_info_cuda,
    probe,
    probe_mpi_version,
    run_command,
)
from lab.common import kit

DEFAULT_NP = 2   # ranks of the MPI hello and the all-reduce probes (doctor's --np)

@probe("torch")
def probe_torch() -> Result:
    """torch, its CUDA, and the GPUs it sees. A CUDA build whose initialisation fails
    with an error this kit knows (802: the fabric manager) is a FAIL naming the fix."""
    import torch
    avail, said = cuda_available()
    value = {"version": torch.__version__, "cuda_build": torch.version.cuda,
             "cuda_available": avail, "device_count": torch.cuda.device_count() if avail else 0}
    problem = cuda_init_problem(said) if torch.version.cuda and not avail else None
    if problem:
        value["cuda_init_error"] = said.strip().splitlines()[0][:300]
        return Result("torch", FAIL, value, problem)
    return Result("torch", PASS, value)


@probe("cudnn")
def probe_cudnn() -> Result:
    import torch
    if not torch.backends.cudnn.is_available():
        return Result("cudnn", SKIP, None, "this torch has no cuDNN (a CPU build)")
    return Result("cudnn", PASS, torch.backends.cudnn.version())


@probe("horovod")
def probe_horovod() -> Result:
    """Horovod's frameworks, controllers and tensor operations (what `horovodrun
    --check-build` prints, read in this process: check_build_facts), and whether
    horovod.torch imports against this torch and horovodrun is there to start it."""
    import importlib.util
    if importlib.util.find_spec("horovod") is None:
        return Result("horovod", SKIP, None, "Horovod is not installed: docker/install-horovod.sh builds it")
    try:
        import horovod
        import horovod.torch as hvd
    except Exception as e:
        line = f"{type(e).__name__}: {e}".splitlines()[0][:200]
        return Result("horovod", FAIL, None, f"horovod.torch does not import ({line}); torch changed "
                      f"after Horovod was built: rebuild it with docker/install-horovod.sh")
    # horovod/torch/__init__.py (0.28.1): without its compiled library the import still
    # succeeds, printing a warning, and defines none of the build's facts
    if not hasattr(hvd, "mpi_built"):
        return Result("horovod", FAIL, None, "horovod.torch imports without its compiled "
                      "extension (mpi_lib_v2): rebuild Horovod with docker/install-horovod.sh")
    runner = kit.horovodrun()
    if not os.path.exists(runner) and shutil.which(runner) is None:
        raise ProbeError("horovodrun is not beside this Python nor on the PATH: reinstall Horovod "
                         "with docker/install-horovod.sh")
    value = check_build_facts(hvd, horovod.__version__,
                              horovod_frameworks(os.path.dirname(horovod.__file__)))
    nccl = hvd.nccl_built()
    value["gpu_operations"] = kit.horovod_gpu_operations(hvd)
    value["cuda"] = bool(hvd.cuda_built())
    value["nccl"] = kit.horovod_nccl_version(nccl)
    return value


@probe("nccl")
def probe_nccl(hvd: Result) -> Result:
    """The NCCL torch loads, and the one Horovod was built with: one and the same."""
    import torch
    if not torch.version.cuda:
        return Result("nccl", SKIP, None, "a CPU build of torch has no NCCL")
    v = torch.cuda.nccl.version()
    t = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    h = (hvd.value or {}).get("nccl") if hvd.status == PASS else None
    value = {"torch": t, "horovod": h}
    if h and h != t:
        return Result("nccl", FAIL, value, f"Horovod was built with NCCL {h} and torch loads {t}: "
                      f"two NCCLs in one process; rebuild Horovod with docker/install-horovod.sh")
    return Result("nccl", PASS, value)


probe_mpi = probe_mpi_version     # the same probe as the manifest's


@probe("mpi_cuda_build")
def probe_mpi_cuda_build(mpi: Result, timeout: float = 30) -> Result:
    """Step 1 of 3: Open MPI's build flag (ompi_info)."""
    if mpi.status == PASS and mpi.value.get("implementation") != "Open MPI":
        return Result("mpi_cuda_build", SKIP, None, f"{mpi.value['implementation']} has no ompi_info")
    text = run_command(["ompi_info", "--parsable", "--all"], timeout=timeout)
    try:
        aware = parse_ompi_info_cuda(text)
    except ValueError as e:
        raise ProbeError(f"ompi_info: {e}") from None
    return Result("mpi_cuda_build", PASS, aware)


def _mpirun(np: int) -> list[str]:
    """mpirun as the kit's MPI runs start it: the same transports (lab.common.ompi: what
    horovodrun --mpi passes), so the hello and the GPU all-reduce test that path."""
    from lab.common import ompi
    cmd = ["mpirun", "-np", str(np), "--oversubscribe", *ompi.mca_args()]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd


def _hello_lines(text: str) -> list[dict]:
    out = []
    for line in text.replace("}{", "}\n{").splitlines():
        line = line.strip()
        if line.startswith("{") and '"rank"' in line:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


@probe("mpi_hello")
def probe_mpi_hello(np: int = 2, timeout: float = 60) -> Result:
    """N ranks start under mpirun; each answers with its rank and host, and a small
    host-memory all-reduce through MPI gives the right sum. Also reads the library's
    MPIX_Query_cuda_support() (step 2 of 3: in Open MPI 4.1 a compile-time constant, so it
    shows which library the ranks loaded, not that CUDA buffers work)."""
    text = run_command(_mpirun(np) + [sys.executable, "-m", "envcheck.mpi_hello"], timeout=timeout)
    answers = _hello_lines(text)
    ranks = sorted(a["rank"] for a in answers)
    value = {"np": np, "ranks": ranks, "hosts": sorted({a["host"] for a in answers}),
             "allreduce_ok": bool(answers) and all(a["allreduce"]["ok"] for a in answers),
             "cuda_support_query": answers[0].get("cuda_support_query") if answers else None}
    if ranks != list(range(np)):
        return Result("mpi_hello", FAIL, value, f"{len(answers)} of {np} ranks answered: "
                      f"check the MPI installation (mpirun -np {np} hostname)")
    if not value["allreduce_ok"]:
        return Result("mpi_hello", FAIL, value, "an all-reduce through MPI gave a wrong sum")
    return Result("mpi_hello", PASS, value)


@probe("mpi_gpu_allreduce")
def probe_mpi_gpu_allreduce(torch_r: Result, np: int = 2, timeout: float = 120,
                            hvd: Result | None = None) -> Result:
    """Step 3 of 3: a GPU buffer all-reduced through MPI (only a CUDA-aware MPI can). A
    FAIL only where Horovod hands GPU data to MPI (its GPU operations are MPI); where they
    are NCCL (or there are none) GPU tensors never reach MPI (Horovod 0.28.1,
    horovod/common/operations.cc, CreateOperationManager: MPI_GPUAllreduce is registered
    only when built with HOROVOD_GPU_ALLREDUCE == 'M', the NCCL ops with 'N'), so a
    non-CUDA-aware MPI is only a WARN there."""
    gpus = (torch_r.value or {}).get("device_count", 0) if torch_r.status == PASS else 0
    if gpus < 1:
        return Result("mpi_gpu_allreduce", SKIP, None, "no GPU visible: nothing to all-reduce on a GPU")
    n = min(np, gpus)
    try:
        text = run_command(_mpirun(n) + [sys.executable, "-m", "envcheck.mpi_hello", "--gpu"],
                           timeout=timeout)
    except ProbeError as e:
        text, why = "", str(e)
    else:
        why = ""
    answers = _hello_lines(text)
    if len(answers) == n and all(a["allreduce"]["ok"] for a in answers):
        return Result("mpi_gpu_allreduce", PASS, {"np": n})
    ops = (hvd.value or {}).get("gpu_operations") if hvd is not None and hvd.status == PASS else None
    value = {"np": n, "answers": len(answers), "horovod_gpu_operations": ops}
    detail = f" ({why})" if why else ""
    if ops == "MPI":
        return Result("mpi_gpu_allreduce", FAIL, value,
                      f"MPI could not all-reduce GPU memory{detail} and Horovod's GPU operations are "
                      f"MPI: build the image with --gpu-ops MPI (its Open MPI is CUDA-aware) or use "
                      f"--gpu-ops NCCL")
    return Result("mpi_gpu_allreduce", WARN, value,
                  f"this MPI is not CUDA-aware{detail}; Horovod's GPU operations are "
                  f"{ops or 'absent'}, so GPU data never goes through MPI here: only a --gpu-ops "
                  f"MPI image (invoke build --gpu-ops MPI) needs it")


@probe("nccl_all_reduce_perf")
def probe_nccl_tests(torch_r: Result, np: int = 2, timeout: float = 120) -> Result:
    gpus = (torch_r.value or {}).get("device_count", 0) if torch_r.status == PASS else 0
    if gpus < 1:
        return Result("nccl_all_reduce_perf", SKIP, None, "no GPU visible: nccl-tests needs GPUs")
    if shutil.which("all_reduce_perf") is None:
        return Result("nccl_all_reduce_perf", SKIP, None, "all_reduce_perf is not installed "
                      "(docker/install-nccl-tests.sh; the GPU image has it)")
    n = min(np, gpus)
    text = run_command(["all_reduce_perf", "-b", "8", "-e", "128M", "-f", "4", "-g", str(n)], timeout=timeout)
    try:
        parsed = parse_nccl_tests(text)
    except ValueError as e:
        raise ProbeError(f"all_reduce_perf: {e}") from None
    parsed["gpus"] = n
    if n == 1:
        # One GPU: nothing crosses a bus, busbw is 0 by definition; time and algbw remain.
        for r in parsed["rows"]:
            r["busbw_gbs"] = r["inplace_busbw_gbs"] = 0.0
    wrong = sum((r["wrong"] or 0) + (r["inplace_wrong"] or 0) for r in parsed["rows"])
    if wrong:
        return Result("nccl_all_reduce_perf", FAIL, parsed, f"{wrong} wrong values: NCCL corrupts data here")
    return Result("nccl_all_reduce_perf", PASS, parsed)


def collectives_ranks(gpus: int, np: int) -> tuple[str, int]:
    """(backend, ranks) of doctor's collectives: on a host with GPUs NCCL with one rank per
    GPU, all of them (one GPU: one rank, whose sweep is the device copy, envcheck.collectives.plan);
    without, Gloo on doctor's --np ranks."""
    return ("nccl", gpus) if gpus >= 1 else ("gloo", np)


@probe("collectives")
def probe_collectives(torch_r: Result, np: int = 2, timeout: float = 300,
                      nccl_tests: Result | None = None) -> Result:
    """The collectives' bus bandwidth over message sizes, and the memory copy bandwidth
    they are a share of (envcheck.collectives); on one GPU the device copy instead. Where
    nccl-tests ran, its all_reduce_perf's largest size rides along as the reference."""
    backend, ranks = collectives_ranks(_gpus(torch_r), np)
    # the ranks started as torch.distributed.run --standalone starts them, by the kit's
    # launcher that does not import torch itself (lab.host.launchers.local)
    text = run_command([sys.executable, "-m", "lab.host.launchers.local",
                        f"--nproc-per-node={ranks}", "-m", "envcheck.collectives", "--backend", backend],
                       timeout=timeout, env=dict(os.environ, OMP_NUM_THREADS="1"))
    for line in reversed(text.splitlines()):
        if line.startswith("{") and '"ops"' in line:
            value = json.loads(line)
            if nccl_tests is not None and nccl_tests.status == PASS:
                big = nccl_tests.value["rows"][-1]
                value["nccl_tests"] = {"op": "allreduce", "gpus": nccl_tests.value.get("gpus"),
                                       "size_bytes": big["size_bytes"], "busbw_gbs": big["busbw_gbs"],
                                       "algbw_gbs": big["algbw_gbs"]}
            return Result("collectives", PASS, value)
    raise ProbeError("the collectives' sweep printed no result")


@probe("collectives_mpi")
def probe_collectives_mpi(hvd: Result, np: int = 2, timeout: float = 240) -> Result:
    """The collectives through Horovod (all but reduce, which it lacks) under mpirun
    (MPI's, on host memory), with the same reference (envcheck.collectives --backend
    horovod)."""
    if hvd.status != PASS or "MPI" not in (hvd.value or {}).get("controllers", []):
        return Result("collectives_mpi", SKIP, None, "Horovod is not built with MPI here: the "
                      "collectives over MPI are measured through Horovod")
    return _horovod_sweep("collectives_mpi", "horovod", "MPI", np, timeout)


@probe("collectives_ccl")
def probe_collectives_ccl(hvd: Result, np: int = 2, timeout: float = 240) -> Result:
    """The same through Horovod's oneCCL operations under mpirun (envcheck.collectives
    --backend ccl: all but reduce and reduce-scatter, which Horovod's oneCCL lacks)."""
    if hvd.status != PASS or "CCL" not in (hvd.value or {}).get("tensor_operations", []):
        return Result("collectives_ccl", SKIP, None, "Horovod is not built with oneCCL here "
                      "(docker/install-horovod.sh builds it on x86_64 without GPU operations)")
    if "MPI" not in (hvd.value or {}).get("controllers", []):
        return Result("collectives_ccl", SKIP, None, "Horovod's oneCCL operations run under its "
                      "MPI controller, which this Horovod lacks")
    return _horovod_sweep("collectives_ccl", "ccl", "oneCCL", np, timeout)


def _horovod_sweep(name: str, backend: str, label: str, np: int, timeout: float) -> Result:
    """envcheck.collectives --backend BACKEND under mpirun, one thread a rank: its last JSON
    line of operations is the sweep."""
    text = run_command(_mpirun(np) + [sys.executable, "-m", "envcheck.collectives", "--backend", backend],
                       timeout=timeout, env=dict(os.environ, OMP_NUM_THREADS="1"))
    for line in reversed(text.splitlines()):
        if line.startswith("{") and '"ops"' in line:
            return Result(name, PASS, json.loads(line))
    raise ProbeError(f"the collectives' sweep over {label} printed no result")


def _gpus(torch_r: Result) -> int:
    return (torch_r.value or {}).get("device_count", 0) if torch_r.status == PASS else 0


def collect(np: int = 2) -> list[Result]:
    torch_r = probe_torch()
    hvd = probe_horovod()
    mpi = probe_mpi()
    from envcheck.host import probe_memlock, probe_nccl_socket_ifname, probe_shm
    from envcheck.rdma import probe_verbs_libraries
    nccl = probe_nccl_tests(torch_r, np)
    return [torch_r, probe_cudnn(), hvd, probe_nccl(hvd), mpi, probe_mpi_cuda_build(mpi),
            probe_shm(), probe_memlock(_gpus(torch_r)), probe_nccl_socket_ifname(),
            probe_mpi_hello(np), probe_mpi_gpu_allreduce(torch_r, np, hvd=hvd), nccl,
            probe_collectives(torch_r, np, nccl_tests=nccl), probe_collectives_mpi(hvd, np),
            probe_collectives_ccl(hvd, np),
            probe_verbs_libraries()]
