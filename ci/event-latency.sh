#!/usr/bin/env bash
# event-latency.sh - completions by events on the sim, against the host's own blocking
# wake-up, in one sitting: a blocking pipe round trip between two processes
# (bench/pipe-pingpong.c), `ib_send_lat -e` (typical), qperf `rc_lat` (events, qperf's
# default), `ibv_rc_pingpong -e` against `ibv_rc_pingpong` (polling), and, for
# reference, the polling latencies (`ib_send_lat` without -e, qperf `-cp1`). Unmodified
# programs, through backend-sim/cabi (LD_PRELOAD), both ends on loopback.
#
#   ci/event-latency.sh [OUT_DIR]
#
# Targets: `ib_send_lat -e` typical and qperf `rc_lat` within 4 x the pipe round trip;
# `ibv_rc_pingpong -e` within 20% of its polling bandwidth. Each round runs every row
# once, a pipe measurement before and after it; the round's yardstick is the lower of
# the two (a pipe whose processes the scheduler places on two CPUs, one of them busy,
# takes 30-40 us on a 2-core host for a reason of placement, not of wake-up cost). A
# row's ratio is the median over the rounds of each round's ratio, its spread the
# lowest and highest. With `perf` able to count tracepoints, also the system calls and
# context switches per `ib_send_lat -e` iteration at each end (the difference of a long
# and a short run), which do not depend on the host's load. Prints a table and writes
# OUT_DIR/event-latency.md and .json (OUT_DIR defaults to ci-out; `docs/bench` keeps
# the last sitting); never fails on the figures, only when a program does not run.
#
# Environment: ROUNDS (default 5), LAT_ITERS (ib_send_lat iterations, default 1000,
# perftest's), QPERF_TIME (seconds per qperf test, default 2), PINGPONG_ITERS
# (ibv_rc_pingpong iterations, default 1000, its own), PORT (first port, default 19300).
. "$(dirname "$0")/lib.sh"
out_dir "${1:-}"
need event-latency "apt-get install perftest qperf ibverbs-utils gcc" ib_send_lat qperf ibv_rc_pingpong cc
rounds=${ROUNDS:-5}
lat_iters=${LAT_ITERS:-1000}
qperf_time=${QPERF_TIME:-2}
pp_iters=${PINGPONG_ITERS:-1000}
port=${PORT:-19300}

cargo build --release --manifest-path "$root/Cargo.toml" -p backend-sim-cabi
lib=$target/release/libibverbs_sim.so
scratch_dir
cc -O2 -Wall -o "$work/pipe-pingpong" "$root/bench/pipe-pingpong.c"
export RDMA_SIM_DEVICES=1
sim() { env LD_PRELOAD="$lib" "$@"; }

