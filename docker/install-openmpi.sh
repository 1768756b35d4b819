#!/usr/bin/env bash
# Build Open MPI from its release tarball with CUDA support (CUDA-aware MPI), for the
# GPU flavor and, unchanged, for bare metal. Version, URL and sha256 come from
# docker/versions.env; the checksum is verified also for a tarball given locally.
#
#   bash docker/install-openmpi.sh
#
# Environment (all optional):
#   PREFIX            install prefix (default /opt/openmpi)
#   CUDA_HOME         CUDA toolkit root (default: found from nvcc, else /usr/local/cuda)
#   OPENMPI_TARBALL   a local copy of the tarball instead of downloading it
#   JOBS              parallel compile jobs (default: number of cores)
#   UCX_HOME          a UCX built with CUDA (its lib/ucx/libuct_cuda.so*) to build the UCX
#                     PML with; without it Open MPI is configured --without-ucx
#   CONFIGURE_ONLY=1  print configure's arguments and stop (nothing is fetched or built)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=matrix.sh
source "$here/matrix.sh"
say() { printf 'install-openmpi: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

PREFIX="${PREFIX:-/opt/openmpi}"
JOBS="${JOBS:-$(nproc)}"
if [[ -z "${CUDA_HOME:-}" ]]; then
    if nvcc="$(command -v nvcc)"; then
        CUDA_HOME="$(cd "$(dirname "$(readlink -f "$nvcc")")/.." && pwd)"
    else
        CUDA_HOME=/usr/local/cuda
    fi
fi
[[ -f "$CUDA_HOME/include/cuda.h" ]] \
    || die "no CUDA toolkit at $CUDA_HOME (cuda.h missing): set CUDA_HOME to the toolkit's root"

# UCX: a UCX that Open MPI finds (a host's MOFED or HPC-X in /usr) makes the UCX PML,
# which outranks ob1 wherever UCX finds an InfiniBand or RoCE device (ompi v4.1.x
# ompi/mca/pml/ucx/pml_ucx_component.c: priority 51 against ob1's 20; Open MPI's docs:
# "UCX is enabled and selected by default for InfiniBand and RoCE network devices").
# A UCX built without CUDA then carries GPU buffers it cannot read. So UCX only when one
# with CUDA is given; ob1 (smcuda, tcp) otherwise.
ucx=(--without-ucx)
if [[ -n "${UCX_HOME:-}" ]]; then
    # UCX's CUDA transport module: lib/ucx in its own prefix, lib64/ucx or the
    # multiarch folder in a distribution's or MOFED's layout.
    compgen -G "$UCX_HOME/lib/ucx/libuct_cuda.so*" >/dev/null \
        || compgen -G "$UCX_HOME/lib64/ucx/libuct_cuda.so*" >/dev/null \
        || compgen -G "$UCX_HOME/lib/*-linux-gnu/ucx/libuct_cuda.so*" >/dev/null \
        || die "the UCX at $UCX_HOME has no CUDA transport (libuct_cuda.so in lib/ucx, lib64/ucx or lib/<arch>/ucx): give a UCX built --with-cuda, or unset UCX_HOME to build without UCX"
    ucx=(--with-ucx="$UCX_HOME")
fi
configure_args=(--prefix="$PREFIX" --with-cuda="$CUDA_HOME" "${ucx[@]}"
                --disable-mpi-fortran --disable-oshmem --disable-io-romio
                --enable-orterun-prefix-by-default --enable-silent-rules)
if [[ "${CONFIGURE_ONLY:-0}" == 1 ]]; then
    printf '%s\n' "${configure_args[@]}"
    exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
tarball="${OPENMPI_TARBALL:-}"
if [[ -z "$tarball" ]]; then
    say "downloading $OPENMPI_URL"
    tarball="$work/$(basename "$OPENMPI_URL")"
    curl --fail --silent --show-error --location --retry 3 -o "$tarball" "$OPENMPI_URL" \
        || die "could not download $OPENMPI_URL: give a local copy with OPENMPI_TARBALL=FILE"
fi
[[ -f "$tarball" ]] || die "no tarball at $tarball"
echo "$OPENMPI_SHA256  $tarball" | sha256sum --check --quiet \
    || die "checksum of $tarball does not match OPENMPI_SHA256 in docker/versions.env"

tar -xf "$tarball" -C "$work"
src="$(find "$work" -maxdepth 1 -type d -name "openmpi-$OPENMPI_VERSION*" | head -n1)"
[[ -n "$src" ]] || die "the tarball holds no openmpi-$OPENMPI_VERSION folder"
say "configuring Open MPI $OPENMPI_VERSION with CUDA from $CUDA_HOME into $PREFIX (${ucx[*]})"
cd "$src"
# Left out, since nothing here uses them and they are a large part of the compile:
# the Fortran bindings, OpenSHMEM and ROMIO (MPI-IO). mpirun finds its own prefix on
# remote nodes without a PATH set there (multi-node over SSH).
./configure --quiet "${configure_args[@]}" >"$work/configure.log" 2>&1 \
    || { tail -40 "$work/configure.log" >&2; die "configure failed (end of its log above)"; }
say "compiling with $JOBS jobs (takes minutes)"
make -j"$JOBS" >"$work/make.log" 2>&1 || { tail -40 "$work/make.log" >&2; die "make failed"; }
make install >"$work/install.log" 2>&1 || { tail -40 "$work/install.log" >&2; die "make install failed"; }
if [[ -w /etc/ld.so.conf.d ]]; then
    echo "$PREFIX/lib" > /etc/ld.so.conf.d/openmpi.conf
    ldconfig
fi

built="$("$PREFIX/bin/ompi_info" --parsable --all | grep -c '_built_with_cuda_support:value:true' || true)"
[[ "$built" -ge 1 ]] || die "Open MPI was built but ompi_info does not report CUDA support"
say "Open MPI $OPENMPI_VERSION at $PREFIX, CUDA-aware (ompi_info: opal_built_with_cuda_support:value:true)"
say "put $PREFIX/bin on the PATH"
