#!/usr/bin/env bash
# The cluster's keys, made once at the first `up` into the cluster-ssh volume (never in
# an image, never in the repository): the user key the nodes trust, one host key
# every node presents, so that ssh between nodes checks host keys strictly, and
# Slurm's MUNGE key.
set -euo pipefail
dir=/cluster-ssh
# The MUNGE key Slurm's daemons authenticate with (invoke up --scheduler slurm), made
# whenever it is missing: a volume made before the kit had Slurm holds SSH keys only.
if [[ ! -e "$dir/munge.key" ]] && command -v mungekey >/dev/null; then
    (umask 077 && mungekey --create --keyfile="$dir/.munge.key.new" --bits=1024 \
        && mv "$dir/.munge.key.new" "$dir/munge.key")
    echo "keygen: made the cluster's MUNGE key"
fi
if [[ -e "$dir/ready" ]]; then
    echo "keygen: the cluster's keys exist"
    exit 0
fi
umask 077
tmp="$(mktemp -d "$dir/.new.XXXXXX")"
ssh-keygen -q -t ed25519 -N "" -C "dl-lab-kit cluster user" -f "$tmp/id_ed25519"
ssh-keygen -q -t ed25519 -N "" -C "dl-lab-kit cluster host" -f "$tmp/host_ed25519_key"
chmod 644 "$tmp"/*.pub
mv "$tmp"/* "$dir/" && rmdir "$tmp"
touch "$dir/ready"      # last: the nodes wait for it
echo "keygen: made the cluster's user and host keys"
