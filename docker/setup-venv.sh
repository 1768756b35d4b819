#!/usr/bin/env bash
# Make a Python virtual environment holding the whole training stack: torch and
# torchvision at the versions of docker/versions.env, Horovod built from source by
# install-horovod.sh, DeepSpeed, and this kit (editable, with its extras).
# First the system packages that needs (Open MPI, a compiler, CMake, Python's venv and
# headers) on Debian or Ubuntu: installed when it runs as root, else it names the
# `sudo apt-get install` line to run and stops.
#
#   bash docker/setup-venv.sh [DIR]        # DIR defaults to .venv
#   bash docker/setup-venv.sh --system     # only the system packages
#   bash docker/setup-venv.sh --key        # the cached environment it would use, nothing made
#
# Environment (all optional):
#   TORCH_INDEX_URL  where torch and torchvision come from. Default: the package
#                    index's default builds (CUDA builds; they also run on a CPU, and
#                    they are the only torchvision builds there). For CPU-only builds:
#                    https://download.pytorch.org/whl/cpu
#   LAB_ENV_CACHE    a folder where the heavy part (torch, Horovod, DeepSpeed, the kit's
#                    dependencies) is kept and reused, keyed by everything that goes
#                    into it (default ~/.cache/dl-lab-kit; empty: build all of it in DIR).
#                    DIR is then a light environment of its own that sees the cached
#                    packages and holds this checkout's kit: two checkouts sharing the
#                    cache each import their own `lab`, whichever ran this script last.
#   PIP_CA_BUNDLE    CA bundle for pip (default: Debian's /etc/ssl/certs/ca-certificates.crt)
#   CUDA_ARCHS       compute capabilities Horovod's CUDA kernels are compiled for, when
#                    torch is a CUDA build and a toolkit is found (e.g. 90 for an H100;
#                    default: the matrix's list for the toolkit, six of them, which takes
#                    several times as long to compile as one; HOROVOD_BUILD_CUDA_CC_LIST,
#                    Horovod's own name for it, wins when set)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
say() { printf 'setup-venv: %s\n' "$*" >&2; }

