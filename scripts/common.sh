# Shared by the scripts in this folder: where the tree is and how to configure
# and build it. Sourced, not run.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
jobs=${CONVEYOR_JOBS:-2}
# Paths under the checkout are hashed relative to it, so a build in another
# clone (CI's) hits the objects this one cached. With -g, ccache also hashes
# the working directory (it lands in the debug info) unless told not to:
# without this, CI's clone missed every object a session had built.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}

# configure_and_build BUILD_DIR BUILD_TYPE [TARGET...]
configure_and_build() {
  local dir=$1 type=$2
  shift 2
  mkdir -p "$dir"
  local werror=OFF
  [ "${CI:-}" = "true" ] && werror=ON
  cmake -S "$root" -B "$dir" -G Ninja \
    -DCMAKE_BUILD_TYPE="$type" \
    -DCONVEYOR_CUDA="${CONVEYOR_CUDA:-AUTO}" \
    -DCONVEYOR_WERROR="$werror" >"$dir/configure.log" 2>&1 || {
    cat "$dir/configure.log" >&2
    return 1
  }
  grep -E '^-- Conveyor ' "$dir/configure.log" || true
  local targets=()
  for t in "$@"; do targets+=(--target "$t"); done
  cmake --build "$dir" -j "$jobs" "${targets[@]}"
}
