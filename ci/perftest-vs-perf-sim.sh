#!/usr/bin/env bash
# perftest-vs-perf-sim.sh - perftest's ib_* programs, unmodified, on the sim (through
# backend-sim/cabi, LD_PRELOAD) against `perf --perftest --backend sim`, on the host:
# the same tests, sizes, depths and inline settings (both tools' defaults), alternating
# pairs (ci/perftest-pairs.sh). Prints per row the medians and the median of
# perf / perftest over the pairs (target: within 10%); fails only when a perf run fails,
# never on the figures.
#
#   ci/perftest-vs-perf-sim.sh [OUT_DIR]
#
# Writes OUT_DIR/perftest-vs-perf-sim.md and .json (OUT_DIR defaults to ci-out), and the
# runs' output to OUT_DIR/perftest-vs-perf-sim-runs.
#
# Environment: PAIRS (default 21: the same tool's figure differs by 20 % and more from run
# to run on a small machine, and 11 pairs put a row's median ratio 10 % to either side
# from one sitting to the next); SIZES (default "8 65536"); LAT_ITERS (default 1000,
# perftest's default); BW_ITERS and BW_BYTES (a bandwidth row runs BW_ITERS iterations,
# default 50000, or as many as move BW_BYTES, default 8 MiB, whichever is more: a
# bandwidth figure is the steady state, and perftest's 5000 iterations last 2-10 ms on
# the sim, 50000 of 8 bytes about 30 ms, in which one scheduling stall of a few
# milliseconds on a small machine is a tenth of the run; 8 MiB of 8-byte messages, a
# million of them, last about half a second; above 20000 iterations both tools skip the
# peak and its per-message stamps, as perftest does).
. "$(dirname "$0")/lib.sh"
out_dir "${1:-}"
need perftest-vs-perf-sim "apt-get install perftest" ib_send_lat ib_write_bw

cargo build --release --manifest-path "$root/Cargo.toml" -p examples --bin perf --bin perftest-vs-perf
cargo build --release --manifest-path "$root/Cargo.toml" -p backend-sim-cabi

rows=""
for t in send_lat write_lat read_lat; do
    for s in ${SIZES:-8 65536}; do rows="$rows $t:$s:${LAT_ITERS:-1000}"; done
done
rows="$rows atomic_lat:8:${LAT_ITERS:-1000}"
for t in send_bw write_bw read_bw; do
    for s in ${SIZES:-8 65536}; do
        n=$((${BW_BYTES:-8388608} / s))
        [ "$n" -lt "${BW_ITERS:-50000}" ] && n=${BW_ITERS:-50000}
        rows="$rows $t:$s:$n"
    done
done

runs=$out/perftest-vs-perf-sim-runs
scratch_dir
mkdir "$work/runs"
set +e
(
    cd "$work" &&
        RDMA_SIM_DEVICES=1 ROWS="$rows" PAIRS=${PAIRS:-21} \
            PERFTEST_ENV="env LD_PRELOAD=$target/release/libibverbs_sim.so" PERFTEST_FLAGS="-F" \
            PERF="$target/release/perf" PERF_FLAGS="--backend sim" PORT=18800 \
            sh "$root/ci/perftest-pairs.sh"
)
rc=$?
set -e
rm -rf "$runs"
cp -r "$work/runs" "$runs"
"$target/release/perftest-vs-perf" "$runs" --tolerance 0.10 --target within --json "$out/perftest-vs-perf-sim.json" |
    tee "$out/perftest-vs-perf-sim.md"
echo "perftest vs perf on the sim: exit status $rc (the figures do not count)" >&2
exit $rc
