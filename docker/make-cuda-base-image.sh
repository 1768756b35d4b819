#!/usr/bin/env bash
# Make a CUDA devel base image without a registry, standing in for nvidia/cuda's devel
# image where it cannot be pulled (this project's CI). It differs from the real one only
# where it cannot be the same:
#   - the same configuration: every ENV, LABEL and the ENTRYPOINT of NVIDIA's published
#     Dockerfiles for the toolkit's release (docker/nvidia-cuda-base.conf, with its
#     source), NCCL_VERSION, PATH, LD_LIBRARY_PATH and LIBRARY_PATH among them; the entry
#     point behaves as NVIDIA's does (a banner on standard output before the command:
#     docker/cuda-entrypoint-stand-in.sh);
#   - a system NCCL of the version NVIDIA's image holds, as the packages libnccl2 and
#     libnccl-dev (held, as NVIDIA's Dockerfiles do) in /usr/lib/x86_64-linux-gnu and
#     /usr/include, made from the nvidia-nccl wheel of that release (PyPI), so the image
#     built on it has a second NCCL to keep away from;
#   - but Debian underneath instead of Ubuntu 24.04, and a CUDA toolkit this machine has
#     (at /usr/local/cuda-X.Y with the /usr/local/cuda link, registered with ldconfig)
#     instead of NVIDIA's packages. No GPU driver, as in nvidia/cuda (the container
#     runtime brings the host's), so it compiles CUDA code but cannot run it.
#
#   bash docker/make-cuda-base-image.sh [TAG] [TOOLKIT_DIR] [SUITE]
#     TAG          default lab-base/cuda:<X.Y>-devel-SUITE
#     TOOLKIT_DIR  default: where nvcc on the PATH really lives
#     SUITE        the Debian release underneath (make-base-image.sh): bookworm
#                  (default) or trixie, whose gcc 14 and Python 3.13 are at least as
#                  new as nvidia/cuda's Ubuntu 24.04 (gcc 13, Python 3.12)
# Does nothing when TAG exists and was made from the same inputs (its label
# lab.stand-in.inputs); remakes it when they changed. Needs a Docker engine, pip (to
# fetch the NCCL wheel) and the Debian base (made first).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
say() { printf 'make-cuda-base-image: %s\n' "$*" >&2; }
toolkit="${2:-}"
if [[ -z "$toolkit" ]]; then
    nvcc="$(command -v nvcc)" || { say "no nvcc on the PATH: give the toolkit's folder"; exit 1; }
    # nvcc may be a wrapper script that execs the real one.
    real="$(sed -n 's#^exec \(/[^ ]*\)/bin/nvcc.*#\1#p' "$nvcc" 2>/dev/null | head -n1)"
    toolkit="${real:-$(cd "$(dirname "$(readlink -f "$nvcc")")/.." && pwd)}"
fi
[[ -x "$toolkit/bin/nvcc" && -f "$toolkit/include/cuda.h" ]] \
    || { say "$toolkit is not a CUDA toolkit (bin/nvcc, include/cuda.h)"; exit 1; }
release="$("$toolkit/bin/nvcc" --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')"
suite="${3:-bookworm}"
tag="${1:-lab-base/cuda:$release-devel-$suite}"

