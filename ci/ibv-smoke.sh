#!/usr/bin/env bash
# ibv-smoke.sh - build backend-ibverbs' smoke test on the host and run it in the Soft-RoCE
# VM of ci/rxe-vm.sh (rxe0, GID index 1). Extra arguments go to ibv_smoke
# ([DEVICE [GID_INDEX]]). Exit status: ibv_smoke's (99 if the VM gave none).
. "$(dirname "$0")/lib.sh"
cargo build --release --manifest-path "$root/Cargo.toml" -p backend-ibverbs --example ibv_smoke
scratch_dir
cp "$target/release/examples/ibv_smoke" "$work/"
"$root/ci/rxe-vm.sh" run "$work" ./ibv_smoke "$@"