# ---- system packages (Debian/Ubuntu)
system_packages() {
    local want=(openmpi-bin libopenmpi-dev g++ make cmake ca-certificates) missing=() p
    # venv needs ensurepip (Debian ships it as python3-venv); Horovod's build needs Python.h.
    python3 -c 'import ensurepip' >/dev/null 2>&1 || want+=(python3-venv)
    python3 -c 'import os, sysconfig; assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))' \
        >/dev/null 2>&1 || want+=(python3-dev)
    for p in "${want[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
    done
    ((${#missing[@]})) || return 0
    if [[ "$(id -u)" != 0 ]]; then
        say "missing system packages; run this, then this script again:"
        say "  sudo apt-get update && sudo apt-get install -y --no-install-recommends ${missing[*]}"
        exit 1
    fi
    say "installing system packages: ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
if [[ "${1:-}" == --key ]]; then
    :   # only the cached environment's folder is asked for (below)
elif command -v dpkg-query >/dev/null; then
    system_packages
else
    say "not a Debian or Ubuntu system: install Open MPI (with headers), a C++ compiler, CMake and Python's venv yourself"
fi
[[ "${1:-}" == --system ]] && exit 0

# shellcheck source=versions.env
source "$here/versions.env"
dest="$(realpath -m -- "${1:-$repo/.venv}")"   # absolute: its commands name its Python
ca="${PIP_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
index="${TORCH_INDEX_URL:-}"
# The key covers what the slow part (torch, Horovod's compile, DeepSpeed) depends on; the
# kit and any dependency the cache lacks are brought up to date on every run below.
key="$( { grep -E '^(TORCH|TORCHVISION|HOROVOD|ONECCL|SETUPTOOLS|WHEEL|DEEPSPEED)_' "$here/versions.env"
          cat "$here/install-torch.sh" "$here/install-horovod.sh" "$here/setup-venv.sh" \
              "$here/matrix.sh" "$here/torch-nccl.sh"
          python3 --version; echo "$index"; echo "${CUDA_ARCHS:-}"
          echo "${HOROVOD_BUILD_CUDA_CC_LIST:-}"; } | sha256sum | cut -c1-16)"
cache="${LAB_ENV_CACHE-$HOME/.cache/dl-lab-kit}"
if [[ -n "$cache" ]]; then
    env="$cache/venv-$key"
else
    env="$dest"
fi
if [[ "${1:-}" == --key ]]; then
    echo "$env"
    exit 0
fi

if [[ -f "$env/.complete" ]]; then
    say "reusing $env (same versions, finished earlier)"
else
    say "creating $env"
    rm -rf "$env"
    mkdir -p "$(dirname "$env")"
    python3 -m venv "$env"
    py="$env/bin/python"
    PYTHON="$py" PIP_ISOLATED=1 PIP_CA_BUNDLE="$ca" WITH_TORCHVISION=1 \
        bash "$here/install-torch.sh"
    "$py" -m pip install --quiet "${repo}[train,test]"
    PYTHON="$py" bash "$here/install-horovod.sh"
    # DeepSpeed (the kit's deepspeed extra): the package index has only its source, whose
    # setup.py imports torch, so it is built here, beside torch (--no-build-isolation),
    # with no op compiled ahead (DS_BUILD_OPS=0); about a minute on 2 cores.
    DS_BUILD_OPS=0 "$py" -m pip install --quiet --no-build-isolation "deepspeed==$DEEPSPEED_VERSION"
    "$py" -c "import torch, torchvision, horovod.torch, deepspeed"
    if [[ -n "$cache" ]]; then
        # The cache keeps the kit's dependencies, never the kit: which checkout's `lab`
        # a process imports is decided by that checkout's own DIR below.
        "$py" -m pip uninstall --quiet --yes dl-lab-kit
    fi
    touch "$env/.complete"
fi

if [[ "$env" != "$dest" ]]; then
    # DIR: a venv of its own whose site-packages adds the cached environment's (a .pth
    # line runs site.addsitedir, so the cached .pth files are read too), with the
    # cached environment's commands (invoke, pytest, horovodrun, ...) started by DIR's
    # Python. The kit installed in DIR below comes first on sys.path.
    if [[ -L "$dest" || ! -x "$dest/bin/python" ]]; then
        rm -rf "$dest"
        python3 -m venv --without-pip "$dest"
    fi
    base_site="$("$env/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    site="$("$dest/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    printf 'import site; site.addsitedir(%s)\n' "'$base_site'" > "$site/zz-dl-lab-kit-base.pth"
    for f in "$env"/bin/*; do
        name="$(basename "$f")"
        case "$name" in python*|activate*|Activate*) continue ;; esac
        [[ -f "$f" && -x "$f" ]] || continue
        if [[ "$(head -c 2 "$f")" == '#!' ]] && head -n1 "$f" | grep -q "^#!$env/bin/python"; then
            rm -f "$dest/bin/$name"
            { echo "#!$dest/bin/python"; tail -n +2 "$f"; } > "$dest/bin/$name"
            chmod +x "$dest/bin/$name"
        else
            ln -sfn "$f" "$dest/bin/$name"
        fi
    done
fi

# The kit itself, editable from this checkout, every time: seconds when nothing changed,
# and a dependency added to pyproject.toml is installed here (into DIR, when the cached
# environment lacks it).
DS_BUILD_OPS=0 "$dest/bin/python" -m pip install --quiet --no-build-isolation -e "${repo}[train,test,deepspeed]"
say "ready: $dest ($("$dest/bin/python" -c 'import torch, horovod, importlib.metadata as m; print("torch", torch.__version__, "horovod", horovod.__version__, "deepspeed", m.version("deepspeed"))'))"
