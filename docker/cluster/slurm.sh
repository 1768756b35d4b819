#!/usr/bin/env bash
# Slurm on a cluster node, for `invoke up --scheduler slurm` (run as root by node.sh
# before sshd): MUNGE with the cluster's key (made at run time by keygen.sh, never in an
# image), slurm.conf from slurm.conf.in for LAB_NODES nodes, slurmctld on node1 and
# slurmd on every node (both fork into the background). Logs: /var/log/slurm/.
set -euo pipefail
keys=/cluster-ssh
controller=node1
nodes="${LAB_NODES:?LAB_NODES (how many nodes the cluster has) is not set}"
for _ in $(seq 120); do [[ -e "$keys/munge.key" ]] && break; sleep 0.5; done
[[ -e "$keys/munge.key" ]] || { echo "node: no MUNGE key in $keys after 60 s: is Slurm in the image the keygen service ran? (invoke build)" >&2; exit 1; }
# munged wants its key owned by munge and unreadable to others, /etc/munge 0700.
install -d -m 700 -o munge -g munge /etc/munge
install -m 400 -o munge -g munge "$keys/munge.key" /etc/munge/munge.key
install -d -m 755 -o munge -g munge /run/munge
runuser -u munge -- /usr/sbin/munged
# This machine's CPUs as slurmd sees them, without the node's name and memory (not
# enforced with CR_CPU).
topology="$(slurmd -C | head -n1 | tr ' ' '\n' \
    | grep -E '^(CPUs|Boards|SocketsPerBoard|CoresPerSocket|ThreadsPerCore)=' | tr '\n' ' ')"
install -d -m 755 /etc/slurm
sed -e "s/@NODES@/$nodes/" -e "s/@TOPOLOGY@/${topology% }/" /opt/lab-cluster/slurm.conf.in \
    > /etc/slurm/slurm.conf
install -d -m 755 -o slurm -g slurm /var/lib/slurm/slurmctld /var/log/slurm
install -d -m 755 /var/lib/slurm/slurmd
if [[ "$(hostname -s)" == "$controller" ]]; then
    /usr/sbin/slurmctld
fi
/usr/sbin/slurmd
echo "node $(hostname): munged$([[ "$(hostname -s)" == "$controller" ]] && echo ", slurmctld"), slurmd started"
