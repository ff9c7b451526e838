#!/usr/bin/env bash
# ibv-smoke.sh - build backend-ibverbs' smoke test on the host and run it in the Soft-RoCE
# VM of ci/rxe-vm.sh (rxe0, GID index 1). Extra arguments go to ibv_smoke
# ([DEVICE [GID_INDEX]]). Exit status: ibv_smoke's (99 if the VM gave none).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
case $target in /*) ;; *) target=$root/$target ;; esac
cargo build --release --manifest-path "$root/Cargo.toml" -p backend-ibverbs --example ibv_smoke
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cp "$target/release/examples/ibv_smoke" "$dir/"
"$root/ci/rxe-vm.sh" run "$dir" ./ibv_smoke "$@"
