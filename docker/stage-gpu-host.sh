#!/usr/bin/env bash
# Fill .gpu/ (git-ignored) with what docker/gpu-host-mpi.sh needs on a GPU host that has no
# network: run from the kit's root on a machine that reaches Debian's mirror and PyPI, then
# carry .gpu/ to the GPU host beside the checkout (about 11 MB).
#
#   bash docker/stage-gpu-host.sh
#
#   .gpu/openmpi_4.1.4.orig.tar.xz   OPENMPI_URL (deb.debian.org), sha256 checked (versions.env)
#   .gpu/horovod-0.28.1.tar.gz       PyPI's sdist, sha256 checked (versions.env)
#   .gpu/whl-site/                   invoke 2.2.1 and docker 7.1.0, the versions that ran on the
#                                    lent hosts (pure Python)
#   .gpu/whl-venv/                   cffi and pycparser for CPython 3.12, manylinux x86_64
#                                    (Horovod's torch part requires cffi)
#
# Environment: STAGE (default ./.gpu), PIP_PYTHON (the python whose pip downloads; python3),
# GPU_PYTHON_VERSION (the GPU host's Python, default 3.12).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source docker/matrix.sh      # OPENMPI_URL, OPENMPI_SHA256, HOROVOD_VERSION, HOROVOD_SHA256
STAGE=${STAGE:-$PWD/.gpu}
PIP_PYTHON=${PIP_PYTHON:-python3}
pyver=${GPU_PYTHON_VERSION:-3.12}
say() { printf 'stage-gpu-host: %s\n' "$*" >&2; }

mkdir -p "$STAGE/whl-site" "$STAGE/whl-venv"
tarball="$STAGE/$(basename "$OPENMPI_URL")"
if ! echo "$OPENMPI_SHA256  $tarball" | sha256sum --check --quiet 2>/dev/null; then
    say "downloading $OPENMPI_URL"
    curl --fail --silent --show-error --location --retry 3 -o "$tarball" "$OPENMPI_URL"
    echo "$OPENMPI_SHA256  $tarball" | sha256sum --check --quiet
fi
sdist="$STAGE/horovod-$HOROVOD_VERSION.tar.gz"
if ! echo "$HOROVOD_SHA256  $sdist" | sha256sum --check --quiet 2>/dev/null; then
    say "downloading horovod==$HOROVOD_VERSION's source"
    "$PIP_PYTHON" -m pip download --quiet --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$STAGE"
    echo "$HOROVOD_SHA256  $sdist" | sha256sum --check --quiet
fi
wheels=(--quiet --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp)
"$PIP_PYTHON" -m pip download "${wheels[@]}" --platform manylinux_2_28_x86_64 \
    --platform manylinux2014_x86_64 -d "$STAGE/whl-site" invoke==2.2.1 docker==7.1.0
"$PIP_PYTHON" -m pip download "${wheels[@]}" --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 -d "$STAGE/whl-venv" cffi pycparser
(cd "$STAGE" && sha256sum ./*.t* whl-*/*.whl)
du -sh "$STAGE"
say "staged; checksums of the sources match docker/versions.env"
