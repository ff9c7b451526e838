#!/usr/bin/env bash
# perftest-vs-perf.sh - perftest's ib_* programs against `perf --perftest --backend
# ibverbs` on the same device: rxe0 in the Soft-RoCE VM of ci/rxe-vm.sh, booted once.
# Each row (test and size) runs PAIRS alternating pairs, the order inside a pair
# swapped every time (perftest first, then perf first, ...), each tool as server and
# client on rxe0. The host then prints, per row, the medians and the median of
# perf / perftest over the pairs (target: within 5%); it does not fail on the figures
# (benchmarks do not gate CI on noise), only when a perf run fails or the VM gives no
# status.
#
#   ci/perftest-vs-perf.sh [OUT_DIR]
#
# Writes OUT_DIR/perftest-vs-perf.md and OUT_DIR/perftest-vs-perf.json (OUT_DIR defaults
# to ci-out), and every run's output to RUNS (default OUT_DIR/perftest-vs-perf-runs).
#
# Both tools run with perftest's defaults but one: the QP's ACK timeout is -u 10 (4 ms)
# instead of 14 (67 ms). rxe in this VM loses a few packets in every run of thousands of
# messages, each loss stalls the sender for one ACK timeout, and with 67 ms two or three
# such stalls make up half of a bandwidth row: the row would measure how many packets
# rxe lost, not the tools.
#
# Environment: PAIRS (default 5); SIZES (default "8 65536": which message sizes get rows;
# atomics are 8 B whatever it says); LAT_ITERS (default 1000; 64 KiB rows 200);
# BW_ITERS (default 5000; 64 KiB rows 500): under emulation a 64 KiB message takes
# about a millisecond, and perftest's defaults would make one pair take a minute.
. "$(dirname "$0")/lib.sh"
out_dir "${1:-}"
pairs=${PAIRS:-5}
sizes=${SIZES:-8 65536}
lat_iters=${LAT_ITERS:-1000}
bw_iters=${BW_ITERS:-5000}

cargo build --release --manifest-path "$root/Cargo.toml" -p examples --features ibverbs \
    --bin perf --bin perftest-vs-perf
scratch_dir
cp "$target/release/perf" "$work/"
mkdir "$work/runs"

# The rows: test size iterations
# Large messages take about a millisecond each under emulation: fewer iterations.
iters() { # base divisor size
    if [ "$3" -ge 65536 ]; then echo $(($1 / $2)); else echo "$1"; fi
}
rows=""
for t in send_lat write_lat read_lat; do
    for s in $sizes; do rows="$rows $t:$s:$(iters "$lat_iters" 5 "$s")"; done
done
rows="$rows atomic_lat:8:$lat_iters"
for t in send_bw write_bw read_bw; do
    for s in $sizes; do rows="$rows $t:$s:$(iters "$bw_iters" 10 "$s")"; done
done

# The guest runs the pairs (ci/perftest-pairs.sh, busybox ash) on rxe0; perf starts its
# own server child on loopback.
cp "$root/ci/perftest-pairs.sh" "$work/"
cat >"$work/bench.sh" <<GUEST
#!/bin/sh
ROWS="$rows" PAIRS=$pairs PERFTEST_ENV="" PERFTEST_FLAGS="-d rxe0 -x 1 -F -u 10" \
    PERF=./perf PERF_FLAGS="--backend ibverbs -d rxe0 -x 1 -u 10" exec sh perftest-pairs.sh
GUEST

set +e
RXEVM_TIMEOUT=${RXEVM_TIMEOUT:-1800} "$root/ci/rxe-vm.sh" run "$work" sh bench.sh
rc=$?
set -e
runs=${RUNS:-$out/perftest-vs-perf-runs}
rm -rf "$runs"
cp -r "$work/runs" "$runs"
"$target/release/perftest-vs-perf" "$runs" --json "$out/perftest-vs-perf.json" |
    tee "$out/perftest-vs-perf.md"
echo "perftest vs perf on rxe0: exit status $rc (the figures do not count)" >&2
exit $rc