fail() { echo "event-latency: $*" >&2; exit 1; }
# Each program below runs in a command substitution (a subshell): the caller picks its
# port ($2), counting up, so that no two runs share one.
# ib_send_lat's typical latency (us), both ends on loopback; $1: extra flags ("" or -e).
send_lat() {
    local port=$2
    # shellcheck disable=SC2086
    sim timeout 60 ib_send_lat $1 -n "$lat_iters" -p $port >"$work/server" 2>&1 &
    wait_listen $port || fail "ib_send_lat server did not listen"
    # shellcheck disable=SC2086
    sim timeout 60 ib_send_lat $1 -n "$lat_iters" -p $port 127.0.0.1 >"$work/client" 2>&1 || true
    wait || true
    awk '/#bytes/ { getline; print $5; exit }' "$work/client" | grep -E '^[0-9.]+$' ||
        fail "ib_send_lat $1 gave no figure: $(cat "$work/client" "$work/server")"
}
# qperf rc_lat's latency (us); $1: extra flags ("" or -cp1).
rc_lat() {
    local port=$2
    sim timeout 60 qperf -lp $port >"$work/server" 2>&1 &
    local spid=$!
    wait_listen $port || fail "qperf did not listen"
    # shellcheck disable=SC2086
    sim timeout 60 qperf -lp $port -t "$qperf_time" $1 127.0.0.1 rc_lat >"$work/client" 2>&1 || true
    kill $spid 2>/dev/null || true
    wait || true
    awk '/latency/ { v = $3; if ($4 == "ms") v *= 1000; else if ($4 == "ns") v /= 1000;
                     else if ($4 == "sec") v *= 1000000; print v; exit }' "$work/client" |
        grep -E '^[0-9.]+$' || fail "qperf rc_lat $1 gave no figure: $(cat "$work/client")"
}
# ibv_rc_pingpong's bandwidth (Mbit/s); $1: extra flags ("" or -e).
pingpong() {
    local port=$2
    # shellcheck disable=SC2086
    sim timeout 60 ibv_rc_pingpong -d sim0 -g 0 -n "$pp_iters" -p $port $1 >"$work/server" 2>&1 &
    wait_listen $port || fail "ibv_rc_pingpong server did not listen"
    # shellcheck disable=SC2086
    sim timeout 60 ibv_rc_pingpong -d sim0 -g 0 -n "$pp_iters" -p $port $1 127.0.0.1 >"$work/client" 2>&1 || true
    wait || true
    awk '/Mbit\/sec/ { print $(NF - 1); exit }' "$work/client" | grep -E '^[0-9.]+$' ||
        fail "ibv_rc_pingpong $1 gave no figure: $(cat "$work/client" "$work/server")"
}
pipe_rt() { "$work/pipe-pingpong" 5000; }
load() { cut -d' ' -f1 /proc/loadavg; }

load_start=$(load)
for r in $(seq "$rounds"); do
    p0=$(pipe_rt)
    e=$(send_lat -e $((port + 1)))
    s=$(send_lat "" $((port + 2)))
    q=$(rc_lat "" $((port + 3)))
    qp=$(rc_lat -cp1 $((port + 4)))
    ppe=$(pingpong -e $((port + 5)))
    pp=$(pingpong "" $((port + 6)))
    port=$((port + 6))
    p1=$(pipe_rt)
    pipe=$(awk -v a="$p0" -v b="$p1" 'BEGIN { printf "%.2f", a < b ? a : b }')
    echo "$r $pipe $e $s $q $qp $ppe $pp" >>"$work/rounds"
    echo "round $r: pipe $pipe us (before $p0, after $p1); ib_send_lat -e $e us, polling $s us;" \
        "qperf rc_lat $q us, -cp1 $qp us; ibv_rc_pingpong -e $ppe Mbit/s, polling $pp Mbit/s" >&2
done
load_end=$(load)

# System calls and context switches per ib_send_lat -e iteration at each end.
counts=""
if command -v perf >/dev/null && perf stat -e raw_syscalls:sys_enter true >/dev/null 2>&1; then
    count_run() { # iterations tag
        port=$((port + 1))
        sim timeout 120 perf stat -x, -e raw_syscalls:sys_enter,context-switches -o "$work/$2.server" \
            ib_send_lat -e -n "$1" -p $port >/dev/null 2>&1 &
        wait_listen $port || fail "ib_send_lat server did not listen"
        sim timeout 120 perf stat -x, -e raw_syscalls:sys_enter,context-switches -o "$work/$2.client" \
            ib_send_lat -e -n "$1" -p $port 127.0.0.1 >/dev/null 2>&1 || true
        wait || true
    }
    count_run 1000 short
    count_run 11000 long
    per() { # end event
        awk -F, -v ev="$2" '$3 == ev { print $1 }' "$work/short.$1" "$work/long.$1" |
            awk 'NR == 1 { a = $1 } NR == 2 { printf "%.2f", ($1 - a) / 10000 }'
    }
    counts="$(per client raw_syscalls:sys_enter) $(per client context-switches) $(per server raw_syscalls:sys_enter) $(per server context-switches)"
fi

