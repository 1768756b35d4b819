#!/usr/bin/env bash
# Build and install Horovod from its source release against the torch that is
# already installed in the target Python. Used by the images and, unchanged, on
# bare metal (a cluster without containers), so the two never drift.
#
#   PYTHON=/path/to/python bash docker/install-horovod.sh
#
# Environment (all optional):
#   PYTHON                  interpreter to install into (default: python3)
#   HOROVOD_SDIST           a local horovod-<version>.tar.gz instead of downloading it
#   HOROVOD_GPU_OPERATIONS  NCCL or MPI (GPU builds only; unset for CPU)
#   HOROVOD_WITHOUT_MPI=1   build without the MPI controller (default: with it when mpicxx exists)
#   HOROVOD_WITH_CCL        1: build Horovod's oneCCL CPU operations too, 0: not (default: 1
#                           on x86_64 without HOROVOD_GPU_OPERATIONS, 0 otherwise; see below)
#   ONECCL_WHEEL            a local oneccl_devel-<version>-...whl instead of downloading it
#   CUDA_HOME               CUDA toolkit root; found from nvcc when torch is a CUDA build
#   JOBS                    parallel compile jobs (default: number of cores)
#   HOROVOD_CMAKE           the cmake Horovod's setup.py runs (default: cmake on the PATH)
#   HOROVOD_CONFIGURE_ONLY=1  stop after Horovod's CMake configure step (seconds, no
#                           compile, nothing installed): checks this machine's CMake,
#                           compilers and torch the way the build would meet them
#
# Horovod's Python requirements (its setup.py install_requires for 0.28.1: cloudpickle,
# psutil, pyyaml, packaging, and cffi>=1.4.0 unless HOROVOD_WITHOUT_PYTORCH) are checked
# in the target Python before anything is compiled, always: a missing one is installed
# with pip first, so that on a machine whose package index is unreachable (no network,
# PIP_NO_INDEX=1, --no-index) the script stops at once naming it and the pip line that
# installs it, instead of pip's resolver stopping later with no word from this script.
#
# CMake 4.0 removed compatibility with cmake_minimum_required(VERSION < 3.5), which
# Horovod 0.28.1's bundled third_party/gloo/CMakeLists.txt declares (2.8.12; the one
# bundled project its CMakeLists.txt adds with add_subdirectory). The script always exports
# CMAKE_POLICY_VERSION_MINIMUM=3.5 (unless set already): CMake 4.0 added that variable,
# whose environment form initialises the cache entry of a new build tree and raises those
# projects' policy version (cmake.org, variable CMAKE_POLICY_VERSION_MINIMUM, "Added in
# version 4.0"); CMake 3.x does not read it, so it changes nothing there.
#
# Horovod 0.28.1 is its last release. Changes made to its source, each checked to
# apply to the text it expects:
# - CMAKE_CXX_STANDARD 14 -> 17 in CMakeLists.txt and horovod/torch/CMakeLists.txt
#   (torch >= 2.1 needs C++17);
# - the two includes gcc >= 13 needs and upstream added after 0.28.1 (horovod PR #3957,
#   commit ff4ca09d): <stdexcept> in horovod/common/common.h (std::logic_error) and
#   <string> in horovod/common/group_table.h (std::string). gcc 12 compiles without them;
# - the bundled flatbuffers' span::count_ loses its const (gcc 14: "assignment of
#   read-only member 'flatbuffers::span<T, Extent>::count_'" in its operator=, seen
#   building on Debian 13), as flatbuffers itself did (google/flatbuffers PR #7227).
# - no debug information: setup.py always configures RelWithDebInfo (setup.py,
#   build_extensions), whose flags CMakeLists.txt turns into "-O3 -g -DNDEBUG"; -g is taken
#   out of them (C, C++ and CUDA), keeping -O3. With torch's headers -g costs about half as
#   much again per file (horovod/torch/mpi_ops_v2.cc: 57 s with it, 38 s without, g++ 12,
#   one core) for line numbers no kit user reads; function names stay in the library's
#   symbol table, so a native backtrace still names them.
# - the CPU operations' build-time default (HOROVOD_CPU_OPERATIONS at build time) defined as
#   its character's number (M 77, C 67, G 71) instead of the bare letter: env_parser.cc's
#   `#if HOROVOD_CPU_OPERATIONS_DEFAULT == 'M'` reads an undefined name as 0, so in 0.28.1
#   the build-time default never applies, and a build with oneCCL would run CCL wherever
#   HOROVOD_CPU_OPERATIONS is unset (horovodrun --mpi sets none), MPI's runs included.
# oneCCL (Intel's oneAPI Collective Communications Library) as a third CPU back end:
# Horovod 0.28.1 compiles horovod/common/ops/ccl_operations.cc and links
# $CCL_ROOT/lib/$CCL_CONFIGURATION/libccl.so whenever CCL_ROOT is set (CMakeLists.txt,
# "# oneCCL", lines 257-266), beside its MPI and Gloo operations; which of the three a
# run uses is read at run time from HOROVOD_CPU_OPERATIONS (horovod/common/utils/
# env_parser.cc, ParseCPUOpsFromEnv), so one build holds all three. Its default, when the
# variable is unset at run time, becomes CCL once CCL is built (same function) unless
# HOROVOD_CPU_OPERATIONS is given at build time (CMakeLists.txt lines 320-340): the script
# gives MPI (GLOO without MPI), so a run that names nothing does what it did before.
# oneCCL comes from the package index's oneccl-devel wheel (ONECCL_VERSION in
# docker/versions.env; 489 MB unpacked). Only its CPU library (lib/ccl/cpu/lib/libccl.so.1.0,
# 31 MB, which needs nothing beyond libc and libstdc++; the wheel's lib/libccl.so is the SYCL
# build, which needs Intel's compiler runtime) and its headers are taken out, into
# <prefix of PYTHON>/lib/oneccl, which Horovod's library finds through the RPATH CMake
# gives it; the headers are removed after the build. Its transport at run time is set by
# the kit (lab/common/ccl.py says which and why).
# Python >= 3.12 has no distutils, which horovod/torch/CMakeLists.txt (distutils.sysconfig,
# line 37, its failure silently ignored) and horovod/runner/js_run.py (distutils.spawn,
# imported by horovodrun) use: setuptools' shim provides it (the default since
# setuptools 60), and it is checked before the build.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=matrix.sh
source "$here/matrix.sh"

