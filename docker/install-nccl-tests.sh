#!/usr/bin/env bash
# Build nccl-tests with MPI=1 against the NCCL that torch loads and the image's Open
# MPI, and install the *_perf binaries into $PREFIX/bin. Images and bare metal alike.
#
#   PYTHON=/opt/lab/bin/python bash docker/install-nccl-tests.sh
#
# Environment (all optional):
#   PREFIX              install prefix (default /opt/nccl-tests)
#   MPI_HOME            MPI prefix (default: from mpicc on the PATH)
#   CUDA_HOME           CUDA toolkit root (default: from nvcc)
#   CUDA_ARCHS          compute capabilities, e.g. 75,80,90 (default: the matrix's for
#                       the toolkit's CUDA version)
#   NCCL_TESTS_SOURCE   a local git clone to build from instead of cloning GitHub
#   JOBS                parallel compile jobs
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=matrix.sh
source "$here/matrix.sh"
say() { printf 'install-nccl-tests: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

PREFIX="${PREFIX:-/opt/nccl-tests}"
JOBS="${JOBS:-$(nproc)}"
nvcc="$(command -v nvcc)" || die "nvcc not found: put the CUDA toolkit's bin on the PATH"
CUDA_HOME="${CUDA_HOME:-$(cd "$(dirname "$(readlink -f "$nvcc")")/.." && pwd)}"
mpicc="$(command -v mpicc)" || die "mpicc not found: install Open MPI first (install-openmpi.sh)"
MPI_HOME="${MPI_HOME:-$(cd "$(dirname "$(readlink -f "$mpicc")")/.." && pwd)}"
NCCL_HOME="$(bash "$here/torch-nccl.sh")"

CUDA_ARCHS="$(cuda_archs_for "$nvcc")"
[[ -n "$CUDA_ARCHS" ]] || die "the matrix has no architecture list for this CUDA toolkit ($("$nvcc" --version | tail -n1)): set CUDA_ARCHS"
gencode=""
for a in ${CUDA_ARCHS//,/ }; do gencode+=" -gencode=arch=compute_$a,code=sm_$a"; done
# PTX for the highest architecture too, so a GPU newer than the list JIT-compiles it
# (nccl-tests' own default, src/common.mk, ends the same way).
highest="$(tr ',' '\n' <<<"$CUDA_ARCHS" | sort -n | tail -n1)"
gencode+=" -gencode=arch=compute_$highest,code=compute_$highest"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if [[ ! -f "$MPI_HOME/include/mpi.h" ]]; then
    # A distribution's Open MPI (Debian: headers under /usr/lib/<arch>/openmpi/include):
    # give the Makefile the MPI_HOME layout it expects.
    inc="$(mpicc --showme:incdirs 2>/dev/null | awk '{print $1}')"
    lib="$(mpicc --showme:libdirs 2>/dev/null | awk '{print $1}')"
    [[ -n "$inc" && -f "$inc/mpi.h" && -n "$lib" ]] || die "no mpi.h under $MPI_HOME: set MPI_HOME"
    mkdir -p "$work/mpi"
    ln -s "$inc" "$work/mpi/include"
    ln -s "$lib" "$work/mpi/lib"
    MPI_HOME="$work/mpi"
fi
src="$work/nccl-tests"
origin="${NCCL_TESTS_SOURCE:-https://github.com/NVIDIA/nccl-tests.git}"
say "fetching nccl-tests v$NCCL_TESTS_VERSION from $origin"
git clone --quiet --no-checkout "$origin" "$src" \
    || die "could not clone $origin: give a local clone with NCCL_TESTS_SOURCE=DIR"
git -C "$src" -c advice.detachedHead=false checkout --quiet "$NCCL_TESTS_COMMIT" \
    || die "commit $NCCL_TESTS_COMMIT (v$NCCL_TESTS_VERSION) is not in $origin"
[[ "$(git -C "$src" rev-parse HEAD)" == "$NCCL_TESTS_COMMIT" ]] \
    || die "checked-out commit is not NCCL_TESTS_COMMIT from docker/versions.env"

say "compiling for sm ${CUDA_ARCHS} with NCCL at $NCCL_HOME and MPI at $MPI_HOME"
make -C "$src" -j"$JOBS" MPI=1 MPI_HOME="$MPI_HOME" CUDA_HOME="$CUDA_HOME" \
    NCCL_HOME="$NCCL_HOME" NVCC_GENCODE="$gencode" >"$work/make.log" 2>&1 \
    || { tail -40 "$work/make.log" >&2; die "make failed (end of its log above)"; }
mkdir -p "$PREFIX/bin"
install -m 0755 "$src"/build/*_perf "$PREFIX/bin/"
# The binaries must find torch's NCCL at run time: the image registers its folder
# with the loader (/etc/ld.so.conf.d); elsewhere LD_LIBRARY_PATH has to name it.
# Every binary must load torch's NCCL, no other copy.
for b in "$PREFIX"/bin/*_perf; do
    LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$NCCL_HOME/lib" ldd "$b" \
        | grep -q "=> $(readlink -f "$NCCL_HOME/lib/libnccl.so.2")\|=> $NCCL_HOME/lib/libnccl.so.2" \
        || die "$b does not load NCCL from $NCCL_HOME"
done
say "installed $(find "$PREFIX/bin" -name '*_perf' | wc -l) binaries into $PREFIX/bin; they load NCCL from $NCCL_HOME/lib"