awk -v rounds="$rounds" -v load_start="$load_start" -v load_end="$load_end" -v counts="$counts" -v cpus="$(nproc)" \
    -v json="$out/event-latency.json" "$awk_median"'
function stats(name, col, ratio_of, target, kind,    i, v, r, lo, hi, m, mr, ok) {
    lo = 1e18; hi = -1
    for (i = 1; i <= n; i++) {
        v[i] = f[i, col]
        if (ratio_of) { r[i] = f[i, col] / f[i, ratio_of]; if (r[i] < lo) lo = r[i]; if (r[i] > hi) hi = r[i] }
    }
    m = median(v, n)
    if (!ratio_of) { printf "| %s | %.2f %s | | | |\n", name, m, unit[col]; return }
    mr = median(r, n)
    ok = kind == "lat" ? (mr <= target ? "yes" : "no") : (mr >= target ? "yes" : "no")
    printf "| %s | %.2f %s | %.2f | %.2f - %.2f | %s %s: %s |\n", name, m, unit[col], mr, lo, hi,
        kind == "lat" ? "<=" : ">=", target, ok
    jrows = jrows sprintf("%s{\"row\": \"%s\", \"median\": %.3f, \"unit\": \"%s\", \"ratio\": %.3f, \"ratio_min\": %.3f, \"ratio_max\": %.3f, \"target\": %s, \"within\": %s}",
        jrows == "" ? "" : ", ", name, m, unit[col], mr, lo, hi, target, ok == "yes" ? "true" : "false")
}
{ n++; for (c = 2; c <= NF; c++) f[n, c] = $c }
END {
    unit[2] = "us"; unit[3] = "us"; unit[4] = "us"; unit[5] = "us"; unit[6] = "us"; unit[7] = "Mbit/s"; unit[8] = "Mbit/s"
    printf "Completion events on the sim: %d rounds on %d CPUs, load average %s at the start and %s at the end.\n\n", rounds, cpus, load_start, load_end
    print "| row | median | ratio (median) | ratio (lowest - highest round) | target |"
    print "|---|---|---|---|---|"
    stats("pipe round trip (yardstick)", 2, 0)
    stats("ib_send_lat -e typical / pipe round trip", 3, 2, 4, "lat")
    stats("qperf rc_lat (events) / pipe round trip", 5, 2, 4, "lat")
    stats("ibv_rc_pingpong -e / polling (bandwidth)", 7, 8, 0.8, "bw")
    stats("ib_send_lat typical (polling)", 4, 0)
    stats("qperf rc_lat -cp1 (polling)", 6, 0)
    stats("ibv_rc_pingpong (polling)", 8, 0)
    if (counts != "") {
        split(counts, k, " ")
        printf "\nPer `ib_send_lat -e` iteration (a round trip; 11000 less 1000 iterations): client %s system calls and %s context switches, server %s and %s.\n", k[1], k[2], k[3], k[4]
    }
    printf "{\"rounds\": %d, \"load_start\": %s, \"load_end\": %s, \"rows\": [%s]", rounds, load_start, load_end, jrows > json
    if (counts != "") printf ", \"per_iteration\": {\"client_syscalls\": %s, \"client_context_switches\": %s, \"server_syscalls\": %s, \"server_context_switches\": %s}", k[1], k[2], k[3], k[4] > json
    printf ", \"raw\": [" > json
    for (i = 1; i <= n; i++) printf "%s[%s, %s, %s, %s, %s, %s, %s]", (i > 1 ? ", " : ""), f[i, 2], f[i, 3], f[i, 4], f[i, 5], f[i, 6], f[i, 7], f[i, 8] > json
    print "], \"raw_columns\": [\"pipe_us\", \"send_lat_e_us\", \"send_lat_us\", \"rc_lat_e_us\", \"rc_lat_cp1_us\", \"rc_pingpong_e_mbps\", \"rc_pingpong_mbps\"]}" > json
}' "$work/rounds" | tee "$out/event-latency.md"
