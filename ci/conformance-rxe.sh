#!/usr/bin/env bash
# conformance-rxe.sh - run the conformance suite on a real libibverbs device: build the
# runner with the ibverbs backend on the host, boot the Soft-RoCE VM of ci/rxe-vm.sh and
# run every case on rxe0 (GID index 1) there.
#
#   ci/conformance-rxe.sh [OUT_DIR] [RUNNER ARGS..]
#
# Writes OUT_DIR/rxe.json (the JSON report) and OUT_DIR/rxe.txt (the table); exits
# non-zero if any case failed (or the VM gave no status: 99). OUT_DIR defaults to ci-out.
. "$(dirname "$0")/lib.sh"
out_dir "${1:-}"
shift || true
cargo build --release --manifest-path "$root/Cargo.toml" -p conformance --features ibverbs --bin conformance
scratch_dir
cp "$target/release/conformance" "$work/"
# One run in the guest (its shell is busybox ash: keep the command simple) writes the JSON
# report; the host renders the table from it. RoCE sends a group's datagrams along the
# route to its IPv4 address, which the guest (no default route) lacks until this one is
# added; the port cases take the netdev down and up, which removes it again, and come
# after the mcast cases.
set +e
"$root/ci/rxe-vm.sh" run "$work" sh -c "ip route add 224.0.0.0/4 dev rxenet0; ./conformance --backend ibverbs --device rxe0 --gid-index 1 --timeout 30 --json $* > rxe.json"
rc=$?
set -e
if [ -s "$work/rxe.json" ]; then
    cp "$work/rxe.json" "$out/rxe.json"
    "$target/release/conformance" --render "$out/rxe.json" | tee "$out/rxe.txt"
fi
echo "conformance on rxe0: exit status $rc" >&2
exit $rc
