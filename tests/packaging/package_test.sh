#!/usr/bin/env bash
# The Debian packages as a user gets them: cpack packs the ALREADY BUILT
# tree given as $1 (no rebuild) into a scratch directory; dpkg-deb checks the
# control fields and the file list, lintian finds no errors, and the
# binaries, extracted into a staging root with dpkg-deb -x, run from there:
# --version, then a coordinator and a worker on loopback ports train a tiny
# job submitted with the staged conveyorctl. The worker finds the staged CUDA
# plugin (conveyor-cuda) relative to itself, not in the build tree.
# Usage: package_test.sh BUILD_DIR [CPACK]
# Exit 77 (skipped) when everything else passed but lintian is not installed
# (scripts/install-deps installs it).
set -u
build=${1:?usage: package_test.sh BUILD_DIR [CPACK]}
cpack=${2:-cpack}
source "$(dirname "$0")/../integration/daemon_test_lib.sh"
# Nothing from the build tree or the caller may point the daemons elsewhere.
unset CONVEYOR_CUDA_PLUGIN CONVEYOR_COORDINATOR CONVEYOR_AUTH_TOKEN_FILE \
  CONVEYOR_BIN_DIR LD_LIBRARY_PATH

for tool in dpkg-deb dpkg readelf ldd; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool is not installed"; exit 77; }
done
if [ ! -f "$build/CPackConfig.cmake" ]; then
  echo "FAILED: $build/CPackConfig.cmake is missing: not a configured Conveyor build tree"
  exit 1
fi
# CPack installs what the build made and fails, naming the file, on anything
# missing; say which targets to build instead.
missing=()
for f in bin/conveyor-coordinator bin/conveyor-worker bin/conveyorctl \
  completion/conveyorctl completion/_conveyorctl packaging/changelog.Debian.gz; do
  [ -s "$build/$f" ] || missing+=("$f")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "FAILED: not built: ${missing[*]} (build the default target, or" \
    "conveyor-coordinator conveyor-worker conveyorctl conveyor_completion" \
    "conveyor_package_metadata and, with CUDA, conveyor_cuda_plugin)"
  exit 1
fi
cuda_built=no
[ -f "$build/bin/libconveyor_cuda.so" ] && cuda_built=yes

version=$(sed -n 's/^set(CPACK_PACKAGE_VERSION "\(.*\)")$/\1/p' "$build/CPackConfig.cmake")
revision=$(sed -n 's/^set(CPACK_DEBIAN_PACKAGE_RELEASE "\(.*\)")$/\1/p' "$build/CPackConfig.cmake")
arch=$(dpkg --print-architecture)
check "the version is known" test -n "$version" -a -n "$revision"

# --- Packing --------------------------------------------------------------

(cd "$dir" && "$cpack" --config "$build/CPackConfig.cmake" -G DEB -B "$dir/pkg") \
  >"$dir/cpack.log" 2>&1
status=$?
check "cpack succeeds" test $status -eq 0
[ $status -eq 0 ] || { cat "$dir/cpack.log"; finish; exit 1; }
main=$dir/pkg/conveyor_${version}-${revision}_${arch}.deb
cuda=$dir/pkg/conveyor-cuda_${version}-${revision}_${arch}.deb
check "conveyor_${version}-${revision}_${arch}.deb is made" test -s "$main"
[ -s "$main" ] || { ls -l "$dir/pkg"; finish; exit 1; }
if [ $cuda_built = yes ]; then
  check "the CUDA plugin is in conveyor-cuda" test -s "$cuda"
else
  check "no conveyor-cuda without the CUDA parts" test ! -e "$cuda"
fi

# --- Control fields ----------------------------------------------------------

control() {  # control DEB FIELD
  dpkg-deb -f "$1" "$2"
}
depends=$(control "$main" Depends)
echo "conveyor Depends: $depends"
check "Package: conveyor" test "$(control "$main" Package)" = conveyor
check "Version: $version-$revision" test "$(control "$main" Version)" = "$version-$revision"
check "Architecture: $arch" test "$(control "$main" Architecture)" = "$arch"
check "a Maintainer with an address" grep -Eq '^.+ <[^ ]+@[^ ]+>$' <<<"$(control "$main" Maintainer)"
check "Section and Priority" test -n "$(control "$main" Section)" -a -n "$(control "$main" Priority)"
check "a Description with a long part" test "$(control "$main" Description | wc -l)" -ge 3
# dpkg-shlibdeps found the libraries the binaries link ...
for lib in libc6 'libstdc\+\+6' 'libgrpc\+\+1' libprotobuf32 libspdlog libopenblas \
  libprometheus-cpp-core libyaml-cpp; do
  check "Depends names $lib" grep -Eq "(^|, )${lib}" <<<"$depends"
done
# ... and nothing of CUDA, so conveyor installs on a machine without it.
check "Depends names no CUDA library" \
  bash -c "! grep -Eiq 'cuda|cublas|nccl|nvidia' <<<'$depends'"
