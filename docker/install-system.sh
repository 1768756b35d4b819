#!/usr/bin/env bash
# System packages of the lab image (Debian/Ubuntu): Python, compilers for Horovod,
# Open MPI, SSH for multi-node runs. Package lists and the SSH host keys the install
# makes are removed in the same step.
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
else
    # To fetch and unpack the Open MPI tarball and to build it.
    pkgs+=(curl xz-utils file perl)
fi
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
if [[ "$flavor" == gpu ]]; then
    # nvidia/cuda's devel images bring NCCL as packages; torch brings its own as a
    # wheel and everything here is built against that one, so the base's copy goes.
    mapfile -t nccl < <(dpkg-query -W -f '${Package}\n' 'libnccl*' 2>/dev/null || true)
    if ((${#nccl[@]})); then
        apt-mark unhold "${nccl[@]}" >/dev/null
        # Only NCCL goes: a package that depends on it (none in nvidia/cuda's devel
        # images today) stops the build instead of being removed with it.
        others="$(apt-get -s purge "${nccl[@]}" | sed -n 's/^Purg \([^ ]*\).*/\1/p' | grep -v '^libnccl' || true)"
        [[ -z "$others" ]] || { echo "install-system: purging the base's NCCL would also remove: $others" >&2; exit 1; }
        apt-get purge -y -qq "${nccl[@]}" >/dev/null
    fi
fi
# openssh-server's install makes host keys (ssh-keygen -A in its postinst). A private
# key must not ship in any layer, so they go in this same step; the cluster makes its
# own at run time (docker/cluster/keygen.sh).
rm -f /etc/ssh/ssh_host_*
rm -rf /var/lib/apt/lists/*
