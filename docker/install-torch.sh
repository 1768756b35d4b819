#!/usr/bin/env bash
# Install torch (and torchvision) at the matrix's versions, plus the pinned build
# tools Horovod compiles with, into a Python environment. Used by the image and by
# setup-venv.sh. Versions given in the environment (the image's build arguments) win
# over docker/versions.env.
#
# Environment (all optional):
#   PYTHON            interpreter of the target environment (default python3)
#   WHEELHOUSE        a folder of wheels pip looks at first
#   TORCH_INDEX_URL   index for torch and torchvision
#   WITH_TORCHVISION  1: install torchvision too (default 0)
#   PIP_ISOLATED      1: ignore the machine's pip configuration and use PIP_CA_BUNDLE
#   PIP_CA_BUNDLE     CA bundle with PIP_ISOLATED (default Debian's)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=matrix.sh
source "$here/matrix.sh"
PYTHON="${PYTHON:-python3}"

args=(--quiet)
if [[ "${PIP_ISOLATED:-0}" == 1 ]]; then
    # The machine's configuration may name other torch wheels (a local CPU wheel,
    # say) that torchvision would not pair with.
    args+=(--isolated --cert "${PIP_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}")
fi
"$PYTHON" -m pip install "${args[@]}" "setuptools==$SETUPTOOLS_VERSION" "wheel==$WHEEL_VERSION"
[[ -n "${WHEELHOUSE:-}" ]] && args+=(--find-links "$WHEELHOUSE")
[[ -n "${TORCH_INDEX_URL:-}" ]] && args+=(--index-url "$TORCH_INDEX_URL")
pkgs=("torch==$TORCH_VERSION")
[[ "${WITH_TORCHVISION:-0}" == 1 ]] && pkgs+=("torchvision==$TORCHVISION_VERSION")
echo "install-torch: ${pkgs[*]}${TORCH_INDEX_URL:+ from $TORCH_INDEX_URL}${WHEELHOUSE:+ (wheelhouse $WHEELHOUSE first)}" >&2
"$PYTHON" -m pip install "${args[@]}" "${pkgs[@]}"
