#!/usr/bin/env bash
# Horovod's GPU operations over CUDA-aware MPI on a bare GPU host (no Docker engine, no
# network): the stack of the dl-lab-kit:gpu-mpi image (`invoke build --gpu-ops MPI`),
# built by the image's own scripts on the host, then checked and run. Run from the kit's
# root on the GPU host:
#
#   OUT=/some/dir bash docker/gpu-host-mpi.sh        # DRY=1: print the plan, run nothing
#
# NOT YET RUN ON A GPU: written and dry-run (tests/test_gpu_host_script.py) on a machine
# without one; the figures below are estimates, not measurements.
#
# What it does, each step under `timeout` and printing its exit status and seconds:
#   1. docker/install-openmpi.sh: Open MPI 4.1.4 --with-cuda from the staged tarball into
#      PREFIX (default /tmp/ompi-cuda), JOBS=16; then PREFIX/bin and PREFIX/lib first on
#      PATH and LD_LIBRARY_PATH (the host's own Open MPI, not CUDA-aware, stays behind them)
#   2. docker/install-horovod.sh: Horovod 0.28.1 from the staged sdist against the host's
#      torch, HOROVOD_GPU_OPERATIONS=MPI, kernels for compute capability 90 (H100, H200)
#   3. invoke doctor --local: expect mpi_cuda_build PASS (CUDA-aware) and mpi_gpu_allreduce
#      PASS. Doctor runs that probe on min(--np, GPUs) ranks (envcheck/stack.py), so on
#      one GPU at np 1, where nothing crosses a process; hence
#   4. the same probe (doctor's mpirun line, envcheck.stack._mpirun, and its module,
#      envcheck.mpi_hello --gpu) at np 2, both ranks on GPU 0 (rank % device_count)
#   5. MNIST (digits): invoke bench --local --device cuda --framework horovod --backend mpi
#      --np 1,2. Bench gives each rank a GPU of its own (lab/host/request/checks.py,
#      refused_counts), so on one GPU it runs np 1 and says why np 2 is skipped; hence
#   6. Horovod's own all-reduce of CUDA tensors, 2 ranks under mpirun on GPU 0 (Horovod's
#      MPI_GPUAllreduce between two processes), checked for the right sum and timed
#   7. ResNet-50, synthetic data, batch 64, 40 steps, --np 1,2 (np 2 skipped as in 5)
#   8. results (bench records, doctor's output, build logs) into OUT/results.tgz
# Everything it prints goes to OUT/log.txt as well; the two builds' own output goes to
# OUT/openmpi-build.log and OUT/horovod-build.log (their last lines into log.txt).
#
# Time: the whole run is held to BUDGET_S (default 570 s: the device machine's 600 s
# limit for one command, less 30 s to return), a total box inside the 15 minutes of
# device time a lent GPU gets. Each step has its own box, cut to what is left of the
# budget (TAR_S, 20 s, kept for the archive); a step with less than its minimum left is
# skipped and said so. The order is the issue's: builds, doctor, MNIST, then the rest.
# Estimates on 16 cores (none measured on such a host for this build yet):
#   Open MPI  150-240 s (box 330): CI's 2-vCPU build of the same configure took 9.7 min
#             (docs/pages/contributing.md; 9.8 and 11.9 min on one day); its make part
#             scales with cores, configure (about 1-1.5 min) does not
#   Horovod   130-150 s (box 240): with NCCL operations it took 147 s on the H100 and
#             130 s on the H200 on 16 cores (docs/pages/doctor.md); MPI operations compile
#             the same files less NCCL's
#   doctor    20 s (box 90): 19.0 s for 36 checks on the H200 with Horovod built
#   np 2 probe 10 s (box 60): doctor's GPU all-reduce through MPI took 5.8 s there
#   MNIST     20 s (box 90): Horovod/NCCL MNIST, 8 epochs of the digits, about 15 s there
#   hvd np 2  15 s (box 60)
#   ResNet-50 30 s (box 100): about 10 s to the first step, 40 steps of 64 images
#   in all about 400-480 s expected, 570 s at most.
#
# Staging: `bash docker/stage-gpu-host.sh` on a machine with Debian's mirror and PyPI does
# the following (.gpu/ is git-ignored and is carried to the GPU host beside the checkout,
# `carry: [".gpu"]`: 11 MB; versions and checksums from versions.env):
#   source <(grep -E '^(OPENMPI|HOROVOD)_' docker/versions.env)
#   mkdir -p .gpu/whl-site .gpu/whl-venv
#   curl -fL -o ".gpu/$(basename "$OPENMPI_URL")" "$OPENMPI_URL"
#   echo "$OPENMPI_SHA256  .gpu/$(basename "$OPENMPI_URL")" | sha256sum -c
#   pip download --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d .gpu
#   echo "$HOROVOD_SHA256  .gpu/horovod-$HOROVOD_VERSION.tar.gz" | sha256sum -c
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .gpu/whl-site \
#     invoke==2.2.1 docker==7.1.0
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d .gpu/whl-venv \
#     cffi pycparser
#   du -sh .gpu
# whl-site (the kit's own invoke and docker) goes to a --target folder on PYTHONPATH, as
# /work/shared/gpu's scripts did; whl-venv (cffi, which Horovod's torch part requires, and
# pycparser) into PY's environment, where Horovod's install looks for it.
#
# Environment: PY (the python with the CUDA torch; default python3), OUT (default
# /tmp/gpu-host-mpi-out), STAGE (default ./.gpu), PREFIX, JOBS (16), CUDA_ARCHS (90),
# BUDGET_S (570), CUDA_HOME (else found from nvcc by the install scripts), WORK and RESULTS
# (folders for the helpers and bench's records, under /tmp), DRY=1.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
source docker/matrix.sh || exit 1      # OPENMPI_VERSION, HOROVOD_VERSION

