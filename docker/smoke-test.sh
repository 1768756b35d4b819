#!/usr/bin/env bash
# The image's smoke tests, run at the end of its build: the build fails when the
# stack is not what was asked for.
#   GPU_OPERATIONS=NCCL|MPI|"" FLAVOR=cpu|gpu [DEEPSPEED_VERSION=X.Y.Z] bash docker/smoke-test.sh
set -euo pipefail
flavor="${FLAVOR:-cpu}"
ops="${GPU_OPERATIONS:-}"
deepspeed="${DEEPSPEED_VERSION:-}"
fail() { echo "smoke-test: FAILED: $*" >&2; exit 1; }

mpirun --version | head -n1 || fail "mpirun does not answer"
# Slurm's daemons say their version without a configuration (the client commands need
# one: the cluster writes it at run time).
slurmctld -V || fail "slurmctld does not answer"
slurmd -V || fail "slurmd does not answer"
munged --version || fail "munged does not answer"
command -v sinfo srun sbatch scontrol >/dev/null || fail "Slurm's client commands are missing"
[[ ! -e /etc/munge/munge.key ]] || fail "a MUNGE key is in the image"
out="$(horovodrun --check-build)"
echo "$out"
for want in "PyTorch" "MPI" "Gloo"; do
    grep -Eq "\[X\] $want" <<<"$out" || fail "horovodrun --check-build does not show $want"
done
# GPU operations: NCCL shows in --check-build; MPI always does once the MPI controller
# is built, so MPI GPU operations are read from the library: CUDA without NCCL.
case "$ops" in
    NCCL) grep -Eq "\[X\] NCCL" <<<"$out" || fail "horovodrun --check-build does not show NCCL" ;;
    MPI) python -c '
import horovod.torch as h
from lab.common.kit import horovod_gpu_operations
assert horovod_gpu_operations(h) == "MPI" and h.cuda_built() and h.mpi_built() and not h.nccl_built()' \
            || fail "Horovod was not built for MPI GPU operations (build record, CUDA, MPI, no NCCL)" ;;
    "") python -c 'import horovod.torch as h; assert not h.cuda_built()' 2>/dev/null \
            || fail "a CPU image's Horovod was built with CUDA" ;;
esac
[[ -n "$ops" ]] && echo "smoke-test: Horovod's GPU operations are $ops"
if [[ "$flavor" == gpu ]]; then
    ompi_info --parsable --all | grep -q '_built_with_cuda_support:value:true' \
        || fail "Open MPI is not CUDA-aware (ompi_info: opal_built_with_cuda_support is not true)"
    echo "smoke-test: Open MPI is CUDA-aware (ompi_info)"
    # One NCCL: the one torch loads is the one Horovod was built with.
    python - <<'PY' || fail "torch and Horovod do not use the same NCCL"
import torch, horovod.torch as hvd
assert torch.version.cuda, "torch is not a CUDA build"
t = ".".join(map(str, torch.cuda.nccl.version()))
if hvd.nccl_built():
    from lab.common.kit import horovod_nccl_version
    h = horovod_nccl_version(hvd.nccl_built())
    assert h == t, f"Horovod was built with NCCL {h}, torch loads {t}"
print(f"smoke-test: torch {torch.__version__} (CUDA {torch.version.cuda}) loads NCCL {t}")
PY
    # Exactly one NCCL in a process, torch's, although the base may hold a system NCCL
    # (nvidia/cuda's libnccl2) on the library path: read from /proc/self/maps of a
    # process that imported torch and Horovod, alone and as an MPI rank (as doctor's
    # probes and the kit's launches start them), and from ldd of what links NCCL.
    nccl_dir="$(PYTHON=python bash /opt/lab-kit/docker/torch-nccl.sh)/lib"
    cat > /tmp/one-nccl.py <<'PY'
import os, sys
import torch, horovod.torch  # noqa: F401  (what a rank imports)
mapped = sorted({os.path.realpath(ln.split()[-1]) for ln in open("/proc/self/maps")
                 if "libnccl" in ln.rsplit("/", 1)[-1]})
