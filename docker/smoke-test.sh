#!/usr/bin/env bash
# The image's smoke tests, run at the end of its build: the build fails when the
# stack is not what was asked for.
#   GPU_OPERATIONS=NCCL|MPI|"" FLAVOR=cpu|gpu bash docker/smoke-test.sh
set -euo pipefail
flavor="${FLAVOR:-cpu}"
ops="${GPU_OPERATIONS:-}"
fail() { echo "smoke-test: FAILED: $*" >&2; exit 1; }

mpirun --version | head -n1 || fail "mpirun does not answer"
out="$(horovodrun --check-build)"
echo "$out"
for want in "PyTorch" "MPI" "Gloo"; do
    grep -Eq "\[X\] $want" <<<"$out" || fail "horovodrun --check-build does not show $want"
done
if [[ -n "$ops" ]]; then
    grep -Eq "\[X\] $ops" <<<"$out" || fail "horovodrun --check-build does not show GPU operations $ops"
fi
if [[ "$flavor" == gpu ]]; then
    ompi_info --parsable --all | grep -q 'mpi_built_with_cuda_support:value:true' \
        || fail "Open MPI is not CUDA-aware (ompi_info: mpi_built_with_cuda_support is not true)"
fi
python - <<'PY'
import horovod.torch as hvd
hvd.init()
assert hvd.size() == 1 and hvd.rank() == 0
import lab.train, envcheck.probes  # the kit is installed
print("smoke-test: horovod.torch imports and hvd.init() works; size", hvd.size())
PY
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