PY=${PY:-python3}
OUT=${OUT:-/tmp/gpu-host-mpi-out}
STAGE=${STAGE:-$PWD/.gpu}
PREFIX=${PREFIX:-/tmp/ompi-cuda}
JOBS=${JOBS:-16}
CUDA_ARCHS=${CUDA_ARCHS:-90}
BUDGET_S=${BUDGET_S:-570}
DRY=${DRY:-0}
TAR_S=20
W=${WORK:-/tmp/gpu-host-mpi-work}        # helper scripts, and the site folder for invoke/docker
R=${RESULTS:-/tmp/gpu-host-mpi-results}  # bench's records
mkdir -p "$OUT" "$W"
[[ "$DRY" == 1 ]] || rm -rf "$R"
exec > >(tee -a "$OUT/log.txt") 2>&1
tee_pid=$!
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1

# words CMD...: the command line as it would be typed (quoted only where the shell needs it).
words() {
    local w line='    $'
    for w in "$@"; do
        if [[ "$w" =~ ^[A-Za-z0-9_./:=,@%^+-]+$ ]]; then line+=" $w"; else line+=" $(printf '%q' "$w")"; fi
    done
    echo "$line"
}

# box NAME MAX_S MIN_S CMD...: CMD under timeout, at most MAX_S and never past the budget
# (less TAR_S for the archive); skipped when fewer than MIN_S seconds are left. BOX_LOG=FILE:
# CMD's output goes there and its last BOX_TAIL (25) lines here. Prints the rc and the seconds taken.
box() {
    local name=$1 max=$2 min=$3; shift 3
    local left=$((BUDGET_S - TAR_S - SECONDS)) t t0 rc
    t=$((max < left ? max : left))
    echo
    echo "=== $name: box ${max}s, $(date +%T), +${SECONDS}s of ${BUDGET_S}s"
    words "$@"
    if [[ -n "${BOX_LOG:-}" ]]; then echo "    (output in $BOX_LOG)"; fi
    if [[ "$DRY" == 1 ]]; then return 0; fi
    if ((t < min)); then
        echo "--- $name: SKIPPED, ${left}s left of the budget and it needs at least ${min}s"
        return 125
    fi
    t0=$SECONDS
    if [[ -n "${BOX_LOG:-}" ]]; then
        timeout -k 10 "$t" "$@" >"$BOX_LOG" 2>&1; rc=$?
        tail -n "${BOX_TAIL:-25}" "$BOX_LOG"
    else
        timeout -k 10 "$t" "$@"; rc=$?
    fi
    echo "--- $name: rc=$rc, $((SECONDS - t0))s$( ((rc == 124 || rc == 137)) && echo ", TIMED OUT at ${t}s")"
    return "$rc"
}

archive() {
    echo
    echo "=== archive (+${SECONDS}s)"
    local tar=(tar -czf "$OUT/results.tgz" --exclude="$W/site" "$R" "$W")
    words "${tar[@]}"
    [[ "$DRY" == 1 ]] && return
    mkdir -p "$R"
    "${tar[@]}" 2>&1 | grep -v 'Removing leading' | tail -3
    ls -la "$OUT"
    echo "done in ${SECONDS}s (budget ${BUDGET_S}s)"
}

flush() {  # the log's last lines written before the script ends
    exec >&- 2>&-
    wait "$tee_pid" 2>/dev/null
}
finish() { archive; flush; }