want = os.path.realpath(sys.argv[1])
assert len(mapped) == 1 and mapped[0].startswith(want + "/"), f"NCCL libraries mapped: {mapped}, want one under {want}"
print(f"smoke-test: one NCCL in the process ({sys.argv[2]}): {mapped[0]}")
PY
    python /tmp/one-nccl.py "$nccl_dir" "python" || fail "a process that imports torch and Horovod does not hold exactly torch's NCCL"
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 1 python /tmp/one-nccl.py "$nccl_dir" "an mpirun rank" \
        || fail "an MPI rank that imports torch and Horovod does not hold exactly torch's NCCL"
    rm -f /tmp/one-nccl.py
    linked=("$(python -c 'import glob, os, horovod.torch as h; print(glob.glob(os.path.join(os.path.dirname(h.__file__), "mpi_lib_v2*.so"))[0])')")
    [[ "${NCCL_TESTS:-1}" == 1 ]] && linked+=("$(command -v all_reduce_perf)")
    for bin in "${linked[@]}"; do
        got="$(ldd "$bin" | sed -n 's/.*libnccl\.so\.2 => \([^ ]*\).*/\1/p')"
        [[ "$got" != not ]] || fail "$bin does not find libnccl.so.2 (ldd: not found)"
        [[ -z "$got" || "$(readlink -f "$got")" == "$(readlink -f "$nccl_dir")"/* ]] \
            || fail "$bin resolves libnccl.so.2 to $got, not torch's NCCL in $nccl_dir"
        echo "smoke-test: $(basename "$bin") links ${got:-no NCCL}"
    done
    if [[ "${NCCL_TESTS:-1}" == 1 ]]; then
        command -v all_reduce_perf >/dev/null || fail "nccl-tests' all_reduce_perf is not on the PATH"
        ! ldd "$(command -v all_reduce_perf)" | grep -q 'not found' \
            || fail "all_reduce_perf has unresolved libraries: $(ldd "$(command -v all_reduce_perf)" | grep 'not found')"
        echo "smoke-test: nccl-tests installed, its libraries resolve"
    fi
fi
python - <<'PY'
import horovod.torch as hvd
hvd.init()
assert hvd.size() == 1 and hvd.rank() == 0
import lab.worker.train, envcheck.probes  # the kit is installed
print("smoke-test: horovod.torch imports and hvd.init() works; size", hvd.size())
PY
# DeepSpeed (when the image has it) imports with the accelerator the ranks give it
# (lab.worker.strategies.deepspeed sets DS_ACCELERATOR from --device), at the matrix's
# version; the CPU accelerator's collectives fall back to Gloo (no oneCCL here).
if [[ -n "$deepspeed" ]]; then
    accel=cpu
    [[ "$flavor" == gpu ]] && accel=cuda
    DS_ACCELERATOR="$accel" WANT="$deepspeed" python - <<'PY' || fail "deepspeed $deepspeed does not import as it should (DS_ACCELERATOR=$accel)"
import os
import deepspeed
from deepspeed.accelerator import get_accelerator
a = get_accelerator()
assert deepspeed.__version__ == os.environ["WANT"], f"deepspeed {deepspeed.__version__}, the matrix says {os.environ['WANT']}"
assert a.device_name() == os.environ["DS_ACCELERATOR"], a.device_name()
if a.device_name() == "cpu":
    assert a.communication_backend_name() == "gloo", a.communication_backend_name()
print(f"smoke-test: deepspeed {deepspeed.__version__} imports, accelerator {a.device_name()}, "
      f"collectives {a.communication_backend_name()}")
PY
fi
# Two ranks really all-reduce, over each controller.
for controller in gloo mpi; do
    horovodrun -np 2 -H localhost:2 "--$controller" python -c '
import torch, horovod.torch as hvd
hvd.init()
s = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
assert s.item() == 3.0, s
' >/dev/null || fail "horovodrun -np 2 --$controller all-reduce"
    echo "smoke-test: 2-rank all-reduce over $controller OK"
done
echo "smoke-test: passed"
