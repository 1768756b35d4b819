#!/usr/bin/env bash
# Make a Debian base image without a registry: debootstrap a minimal root file system
# from Debian's package mirror and `docker import` it. For machines that can reach
# Debian's packages but no container registry (this project's CI).
#
#   bash docker/make-base-image.sh [TAG [SUITE]]
#     TAG    default lab-base/debian:SUITE
#     SUITE  a Debian release: bookworm (12, the default: gcc 12, Python 3.11) or
#            trixie (13: gcc 14, Python 3.13, newer than the GPU flavor's Ubuntu 24.04)
#
# Does nothing when TAG already exists. Needs root, debootstrap and a Docker engine.
set -euo pipefail
suite="${2:-bookworm}"
tag="${1:-lab-base/debian:$suite}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
if docker image inspect "$tag" >/dev/null 2>&1; then
    echo "make-base-image: $tag exists"
    exit 0
fi
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
echo "make-base-image: debootstrap $suite (minbase) from $mirror"
debootstrap --variant=minbase "$suite" "$root" "$mirror" >/dev/null
# What debian:bookworm-slim also leaves out: package lists and caches.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin
tar -C "$root" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["bash"]' - "$tag" >/dev/null
echo "make-base-image: made $tag"