echo "gpu-host-mpi: Horovod $HOROVOD_VERSION with MPI GPU operations over CUDA-aware Open MPI $OPENMPI_VERSION"
echo "kit $(git rev-parse --short HEAD 2>/dev/null || echo '(no git)'), $(date -u +%FT%TZ), DRY=$DRY"
echo "total time box: ${BUDGET_S}s (the steps' own boxes below are cut to what is left of it)"

tarball="$STAGE/openmpi_$OPENMPI_VERSION.orig.tar.xz"
sdist="$STAGE/horovod-$HOROVOD_VERSION.tar.gz"

echo
echo "=== host"
if [[ "$DRY" != 1 ]]; then
    timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | head -3
    timeout 60 "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
    nvcc --version 2>&1 | tail -n 2; cmake --version 2>&1 | head -n 1; echo "cores: $(nproc)"
    echo "host MPI before: $(command -v mpirun || echo none) $(timeout 10 mpirun --version 2>&1 | head -n 1)"
    for f in "$tarball" "$sdist"; do [[ -f "$f" ]] || { echo "MISSING $f: stage .gpu/ (bash docker/stage-gpu-host.sh)"; flush; exit 2; }; done
    # The kit's own invoke and docker (not in the host's python) into a folder on the
    # PYTHONPATH; cffi and pycparser (Horovod's requirement) into the python itself.
    if ! "$PY" -c 'import invoke, docker' 2>/dev/null; then
        timeout 60 "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$W/site" "$STAGE"/whl-site/*.whl
        echo "invoke/docker into $W/site: rc=$?"
        export PYTHONPATH="$W/site"
    fi
    if ! "$PY" -c 'import cffi' 2>/dev/null; then
        timeout 60 "$PY" -m pip install -q --no-index --no-deps "$STAGE"/whl-venv/*.whl; echo "cffi into $PY: rc=$?"
    fi
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
export PATH="$PREFIX/bin:$PATH" LD_LIBRARY_PATH="$PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [[ "$(id -u)" == 0 ]]; then
    # horovodrun's mpirun as root (doctor's own adds --allow-run-as-root itself).
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

# Helpers the steps 4 and 6 run (written here, kept in the archive).
cat >"$W/mpi_gpu_allreduce_np.py" <<'EOF'
"""Doctor's mpi_gpu_allreduce at a given np whatever the GPU count: the same mpirun line
(envcheck.stack._mpirun: the runs' transports) and module (envcheck.mpi_hello --gpu:
rank r on GPU r % count, so np 2 on one GPU puts both ranks on it)."""
import json, sys
from envcheck import stack
n = int(sys.argv[1])
cmd = stack._mpirun(n) + [sys.executable, "-m", "envcheck.mpi_hello", "--gpu"]
print("$ " + " ".join(cmd), flush=True)
try:
    text = stack.run_command(cmd, timeout=float(sys.argv[2]) if len(sys.argv) > 2 else 45)
except stack.ProbeError as e:
    print(f"mpi_gpu_allreduce np={n}: FAIL ({e})")
    sys.exit(1)
answers = stack._hello_lines(text)
for a in answers:
    print(json.dumps(a))
ok = len(answers) == n and all(a["allreduce"]["ok"] for a in answers)
print(f"mpi_gpu_allreduce np={n}: {'PASS' if ok else 'FAIL'} ({len(answers)} of {n} ranks answered, "
      f"all-reduce of CUDA memory {'right' if ok else 'wrong or missing'})")
sys.exit(0 if ok else 1)
EOF
cat >"$W/hvd_gpu_allreduce.py" <<'EOF'
"""Horovod's all-reduce of CUDA tensors under mpirun: with MPI GPU operations that is
MPI_GPUAllreduce (Horovod 0.28.1 operations.cc), CUDA memory handed to Open MPI. Every rank
on GPU rank % count; checks the sum, then times 64 MiB all-reduces."""
import json, os, time
import horovod, torch
import horovod.torch as hvd
hvd.init()
torch.cuda.set_device(hvd.rank() % torch.cuda.device_count())
build = os.path.join(os.path.dirname(horovod.__file__), "lab_build.json")
ops = json.load(open(build)).get("gpu_operations") if os.path.exists(build) else None
want = hvd.size() * (hvd.size() + 1) / 2
ok = True
for n in (4, 1 << 10, 1 << 24):           # 16 B, 4 KiB, 64 MiB of float32
    x = torch.full((n,), float(hvd.rank() + 1), device="cuda")
    y = hvd.allreduce(x, op=hvd.Sum, name=f"check{n}")
    ok = ok and bool(torch.all(y == want))
x = torch.ones(1 << 24, device="cuda")
for i in range(3):
    hvd.allreduce(x, op=hvd.Sum, name=f"warm{i}")
torch.cuda.synchronize(); t0 = time.perf_counter()
for i in range(10):
    hvd.allreduce(x, op=hvd.Sum, name=f"t{i}")
torch.cuda.synchronize(); dt = (time.perf_counter() - t0) / 10
print(json.dumps({"rank": hvd.rank(), "size": hvd.size(), "device": torch.cuda.current_device(),
                  "mpi_enabled": hvd.mpi_enabled(), "nccl_built": bool(hvd.nccl_built()),
                  "gpu_operations": ops, "sum_ok": ok, "allreduce_64MiB_ms": round(dt * 1e3, 2)}), flush=True)
hvd.shutdown()
raise SystemExit(0 if ok and ops == "MPI" else 1)
EOF

# 1. CUDA-aware Open MPI
ompi_env=(env PREFIX="$PREFIX" OPENMPI_TARBALL="$tarball" JOBS="$JOBS")
[[ -n "${CUDA_HOME:-}" ]] && ompi_env+=(CUDA_HOME="$CUDA_HOME")
echo
echo "=== Open MPI's configure arguments (install-openmpi.sh CONFIGURE_ONLY=1)"
"${ompi_env[@]}" CONFIGURE_ONLY=1 bash docker/install-openmpi.sh 2>&1 | sed 's/^/    /'
BOX_LOG=$OUT/openmpi-build.log box "1 Open MPI $OPENMPI_VERSION --with-cuda" 330 60 \
    "${ompi_env[@]}" bash docker/install-openmpi.sh
ompi_rc=$?
if [[ "$DRY" != 1 ]]; then
    echo "mpirun now: $(command -v mpirun) ($(mpirun --version 2>&1 | head -n 1));" \
         "$(ompi_info --parsable --all 2>/dev/null | grep -m1 'built_with_cuda_support:value' || echo 'no ompi_info')"
    if ((ompi_rc != 0)); then echo "Open MPI did not build: nothing else can run"; finish; exit 1; fi
fi

# 2. Horovod with MPI GPU operations
BOX_LOG=$OUT/horovod-build.log box "2 Horovod $HOROVOD_VERSION, HOROVOD_GPU_OPERATIONS=MPI" 240 60 \
    env PIP_NO_INDEX=1 PYTHON="$PY" HOROVOD_SDIST="$sdist" HOROVOD_GPU_OPERATIONS=MPI \
    HOROVOD_BUILD_CUDA_CC_LIST="$CUDA_ARCHS" JOBS="$JOBS" bash docker/install-horovod.sh
hvd_rc=$?
if [[ "$DRY" != 1 ]] && ((hvd_rc != 0)); then
    echo "Horovod did not build: doctor and the MPI probe at np 2 only"
fi

# 3. doctor
BOX_LOG=$OUT/doctor.txt BOX_TAIL=300 box "3 doctor --local" 90 30 "$PY" -m invoke doctor --local
[[ "$DRY" == 1 ]] || { echo "doctor's MPI rows:"; grep -E '^\S+\s+(mpi_|horovod |nccl )' "$OUT/doctor.txt"; }
# 4. the GPU all-reduce through MPI at np 2, both ranks on one GPU
box "4 mpi_gpu_allreduce, np 2 on one GPU" 60 20 "$PY" "$W/mpi_gpu_allreduce_np.py" 2 45
if [[ "$DRY" == 1 ]] || ((hvd_rc == 0)); then
    # 5. MNIST over Horovod/MPI on the GPU
    box "5 MNIST (digits), Horovod over MPI on the GPU" 90 30 \
        "$PY" -m invoke bench --local --device cuda --framework horovod --backend mpi --np 1,2 \
        --model mnist --data digits --epochs 8 --results-dir "$R" --run-id mnist-hvd-mpi
    # 6. Horovod's GPU all-reduce at np 2 on one GPU
    # shellcheck disable=SC2046  # doctor's mpirun line, one word each
    box "6 Horovod MPI_GPUAllreduce, np 2 on one GPU" 60 25 \
        $("$PY" -c 'from envcheck.stack import _mpirun; print(" ".join(_mpirun(2)))' 2>/dev/null \
          || echo mpirun -np 2 --oversubscribe -mca pml ob1 -mca btl ^openib) \
        "$PY" "$W/hvd_gpu_allreduce.py"
    # 7. ResNet-50
    box "7 ResNet-50, batch 64, Horovod over MPI on the GPU" 100 40 \
        "$PY" -m invoke bench --local --device cuda --framework horovod --backend mpi --np 1,2 \
        --model resnet50 --data synthetic --batch-size 64 --max-steps 40 --warmup-steps 10 \
        --results-dir "$R" --run-id resnet50-hvd-mpi
fi
finish
