#!/usr/bin/env bash
# Make a Python virtual environment holding the whole training stack: torch and
# torchvision at the versions of docker/versions.env, this kit (editable, with its
# train and test extras), and Horovod built from source by install-horovod.sh.
#
#   bash docker/setup-venv.sh [DIR]        # DIR defaults to .venv
#
# Environment (all optional):
#   TORCH_INDEX_URL  where torch and torchvision come from. Default: the package
#                    index's default builds (CUDA builds; they also run on a CPU, and
#                    they are the only torchvision builds there). For CPU-only builds:
#                    https://download.pytorch.org/whl/cpu
#   LAB_ENV_CACHE    a folder where finished environments are kept and reused, keyed
#                    by everything that goes into them (default ~/.cache/dl-lab-kit;
#                    empty: build DIR itself every time). DIR then links to it.
#   PIP_CA_BUNDLE    CA bundle for pip (default: Debian's /etc/ssl/certs/ca-certificates.crt)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
# shellcheck source=versions.env
source "$here/versions.env"
dest="${1:-$repo/.venv}"
ca="${PIP_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
index="${TORCH_INDEX_URL:-}"
say() { printf 'setup-venv: %s\n' "$*" >&2; }

key="$( { cat "$here/versions.env" "$here/install-horovod.sh" "$here/setup-venv.sh" \
              "$repo/pyproject.toml"; python3 --version; echo "$index"; } | sha256sum | cut -c1-16)"
cache="${LAB_ENV_CACHE-$HOME/.cache/dl-lab-kit}"
if [[ -n "$cache" ]]; then
    env="$cache/venv-$key"
else
    env="$dest"
fi

if [[ -f "$env/.complete" ]]; then
    say "reusing $env (same versions, finished earlier)"
else
    say "creating $env"
    rm -rf "$env"
    mkdir -p "$(dirname "$env")"
    python3 -m venv "$env"
    py="$env/bin/python"
    # --isolated: pip's machine-wide configuration may point at other wheels of
    # torch (a local CPU wheel, say) that would not pair with torchvision.
    torch_args=(--isolated --cert "$ca" --quiet)
    [[ -n "$index" ]] && torch_args+=(--index-url "$index")
    say "installing torch==$TORCH_VERSION torchvision==$TORCHVISION_VERSION${index:+ from $index}"
    "$py" -m pip install "${torch_args[@]}" "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"
    "$py" -m pip install --quiet setuptools wheel
    "$py" -m pip install --quiet -e "$repo[train,test]"
    PYTHON="$py" bash "$here/install-horovod.sh"
    "$py" -c "import torch, torchvision, horovod.torch, lab, envcheck"
    touch "$env/.complete"
fi

# The kit itself is installed editable from this checkout every time (no dependencies
# change here, so this takes seconds).
"$env/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e "$repo"
if [[ "$env" != "$dest" ]]; then
    rm -rf "$dest"
    ln -s "$env" "$dest"
fi
say "ready: $dest ($("$dest/bin/python" -c 'import torch, horovod; print("torch", torch.__version__, "horovod", horovod.__version__)'))"