PYTHON="${PYTHON:-python3}"
JOBS="${JOBS:-$(nproc)}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

say() { printf 'install-horovod: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

"$PYTHON" -c 'import torch' 2>/dev/null \
    || die "torch is not importable from $PYTHON; install torch==$TORCH_VERSION first"

# Horovod's Python requirements (see above), as pip requirement strings, each one this
# Python lacks or has too old.
requirements_missing() {
    "$PYTHON" - <<'EOF'
import importlib.metadata as md, os, re
reqs = ["cloudpickle", "psutil", "pyyaml", "packaging"]
if not os.environ.get("HOROVOD_WITHOUT_PYTORCH"):
    reqs.append("cffi>=1.4.0")
number = lambda v: tuple(int(x) for x in re.findall(r"\d+", v)[:3])
for req in reqs:
    name, _, least = req.partition(">=")
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        print(req)
        continue
    if least and number(have) < number(least):
        print(req)
EOF
}
mapfile -t missing < <(requirements_missing)
if ((${#missing[@]})); then
    say "installing Horovod's requirements first: ${missing[*]}"
    if "$PYTHON" -m pip install --quiet "${missing[@]}" 2>"$work/requirements.log"; then
        mapfile -t missing < <(requirements_missing)
    fi
    ((${#missing[@]} == 0)) || die "Horovod $HOROVOD_VERSION needs ${missing[*]}, which $PYTHON lacks and pip could not install (is the package index reachable?): run $PYTHON -m pip install$(printf " '%s'" "${missing[@]}") (offline: add --no-index --find-links DIR with its wheels), then this script again"
fi

sdist="${HOROVOD_SDIST:-}"
if [[ -z "$sdist" ]]; then
    say "downloading horovod==$HOROVOD_VERSION source"
    "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: \
        "horovod==$HOROVOD_VERSION" -d "$work" 2>"$work/download.log" \
        || die "could not download horovod==$HOROVOD_VERSION's source (is the package index reachable?): set HOROVOD_SDIST to a local horovod-$HOROVOD_VERSION.tar.gz"
    sdist="$work/horovod-$HOROVOD_VERSION.tar.gz"
fi
[[ -f "$sdist" ]] || die "no source archive at $sdist"
echo "$HOROVOD_SHA256  $sdist" | sha256sum --check --quiet \
    || die "checksum of $sdist does not match HOROVOD_SHA256 in docker/versions.env"

tar -xzf "$sdist" -C "$work"
src="$work/horovod-$HOROVOD_VERSION"
for f in "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"; do
    grep -q 'set(CMAKE_CXX_STANDARD 14)' "$f" || die "unexpected source: no C++14 setting in $f"
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$f"
done
add_include() {  # FILE AFTER NEW: put "#include NEW" after the line "#include AFTER"
    local f="$src/$1"
    grep -q "^#include $3" "$f" && return
    grep -q "^#include $2\$" "$f" || die "unexpected source: no #include $2 in $1"
    sed -i "s|^#include $2\$|#include $2\n#include $3|" "$f"
}
add_include horovod/common/common.h '<memory>' '<stdexcept>'
add_include horovod/common/group_table.h '<queue>' '<string>'
# shellcheck disable=SC2016  # CMake's text, not the shell's
cuda_o3='string(REPLACE "-O2" "-O3" CMAKE_CUDA_FLAGS_RELWITHDEBINFO "${CMAKE_CUDA_FLAGS_RELWITHDEBINFO}")'
grep -qxF "$cuda_o3" "$src/CMakeLists.txt" || die "unexpected source: no line $cuda_o3 in CMakeLists.txt"
cat >"$work/no-debug-info.cmake" <<'CMAKE'
foreach(lang C CXX CUDA)    # docker/install-horovod.sh: no debug information
    string(REGEX REPLACE "(^| )-g( |$)" " " CMAKE_${lang}_FLAGS_RELWITHDEBINFO "${CMAKE_${lang}_FLAGS_RELWITHDEBINFO}")
endforeach()
CMAKE
sed -i "/^string(REPLACE \"-O2\" \"-O3\" CMAKE_CUDA_FLAGS_RELWITHDEBINFO /r $work/no-debug-info.cmake" "$src/CMakeLists.txt"
# The CPU operations' build-time default as a number: CMakeLists.txt defines
# HOROVOD_CPU_OPERATIONS_DEFAULT=M (C, G), which env_parser.cc compares with 'M' in #if,
# where an undefined name is 0, so the default given at build time never applies (the GPU
# operations' defines go through CONVERT_TO_ASCII_DEC for this reason: cmake/Utilities.cmake).
for op in M:77 C:67 G:71; do
    grep -q "add_definitions(-DHOROVOD_CPU_OPERATIONS_DEFAULT=${op%:*})" "$src/CMakeLists.txt" \
        || die "unexpected source: no HOROVOD_CPU_OPERATIONS_DEFAULT=${op%:*} in CMakeLists.txt"
    sed -i "s/add_definitions(-DHOROVOD_CPU_OPERATIONS_DEFAULT=${op%:*})/add_definitions(-DHOROVOD_CPU_OPERATIONS_DEFAULT=${op#*:})/" \
        "$src/CMakeLists.txt"
done
span="$src/third_party/flatbuffers/include/flatbuffers/stl_emulation.h"
if ! grep -q '^  size_type count_;' "$span"; then
    grep -q '^  const size_type count_;' "$span" || die "unexpected source: no const span::count_ in $span"
    sed -i 's/^  const size_type count_;/  size_type count_;/' "$span"
fi
"$PYTHON" -c 'from distutils.sysconfig import get_python_inc; from distutils.spawn import find_executable' 2>/dev/null \
    || die "$PYTHON has no distutils (Python >= 3.12 dropped it) and Horovod's build and horovodrun need it: install setuptools==$SETUPTOOLS_VERSION into it (its shim provides distutils)"

torch_cuda="$("$PYTHON" -c 'import torch; print(torch.version.cuda or "")')"
with_ccl="${HOROVOD_WITH_CCL:-}"
if [[ -z "$with_ccl" ]]; then
    with_ccl=0
    [[ -z "${HOROVOD_GPU_OPERATIONS:-}" && "$(uname -m)" == x86_64 ]] && with_ccl=1
fi
[[ "$with_ccl" =~ ^[01]$ ]] || die "HOROVOD_WITH_CCL must be 1 or 0, not $with_ccl"
ccl_root=""
if [[ "$with_ccl" == 1 ]]; then
    [[ "$(uname -m)" == x86_64 ]] \
        || die "oneCCL's wheels on the package index are for x86_64 only; set HOROVOD_WITH_CCL=0 on $(uname -m)"
    wheel="${ONECCL_WHEEL:-}"
    if [[ -z "$wheel" ]]; then
        say "downloading oneccl-devel==$ONECCL_VERSION (98 MB)"
        "$PYTHON" -m pip download --quiet --no-deps --no-cache-dir --only-binary :all: \
            "oneccl-devel==$ONECCL_VERSION" -d "$work/oneccl" 2>"$work/oneccl-download.log" \
            || die "could not download oneccl-devel==$ONECCL_VERSION (is the package index reachable?): set ONECCL_WHEEL to a local oneccl_devel-$ONECCL_VERSION wheel, or HOROVOD_WITH_CCL=0"
        wheel="$(echo "$work"/oneccl/oneccl_devel-*.whl)"
    fi
    [[ -f "$wheel" ]] || die "no oneCCL wheel at $wheel"
    echo "$ONECCL_SHA256  $wheel" | sha256sum --check --quiet \
        || die "checksum of $wheel does not match ONECCL_SHA256 in docker/versions.env"
    ccl_root="$("$PYTHON" -c 'import sys; print(sys.prefix)')/lib/oneccl"
    rm -rf "$ccl_root"
    "$PYTHON" - "$wheel" "$ccl_root" "$ONECCL_VERSION" <<'EOF'
import os, sys, zipfile
wheel, root, version = sys.argv[1:]
data = f"oneccl_devel-{version}.data/data/"
lib = data + "lib/ccl/cpu/lib/libccl.so.1.0"
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith(data + "include/") and not n.endswith("/")]
    if lib not in z.namelist() or not names:
        sys.exit(f"install-horovod: error: unexpected wheel: no {lib} or no headers in {wheel}")
    for n in names:
        dest = os.path.join(root, n[len(data):])
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with z.open(n) as src, open(dest, "wb") as out:
            out.write(src.read())
    os.makedirs(os.path.join(root, "lib"), exist_ok=True)
    with z.open(lib) as src, open(os.path.join(root, "lib", "libccl.so.1.0"), "wb") as out:
        out.write(src.read())
EOF
    ln -s libccl.so.1.0 "$ccl_root/lib/libccl.so.1"
    ln -s libccl.so.1 "$ccl_root/lib/libccl.so"
    export CCL_ROOT="$ccl_root" CCL_CONFIGURATION=""
    say "oneCCL $ONECCL_VERSION's CPU library at $ccl_root"
fi

export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
export HOROVOD_WITH_GLOO=1
if [[ "${HOROVOD_WITHOUT_MPI:-0}" != 1 ]]; then
    command -v mpicxx >/dev/null \
        || die "mpicxx not found: install an MPI (Debian: libopenmpi-dev) or set HOROVOD_WITHOUT_MPI=1"
    export HOROVOD_WITH_MPI=1
fi
if [[ -n "$ccl_root" ]]; then
    # The default CPU operations of a run that names none stay what they were without
    # CCL (see above).
    if [[ "${HOROVOD_WITH_MPI:-0}" == 1 ]]; then
        export HOROVOD_CPU_OPERATIONS=MPI
    else
        export HOROVOD_CPU_OPERATIONS=GLOO
    fi
fi
export MAKEFLAGS="-j$JOBS"
if [[ "${HOROVOD_GPU_OPERATIONS:-}" == MPI ]]; then
    ompi_info --parsable --all 2>/dev/null | grep -q '_built_with_cuda_support:value:true' \
        || die "HOROVOD_GPU_OPERATIONS=MPI needs a CUDA-aware MPI, and this one is not (ompi_info): build one with docker/install-openmpi.sh, or use NCCL"
fi

if [[ -n "$torch_cuda" ]]; then
    # A CUDA build of torch makes Horovod's torch extension look for the toolkit.
    if [[ -z "${CUDA_HOME:-}" ]]; then
        nvcc="$(command -v nvcc || true)"
        [[ -n "$nvcc" ]] || die "torch is built for CUDA $torch_cuda but no CUDA toolkit was found: set CUDA_HOME or put nvcc on the PATH"
        # nvcc may be a wrapper script; ask it where it really lives.
        real="$(sed -n 's#^exec \(/.*\)/bin/nvcc.*#\1#p' "$nvcc" 2>/dev/null | head -n1)"
        CUDA_HOME="${real:-$(cd "$(dirname "$(readlink -f "$nvcc")")/.." && pwd)}"
    fi
    export CUDA_HOME CUDAToolkit_ROOT="$CUDA_HOME" PATH="$CUDA_HOME/bin:$PATH"
    say "torch is built for CUDA $torch_cuda; CUDA toolkit at $CUDA_HOME"
    # Horovod compiles its CUDA kernels for every sm_NN nvcc lists unless given
    # HOROVOD_BUILD_CUDA_CC_LIST (cmake/build_utils.py: comma-separated integers, PTX
    # added for the last): the matrix's list, as nccl-tests gets, and most of the
    # GPU build's time saved.
    if [[ -z "${HOROVOD_BUILD_CUDA_CC_LIST:-}" ]]; then
        HOROVOD_BUILD_CUDA_CC_LIST="$(cuda_archs_for "$CUDA_HOME/bin/nvcc")"
        [[ -n "$HOROVOD_BUILD_CUDA_CC_LIST" ]] \
            || die "the matrix has no architecture list for the CUDA toolkit at $CUDA_HOME: set CUDA_ARCHS (e.g. 80,90)"
    fi
    [[ "$HOROVOD_BUILD_CUDA_CC_LIST" =~ ^[0-9]+(,[0-9]+)*$ ]] \
        || die "HOROVOD_BUILD_CUDA_CC_LIST must be compute capabilities like 75,80,90, not $HOROVOD_BUILD_CUDA_CC_LIST"
    export HOROVOD_BUILD_CUDA_CC_LIST
    say "CUDA kernels for compute capabilities $HOROVOD_BUILD_CUDA_CC_LIST"
    if [[ "${HOROVOD_GPU_OPERATIONS:-}" == NCCL && -z "${HOROVOD_NCCL_HOME:-}${HOROVOD_NCCL_LIB:-}" ]]; then
        # Use the NCCL that torch itself loads (the nvidia-nccl wheel), so one
        # process never holds two copies of NCCL.
        nccl="$(PYTHON="$PYTHON" bash "$here/torch-nccl.sh")" \
            || die "HOROVOD_GPU_OPERATIONS=NCCL: set HOROVOD_NCCL_HOME to an NCCL install"
        export HOROVOD_NCCL_INCLUDE="$nccl/include" HOROVOD_NCCL_LIB="$nccl/lib" HOROVOD_NCCL_LINK=SHARED
        say "using torch's NCCL at $nccl"
    fi
elif [[ -n "${HOROVOD_GPU_OPERATIONS:-}" ]]; then
    die "HOROVOD_GPU_OPERATIONS=$HOROVOD_GPU_OPERATIONS needs a CUDA build of torch; this one is CPU-only"
fi

# CMake 4 refuses the bundled gloo's cmake_minimum_required(2.8.12) without it; CMake 3.x
# ignores it (see above).
export CMAKE_POLICY_VERSION_MINIMUM="${CMAKE_POLICY_VERSION_MINIMUM:-3.5}"
cmake_bin="${HOROVOD_CMAKE:-cmake}"
cmake_version="$("$cmake_bin" --version 2>/dev/null | sed -n '1s/^cmake version //p' || true)"
[[ -z "$cmake_version" ]] || say "CMake $cmake_version ($(command -v "$cmake_bin"))"
if [[ "${HOROVOD_CONFIGURE_ONLY:-0}" == 1 ]]; then
    # The configure command of Horovod's setup.py (build_extensions), in a throwaway tree.
    say "configuring horovod $HOROVOD_VERSION only (HOROVOD_CONFIGURE_ONLY=1)"
    mkdir -p "$work/configure"
    (cd "$work/configure" && "$cmake_bin" "$src" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        "-DCMAKE_LIBRARY_OUTPUT_DIRECTORY_RELWITHDEBINFO=$work/configure/lib" \
        "-DPYTHON_EXECUTABLE:FILEPATH=$("$PYTHON" -c 'import sys; print(sys.executable)')") \
        || die "Horovod's CMake configure step failed (above)"
    # The flags the compile would use (horovod.torch's library, and the CUDA kernels'
    # when there are any; without -g, see above).
    for lang in CXX CUDA; do
        line="$(find "$work/configure" -name flags.make -exec grep -h "^${lang}_FLAGS = " {} + 2>/dev/null \
                | sort | tail -n1 || true)"
        [[ -z "$line" ]] || say "$lang flags: ${line#*= }"
    done
    say "configured; nothing built or installed"
    exit 0
fi
say "building horovod $HOROVOD_VERSION with $JOBS jobs (takes minutes)"
# No build isolation: Horovod must compile against the torch installed here,
# not a fresh one pip would fetch into an isolated build environment.
"$PYTHON" -m pip install --no-build-isolation --no-cache-dir "$src"

# Only the library ships: the headers served the compile.
[[ -z "$ccl_root" ]] || rm -rf "$ccl_root/include"

say "checking the build"
"$PYTHON" -m horovod.runner.launch --check-build
CCL_ROOT="$ccl_root" "$PYTHON" - <<'EOF'
import os, horovod.torch as hvd
assert hvd.gloo_built(), "Horovod was built without Gloo"
if os.environ.get("HOROVOD_WITH_MPI") == "1":
    assert hvd.mpi_built(), "Horovod was built without MPI"
ops = os.environ.get("HOROVOD_GPU_OPERATIONS", "")
if ops == "NCCL":
    assert hvd.nccl_built(), "Horovod was built without NCCL"
if ops == "MPI":
    # --check-build lists MPI among tensor operations whenever the MPI controller is
    # built; GPU operations over MPI show as CUDA support without NCCL.
    assert hvd.cuda_built() and not hvd.nccl_built(), "Horovod was not built for MPI GPU operations"
if os.environ["CCL_ROOT"]:
    assert hvd.ccl_built(), "Horovod was built without oneCCL"
print("install-horovod: horovod.torch imports; gloo=%s mpi=%s nccl=%s ccl=%s"
      % (hvd.gloo_built(), hvd.mpi_built(), hvd.nccl_built(), hvd.ccl_built()))
# How it was built, beside the package: the library cannot tell MPI GPU operations
# from none (both are CUDA without NCCL), so envcheck and the smoke tests read this.
import json, horovod
record = {"gpu_operations": ops or None, "cuda_home": os.environ.get("CUDA_HOME"),
          "nccl_lib": os.environ.get("HOROVOD_NCCL_LIB"),
          "ccl_root": os.environ["CCL_ROOT"] or None, "built_by": "docker/install-horovod.sh"}
# (lab.common.kit.HOROVOD_BUILD_RECORD names this file; kit.horovod_gpu_operations reads it.)
with open(os.path.join(os.path.dirname(horovod.__file__), "lab_build.json"), "w") as f:
    json.dump(record, f)
EOF
