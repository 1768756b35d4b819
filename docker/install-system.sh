#!/usr/bin/env bash
# System packages of the lab image (Debian/Ubuntu): Python, compilers for Horovod,
# Open MPI, SSH for multi-node runs. Package lists are removed in the same step.
#   FLAVOR=cpu|gpu bash docker/install-system.sh
# On the GPU flavor Open MPI is built from source with CUDA (install-openmpi.sh), so
# Debian's is not installed.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
flavor="${FLAVOR:-cpu}"
pkgs=(python3 python3-venv python3-dev g++ make cmake git ca-certificates
      openssh-server openssh-client iproute2 procps less)
if [[ "$flavor" == cpu ]]; then
    pkgs+=(openmpi-bin libopenmpi-dev)
fi
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
rm -rf /var/lib/apt/lists/*
