#!/usr/bin/env bash
# Print the folder of the NCCL that torch loads (the nvidia-nccl wheel), with
# include/ and lib/, adding the libnccl.so link a linker needs (the wheel ships only
# libnccl.so.2). Horovod and nccl-tests are built against it, so a process never
# holds two copies of NCCL.
#   PYTHON=/opt/lab/bin/python bash docker/torch-nccl.sh
set -euo pipefail
PYTHON="${PYTHON:-python3}"
dir="$("$PYTHON" - <<'PY'
import importlib.util, os
spec = importlib.util.find_spec("nvidia.nccl")
if spec and spec.submodule_search_locations:
    print(list(spec.submodule_search_locations)[0])
PY
)"
if [[ -z "$dir" || ! -f "$dir/lib/libnccl.so.2" || ! -f "$dir/include/nccl.h" ]]; then
    echo "torch-nccl: the torch in $PYTHON brings no NCCL wheel (nvidia-nccl-*)" >&2
    exit 1
fi
ln -sf libnccl.so.2 "$dir/lib/libnccl.so"
echo "$dir"