# NVIDIA's configuration for this release: the lines of its section in the .conf.
conf="$here/nvidia-cuda-base.conf"
section="$(awk -v r="$release" '/^\[/ {on = ($1 == "[" r)} on && /^(ENV|LABEL|ENTRYPOINT) / {print}' "$conf")"
[[ -n "$section" ]] || { say "$conf has no section for CUDA $release: add NVIDIA's ENV and LABEL lines for it"; exit 1; }
nccl_deb="$(sed -n 's/^ENV NV_LIBNCCL_PACKAGE_VERSION=//p' <<<"$section" | head -n1)"   # 2.27.7-1
nccl="${nccl_deb%-*}"                                                                    # 2.27.7
inputs="$(cat "$conf" "$0" "$here/cuda-entrypoint-stand-in.sh" | sha256sum | cut -c1-16)-$suite-$release"
if [[ "$(docker image inspect -f '{{index .Config.Labels "lab.stand-in.inputs"}}' "$tag" 2>/dev/null)" == "$inputs" ]]; then
    say "$tag exists"
    exit 0
fi
bash "$here/make-base-image.sh" "lab-base/debian:$suite" "$suite"
ctx="$(mktemp -d)"
trap 'rm -rf "$ctx"' EXIT
cp -a "$toolkit" "$ctx/cuda"
cp "$here/cuda-entrypoint-stand-in.sh" "$ctx/nvidia_entrypoint.sh"
# The system NCCL's files, from the wheel of NVIDIA's NCCL release for this CUDA major.
say "fetching nvidia-nccl-cu${release%%.*}==$nccl (the base's system NCCL)"
python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$ctx/wheel" \
    "nvidia-nccl-cu${release%%.*}==$nccl" >&2
mkdir "$ctx/nccl"
python3 -m zipfile -e "$ctx"/wheel/*.whl "$ctx/nccl"
rm -rf "$ctx/wheel"
cat > "$ctx/Dockerfile" <<DOCKERFILE
FROM lab-base/debian:$suite
COPY cuda /usr/local/cuda-$release
RUN ln -s /usr/local/cuda-$release /usr/local/cuda \\
    && echo /usr/local/cuda/lib64 > /etc/ld.so.conf.d/nvidia.conf && ldconfig
# libnccl2 and libnccl-dev $nccl_deb+cuda$release, laid out as NVIDIA's packages are.
# Packed uncompressed (-Znone): they are installed at once and deleted, and xz over
# NCCL's 230 MB library took over 2 minutes of the base's making on 2 cores.
COPY nccl/nvidia/nccl /tmp/nccl
RUN set -e; v="$nccl_deb+cuda$release"; lib=/usr/lib/x86_64-linux-gnu; \\
    for p in libnccl2 libnccl-dev; do mkdir -p "/tmp/deb/\$p/DEBIAN" "/tmp/deb/\$p\$lib"; done; \\
    cp /tmp/nccl/lib/libnccl.so.2 "/tmp/deb/libnccl2\$lib/libnccl.so.$nccl"; \\
    ln -s "libnccl.so.$nccl" "/tmp/deb/libnccl2\$lib/libnccl.so.2"; \\
    mkdir -p /tmp/deb/libnccl-dev/usr/include; cp /tmp/nccl/include/*.h /tmp/deb/libnccl-dev/usr/include/; \\
    ln -s libnccl.so.2 "/tmp/deb/libnccl-dev\$lib/libnccl.so"; \\
    printf 'Package: libnccl2\nVersion: %s\nArchitecture: amd64\nMaintainer: stand-in\nDescription: NCCL runtime (stand-in)\n' "\$v" > /tmp/deb/libnccl2/DEBIAN/control; \\
    printf 'Package: libnccl-dev\nVersion: %s\nArchitecture: amd64\nDepends: libnccl2 (= %s)\nMaintainer: stand-in\nDescription: NCCL development files (stand-in)\n' "\$v" "\$v" > /tmp/deb/libnccl-dev/DEBIAN/control; \\
    for p in libnccl2 libnccl-dev; do dpkg-deb -Znone --build --root-owner-group "/tmp/deb/\$p" "/tmp/\$p.deb" >/dev/null; done; \\
    dpkg -i /tmp/libnccl2.deb /tmp/libnccl-dev.deb >/dev/null; \\
    apt-mark hold libnccl2 libnccl-dev >/dev/null; rm -rf /tmp/nccl /tmp/deb /tmp/*.deb; ldconfig
COPY nvidia_entrypoint.sh /opt/nvidia/nvidia_entrypoint.sh
# NVIDIA's Dockerfiles' configuration (docker/nvidia-cuda-base.conf, CUDA $release):
$section
LABEL lab.stand-in.inputs="$inputs"
DOCKERFILE
say "building $tag from the toolkit at $toolkit (CUDA $release), NVIDIA's configuration and NCCL $nccl_deb"
DOCKER_BUILDKIT=0 docker build --quiet -t "$tag" "$ctx" >/dev/null
say "made $tag"
