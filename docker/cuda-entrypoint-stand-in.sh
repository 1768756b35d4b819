#!/usr/bin/env bash
# The stand-in base's entry point, behaving as nvidia/cuda's runtime and devel images'
# ENTRYPOINT (/opt/nvidia/nvidia_entrypoint.sh, with its entrypoint.d/ parts: NVIDIA's
# container-images repository) does for what a command run in the image sees: before the
# command, a banner naming the product and its version and, where no GPU driver is
# visible (no libcuda.so.1, no /dev/nvidiactl), a warning and NVIDIA_CPU_ONLY=1, all on
# standard output; then the command replaces it (bash with none). Written for this kit;
# the lab image sets ENTRYPOINT [] so its own commands' output is theirs alone.
name="${NVIDIA_PRODUCT_NAME:-CUDA}"
rule="$(printf '%*s' $((${#name} + 6)) '' | tr ' ' '=')"
printf '\n%s\n== %s ==\n%s\n\n' "$rule" "$name" "$rule"
printf '%s Version %s\n\n' "$name" "${CUDA_VERSION:-}"
echo "Container image Copyright (c) NVIDIA CORPORATION & AFFILIATES. All rights reserved. (stand-in)"
# The driver: libcuda.so.1 in the loader's cache or on LD_LIBRARY_PATH (not a compat copy),
# and any one of the driver's device files (Linux, WSL2, Tegra).
libcuda="$(ldconfig -p 2>/dev/null | grep 'libcuda\.so\.1')"
IFS=: read -ra dirs <<<"${LD_LIBRARY_PATH:-}"
for d in "${dirs[@]}"; do [[ -e "$d/libcuda.so.1" && "$d" != *compat* ]] && libcuda+="$d"; done
if [[ -z "$libcuda" || -z "$(ls /dev/nvidiactl /dev/dxg /dev/nvgpu 2>/dev/null)" ]]; then
    echo
    echo "WARNING: The NVIDIA Driver was not detected.  GPU functionality will not be available."
    export NVIDIA_CPU_ONLY=1
fi
echo
if (($#)); then exec "$@"; else exec bash; fi
