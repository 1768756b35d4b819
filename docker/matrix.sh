# Sourced by the install scripts: every KEY=VALUE of versions.env becomes a shell
# variable unless the environment already sets it (the image's build arguments do),
# so a script reads the matrix on bare metal and its build arguments in an image.
# The image does not copy versions.env in before the slow steps, so that editing one
# line of it does not rebuild the steps that do not use that line.
_matrix="$(dirname "${BASH_SOURCE[0]}")/versions.env"
if [[ -f "$_matrix" ]]; then
    while IFS='=' read -r _k _v; do
        [[ "$_k" =~ ^[A-Z][A-Z0-9_]*$ ]] || continue
        [[ -n "${!_k:-}" ]] || printf -v "$_k" '%s' "$_v"
    done < "$_matrix"
fi
unset _matrix _k _v

# The matrix's compute capabilities (CUDA_<X>_<Y>_ARCHS, e.g. 75,80,90) for the CUDA
# toolkit whose nvcc is given; empty when the matrix has no entry for that release.
# CUDA_ARCHS, when set (the image's build argument), wins.
cuda_archs_for() {
    if [[ -n "${CUDA_ARCHS:-}" ]]; then printf '%s\n' "$CUDA_ARCHS"; return; fi
    local release var
    release="$("$1" --version | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1_\2/p')"
    var="CUDA_${release}_ARCHS"
    printf '%s\n' "${!var:-}"
}