check "Depends has no build-tree path" bash -c "! grep -q / <<<'$depends'"

dpkg-deb -e "$main" "$dir/control"
check "conffiles: the three files in /etc/conveyor" \
  test "$(sort "$dir/control/conffiles" | tr '\n' ' ')" = \
  "/etc/conveyor/coordinator.env /etc/conveyor/coordinator.yaml /etc/conveyor/worker.env "
for script in postinst postrm; do
  check "$script is executable" test -x "$dir/control/$script"
  check "$script runs systemctl only where systemd runs" \
    grep -q '\[ -d /run/systemd/system \] && command -v systemctl' "$dir/control/$script"
  check "$script parses" sh -n "$dir/control/$script"
done
check "postinst runs systemd-sysusers only where it exists" \
  grep -q 'command -v systemd-sysusers' "$dir/control/postinst"

if [ $cuda_built = yes ]; then
  cuda_depends=$(control "$cuda" Depends)
  echo "conveyor-cuda Depends: $cuda_depends"
  check "conveyor-cuda depends on this exact conveyor" \
    grep -Eq "(^|, )conveyor \(= $version-$revision\)" <<<"$cuda_depends"
fi

# cmake --install under another prefix stays under it: the configuration
# once went to /etc/conveyor whatever the prefix (as root, silently).
DESTDIR="$dir/destdir" cmake --install "$build" --prefix "$dir/prefix" \
  --component runtime >"$dir/install.log" 2>&1
check "cmake --install --prefix P installs" test $? -eq 0
check "... the configuration under P/etc/conveyor" \
  test -f "$dir/destdir$dir/prefix/etc/conveyor/coordinator.env"
check "... and nothing outside P" test ! -e "$dir/destdir/etc"

# --- Files ---------------------------------------------------------------------

dpkg-deb -c "$main" | awk '{print $6}' | sed 's|^\./|/|' >"$dir/files"
has() {  # has PATH: the main package holds PATH
  grep -qx -- "$1" "$dir/files"
}
for f in /usr/bin/conveyor-coordinator /usr/bin/conveyor-worker /usr/bin/conveyorctl \
  /usr/lib/systemd/system/conveyor-coordinator.service \
  /usr/lib/systemd/system/conveyor-worker@.service \
  /usr/lib/sysusers.d/conveyor.conf \
  /etc/conveyor/coordinator.env /etc/conveyor/worker.env /etc/conveyor/coordinator.yaml \
  /usr/share/conveyor/grafana/dashboards/conveyor.json \
  /usr/share/conveyor/grafana/provisioning/dashboards/conveyor.yml \
  /usr/share/conveyor/grafana/provisioning/datasources/prometheus.yml \
  /usr/share/conveyor/prometheus/prometheus.yml \
  /usr/share/bash-completion/completions/conveyorctl \
  /usr/share/zsh/vendor-completions/_conveyorctl \
  /usr/share/doc/conveyor/copyright /usr/share/doc/conveyor/changelog.Debian.gz; do
  check "conveyor holds $f" has "$f"
done
# Every rule file in deploy/prometheus ships (by glob), its promtool tests
# do not.
source_dir=$(cd "$(dirname "$0")/../.." && pwd)
for f in "$source_dir"/deploy/prometheus/*.yml; do
  name=$(basename "$f")
  case "$name" in
    *_test.yml) check "conveyor leaves out $name" bash -c "! grep -qx /usr/share/conveyor/prometheus/$name '$dir/files'" ;;
    *) check "conveyor holds prometheus/$name" has "/usr/share/conveyor/prometheus/$name" ;;
  esac
done
check "conveyor holds nothing under /usr/local or the build tree" \
  bash -c "! grep -Eq '^/usr/local/|$build' '$dir/files'"
check "conveyor holds no CUDA plugin" bash -c "! grep -q libconveyor_cuda '$dir/files'"
if [ $cuda_built = yes ]; then
  plugin=$(dpkg-deb -c "$cuda" | awk '{print $6}' | sed 's|^\./|/|' | grep '/conveyor/libconveyor_cuda\.so$')
  check "conveyor-cuda holds the plugin in a lib dir of its own" \
    grep -Eq '^/usr/lib/([a-z0-9_-]+/)?conveyor/libconveyor_cuda\.so$' <<<"$plugin"
  check "conveyor-cuda has a copyright file" \
    bash -c "dpkg-deb -c '$cuda' | grep -q ' ./usr/share/doc/conveyor-cuda/copyright$'"
fi

# --- lintian ---------------------------------------------------------------------

have_lintian=yes
if command -v lintian >/dev/null; then
  # Errors (E:) fail; warnings are printed for whoever reads the log.
  debs=("$main")
  [ $cuda_built = yes ] && debs+=("$cuda")
  lintian --tag-display-limit 0 "${debs[@]}" >"$dir/lintian.out" 2>&1
  cat "$dir/lintian.out"
  check "lintian finds no errors" bash -c "! grep -q '^E:' '$dir/lintian.out'"
else
  have_lintian=no
fi

# --- The staged install ----------------------------------------------------------

root=$dir/root
dpkg-deb -x "$main" "$root"
bin=$root/usr/bin
for b in conveyor-coordinator conveyor-worker conveyorctl; do
  "$bin/$b" --version >"$dir/$b.version" 2>&1
  check "staged $b --version runs" test $? -eq 0
  check "staged $b --version says $version" grep -q " $version" "$dir/$b.version"
  check "staged $b is stripped" bash -c "! readelf -S '$bin/$b' | grep -q '\.debug_info'"
  check "staged $b has no RUNPATH into a build tree" \
    bash -c "! readelf -d '$bin/$b' | grep -Eq 'R(UN)?PATH'"
  check "staged $b finds all its libraries" bash -c "! ldd '$bin/$b' | grep -q 'not found'"
done
for unit in "$root"/usr/lib/systemd/system/*.service; do
  exe=$(sed -n 's/^ExecStart=.*\(\/usr\/bin\/conveyor-[a-z]*\).*/\1/p' "$unit" | head -1)
  [ -n "$exe" ] || exe=$(grep -o '/usr/bin/conveyor-[a-z]*' "$unit" | head -1)
  check "$(basename "$unit") runs a packaged binary ($exe)" \
    test -n "$exe" -a -x "$root$exe"
