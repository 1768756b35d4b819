#!/usr/bin/env bash
# A cluster node's entry point (as root): install the cluster's keys for the user `lab`
# and the host, then run sshd in the foreground. Jobs run as `lab`, over ssh.
set -euo pipefail
keys=/cluster-ssh
# The keygen service makes the keys at the first `up`; wait for it (bounded).
for _ in $(seq 120); do [[ -e "$keys/ready" ]] && break; sleep 0.5; done
[[ -e "$keys/ready" ]] || { echo "node: no cluster keys in $keys after 60 s: did the keygen service run? (docker compose logs keygen)" >&2; exit 1; }
home=/home/lab
install -d -m 700 -o lab -g lab "$home/.ssh"
install -m 600 -o lab -g lab "$keys/id_ed25519" "$home/.ssh/id_ed25519"
install -m 644 -o lab -g lab "$keys/id_ed25519.pub" "$home/.ssh/authorized_keys"
echo "* $(cat "$keys/host_ed25519_key.pub")" > "$home/.ssh/known_hosts"
chown lab:lab "$home/.ssh/known_hosts"
install -m 600 "$keys/host_ed25519_key" /etc/ssh/ssh_host_ed25519_key
install -m 644 "$keys/host_ed25519_key.pub" /etc/ssh/ssh_host_ed25519_key.pub
# What an ssh session of `lab` needs: the image's PATH and MPI settings, and the
# checkout's code first when it is mounted (LAB_PYTHONPATH).
{
    echo "PATH=$PATH"
    echo "PYTHONUNBUFFERED=1"
    env | grep -E '^(OMPI_MCA_|NCCL_|LAB_)' || true
    [[ -n "${LAB_PYTHONPATH:-}" ]] && echo "PYTHONPATH=$LAB_PYTHONPATH"
} > "$home/.ssh/environment"
chown lab:lab "$home/.ssh/environment"
cat > /etc/ssh/sshd_config.d/lab-cluster.conf <<'CONF'
HostKey /etc/ssh/ssh_host_ed25519_key
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
AllowUsers lab
PermitUserEnvironment yes
CONF
mkdir -p /run/sshd
if [[ "${LAB_SCHEDULER:-none}" == slurm ]]; then
    bash /opt/lab-cluster/slurm.sh
fi
echo "node $(hostname): sshd ready for user lab"
exec /usr/sbin/sshd -D -e
