#!/usr/bin/env bash
# Slurm (slurmctld, slurmd and the client commands) and MUNGE, its authentication, from
# the distribution's packages (Debian 12: Slurm 22.05, MUNGE 0.5.15; Ubuntu 24.04: Slurm
# 23.11), for the simulated cluster's `invoke up --scheduler slurm`. Not the slurm-wlm
# metapackage: it adds slurmdbd, and the cluster keeps no accounting database.
# munge's install makes a key (its postinst runs mungekey); no key may ship in a layer,
# so it goes in this same step, with the package lists: the cluster makes its own at
# run time (docker/cluster/keygen.sh).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
rm -f /etc/munge/munge.key
rm -rf /var/lib/apt/lists/*