done
check "bash completion parses" bash -n "$root/usr/share/bash-completion/completions/conveyorctl"
check "bash completion defines _conveyorctl" \
  grep -q '^_conveyorctl()' "$root/usr/share/bash-completion/completions/conveyorctl"
check "zsh completion starts with #compdef conveyorctl" \
  test "$(head -1 "$root/usr/share/zsh/vendor-completions/_conveyorctl")" = "#compdef conveyorctl"
check "changelog is gzip -9" bash -c "gzip -t '$root/usr/share/doc/conveyor/changelog.Debian.gz'"
check "copyright is machine-readable" \
  grep -q '^Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/' \
  "$root/usr/share/doc/conveyor/copyright"

# The CUDA plugin is looked up relative to the staged worker. Without
# conveyor-cuda the error names where that package puts it; with it, the
# plugin file is found (the load may still fail for want of cuBLAS, NCCL or
# a GPU, but not for want of the plugin).
if [ $cuda_built = yes ]; then
  timeout -k 2 15 "$bin/conveyor-worker" --devices cuda:0 --coordinator 127.0.0.1:1 \
    >"$dir/no-plugin.log" 2>&1
  check "without conveyor-cuda a cuda worker exits 1" test $? -eq 1
  check "... naming the staged plugin path $plugin" \
    grep -qF "cannot load the CUDA plugin $root$plugin:" "$dir/no-plugin.log"
  dpkg-deb -x "$cuda" "$root"
  timeout -k 2 15 "$bin/conveyor-worker" --devices cuda:0 --coordinator 127.0.0.1:1 \
    >"$dir/plugin.log" 2>&1
  cat "$dir/plugin.log"
  check "with conveyor-cuda the worker finds the staged plugin" \
    bash -c "! grep -q 'libconveyor_cuda.so: cannot open shared object file' '$dir/plugin.log'"
fi

# A coordinator and a worker from the staging root train a one-stage job
# submitted with the staged conveyorctl.
ctl=$bin/conveyorctl
"$bin/conveyor-coordinator" --listen 127.0.0.1:0 --ready-file "$dir/ready" \
  --state-file "$dir/coordinator.state" >"$dir/coordinator.log" 2>&1 &
pids+=($!)
wait_for 20 test -s "$dir/ready"
address=$(head -1 "$dir/ready")
check "staged coordinator serves" test -n "$address"
"$bin/conveyor-worker" --coordinator "$address" --name staged \
  --data-address 127.0.0.1:0 >"$dir/worker.log" 2>&1 &
pids+=($!)
idle() { "$ctl" workers --coordinator "$address" 2>/dev/null | grep -q 'staged.*IDLE'; }
check "staged worker registers" wait_for 30 idle
cat >"$dir/job.yaml" <<'YAML'
name: packaged
model:
  input_shape: [8]
  init: {seed: 0}
  layers:
    - dense: {features: 8}
  loss: mse
data: {source: synthetic-regression, seed: 0}
training: {steps: 2, batch_size: 4, microbatches: 2}
optimizer: {kind: sgd, lr: 0.01}
pipeline: {schedule: 1f1b}
YAML
timeout 60 "$ctl" submit "$dir/job.yaml" --watch --coordinator "$address" \
  >"$dir/submit.out" 2>&1
status=$?
check "a job submitted with the staged conveyorctl succeeds" test $status -eq 0
check "... and is SUCCEEDED" grep -q SUCCEEDED "$dir/submit.out"
if [ $status -ne 0 ]; then
  cat "$dir/submit.out" "$dir/coordinator.log" "$dir/worker.log"
fi

finish || exit 1
if [ $have_lintian = no ]; then
  echo "SKIP: lintian is not installed (scripts/install-deps installs it)"
  exit 77
fi
