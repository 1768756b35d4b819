#!/usr/bin/env bash
# Make a CUDA devel base image without a registry, standing in for nvidia/cuda's devel
# image where it cannot be pulled (this project's CI): the Debian base of
# make-base-image.sh plus a CUDA toolkit this machine has, at /usr/local/cuda-X.Y with
# the /usr/local/cuda link, nvcc on the PATH and the libraries registered, as in
# nvidia/cuda. It has no GPU driver (none is ever in an image: the container runtime
# brings the host's), so it compiles CUDA code but cannot run it.
#
#   bash docker/make-cuda-base-image.sh [TAG] [TOOLKIT_DIR] [SUITE]
#     TAG          default lab-base/cuda:<X.Y>-devel-SUITE
#     TOOLKIT_DIR  default: where nvcc on the PATH really lives
#     SUITE        the Debian release underneath (make-base-image.sh): bookworm
#                  (default) or trixie, whose gcc 14 and Python 3.13 are at least as
#                  new as nvidia/cuda's Ubuntu 24.04 (gcc 13, Python 3.12)
# Does nothing when TAG exists. Needs a Docker engine and the Debian base (made first).
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
if docker image inspect "$tag" >/dev/null 2>&1; then
    say "$tag exists"
    exit 0
fi
bash "$here/make-base-image.sh" "lab-base/debian:$suite" "$suite"
ctx="$(mktemp -d)"
trap 'rm -rf "$ctx"' EXIT
cp -a "$toolkit" "$ctx/cuda"
cat > "$ctx/Dockerfile" <<DOCKERFILE
FROM lab-base/debian:$suite
COPY cuda /usr/local/cuda-$release
RUN ln -s /usr/local/cuda-$release /usr/local/cuda \\
    && echo /usr/local/cuda/lib64 > /etc/ld.so.conf.d/cuda.conf && ldconfig
ENV CUDA_VERSION=$release \\
    PATH=/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
DOCKERFILE
say "building $tag from the toolkit at $toolkit (CUDA $release)"
DOCKER_BUILDKIT=0 docker build --quiet -t "$tag" "$ctx" >/dev/null
say "made $tag"
