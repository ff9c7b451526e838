#!/usr/bin/env bash
# rdmacm-bench.sh - rdma_cm on the sim against the host, in one sitting: cmtime's setup
# and teardown of N connections (every step: create id, resolve address and route,
# create QP, connect, disconnect, destroy) against TCP connect/accept and teardown of
# the same count between two processes (bench/tcp-connect.c, which opens all before it
# ends any, as cmtime does); and rsockets' rstream bandwidth against ib_send_bw at the
# same message size and count, both on the sim. Unmodified programs through the
# launcher (rdma-sim), both ends on loopback.
#
#   ci/rdmacm-bench.sh [OUT_DIR]
#
# Targets: cmtime at least 2000 connections/s and within 5 x TCP's time; rstream
# within 20% of ib_send_bw. Each round runs every row once; a figure is the median
# over the rounds, with the lowest and highest. Beside the two programs each round
# runs bench/stream-copies.c (no target; SIZE up to 256 KiB): their data movement over
# a unix socket pair with no HCA work at all, ib_send_bw's (the socket's copies) and
# rstream's (rsockets' ring copies too), whose ratio is what rstream / ib_send_bw comes
# to on an HCA whose data path is such a socket on the programs' CPUs and costs nothing
# else (docs/performance.md). Prints a table and writes OUT_DIR/rdmacm.md and .json (OUT_DIR defaults to ci-out; `docs/bench` keeps the last
# sitting); never fails on the figures, only when a program does not run.
#
# Environment: ROUNDS (default 3), CONNECTIONS (default 1000), SIZE (bytes per
# message, default 65536), COUNT (messages, default 20000), PORT (first port, default
# 19400), RDMA_SIM (a launcher to use instead of building one).
. "$(dirname "$0")/lib.sh"
out_dir "${1:-}"
need rdmacm-bench "apt-get install rdmacm-utils perftest gcc" cmtime rstream ib_send_bw cc
rounds=${ROUNDS:-3}
conns=${CONNECTIONS:-1000}
size=${SIZE:-65536}
count=${COUNT:-20000}
port=${PORT:-19400}

if [ -n "${RDMA_SIM:-}" ]; then
    launcher=$RDMA_SIM
else
    cargo build --release --manifest-path "$root/Cargo.toml" -p backend-sim-cabi
    launcher=$target/release/rdma-sim
fi
unset RDMA_SIM_LIB LD_PRELOAD RDMA_SIM_DEVICES RDMA_SIM_LISTEN RDMA_SIM_PROFILE
scratch_dir
cc -O2 -Wall -o "$work/tcp-connect" "$root/bench/tcp-connect.c"
cc -O2 -Wall -o "$work/stream-copies" "$root/bench/stream-copies.c"
# The socket model follows rsockets' rings of 512 KiB: messages up to half of one.
model=0
[ "$size" -gt 262144 ] || model=1
sim() { timeout 120 "$launcher" -- "$@"; }

# A server in the background on $port, then the client; the client's output.
# pair SERVER... ::: CLIENT... (@PORT@ in either is the port)
pair() {
    local srv=() cli=() seen=0 a
    for a in "$@"; do
        [ "$a" != ":::" ] || { seen=1; continue; }
        a=${a//@PORT@/$port}
        if [ "$seen" = 0 ]; then srv+=("$a"); else cli+=("$a"); fi
    done
    "${srv[@]}" >"$work/server.log" 2>&1 &
    local pid=$!
    wait_listen "$port" || { echo "rdmacm-bench: ${srv[*]} does not listen" >&2; cat "$work/server.log" >&2; exit 1; }
    "${cli[@]}" || { echo "rdmacm-bench: ${cli[*]} failed" >&2; cat "$work/server.log" >&2; exit 1; }
    # cmtime's server serves for ever; the others end with their client.
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

# cmtime's steps summed: the milliseconds of setup and teardown of all connections.
cmtime_ms() { awk -F: '/^(create id|resolve addr|resolve route|create qp|connect|disconnect|destroy) *:/ {split($2, a, " "); t += a[1]; n++} END {if (n != 7) exit 1; printf "%.2f\n", t}'; }
tcp_ms() { awk '/connections:/ {print $3}'; }
rstream_gbps() { awk '/^custom/ {print $7}'; }
send_bw_gbps() { awk '/^ *[0-9]+ +[0-9]+ / {v = $4} END {if (v == "") exit 1; print v}'; }

declare -A fig
for r in $(seq "$rounds"); do
    port=$((port + 1))
    fig[cm,$r]=$(pair sim cmtime -b 127.0.0.1 -p @PORT@ -c "$conns" ::: sim cmtime -s 127.0.0.1 -p @PORT@ -c "$conns" | cmtime_ms)
    port=$((port + 1))
    fig[tcp,$r]=$(pair "$work/tcp-connect" -s @PORT@ "$conns" ::: "$work/tcp-connect" 127.0.0.1 @PORT@ "$conns" | tcp_ms)
    port=$((port + 1))
    fig[rs,$r]=$(pair sim rstream -p @PORT@ -S "$size" -C "$count" ::: sim rstream -s 127.0.0.1 -p @PORT@ -S "$size" -C "$count" | rstream_gbps)
    port=$((port + 1))
    fig[ib,$r]=$(pair sim ib_send_bw -p @PORT@ -s "$size" -n "$count" --report_gbits ::: sim ib_send_bw -p @PORT@ -s "$size" -n "$count" --report_gbits 127.0.0.1 | send_bw_gbps)
    said=
    if [ "$model" = 1 ]; then
        fig[ms,$r]=$("$work/stream-copies" send "$size" "$count" | awk '{print $2}')
        fig[mr,$r]=$("$work/stream-copies" rs "$size" "$count" | awk '{print $2}')
        said="; socket model: rstream's copies ${fig[mr,$r]} Gb/s, ib_send_bw's ${fig[ms,$r]} Gb/s"
    fi
    echo "round $r: cmtime ${fig[cm,$r]} ms, tcp ${fig[tcp,$r]} ms, rstream ${fig[rs,$r]} Gb/s, ib_send_bw ${fig[ib,$r]} Gb/s$said"
done

# median, lowest, highest of the rounds' values of KEY (or of an awk expression of
# the rounds' figures, for ratios).
stats() { # EXPR: awk expression over c (cmtime ms), t (tcp ms), s (rstream), b (ib_send_bw), ms and mr (the socket model's send and rs)
    local r
    for r in $(seq "$rounds"); do
        echo "${fig[cm,$r]} ${fig[tcp,$r]} ${fig[rs,$r]} ${fig[ib,$r]} ${fig[ms,$r]:-0} ${fig[mr,$r]:-0}"
    done | awk "{c=\$1; t=\$2; s=\$3; b=\$4; ms=\$5; mr=\$6; print $1}" | awk "$awk_median"'
function f(x) {return x >= 100 ? sprintf("%.0f", x) : sprintf("%.3g", x)}
{v[NR]=$1}
END {m = median(v, NR); print f(m), f(v[1]), f(v[NR])}'
}
read -r cm_rate cm_lo cm_hi < <(stats "$conns * 1000 / c")
read -r tcp_rate tcp_lo tcp_hi < <(stats "$conns * 1000 / t")
read -r cm_ratio cm_rlo cm_rhi < <(stats "c / t")
read -r rs_bw rs_lo rs_hi < <(stats "s")
read -r ib_bw ib_lo ib_hi < <(stats "b")
read -r bw_ratio bw_rlo bw_rhi < <(stats "s / b")
model_json=
if [ "$model" = 1 ]; then
    read -r ms_bw ms_lo ms_hi < <(stats "ms")
    read -r mr_bw mr_lo mr_hi < <(stats "mr")
    read -r m_ratio m_rlo m_rhi < <(stats "mr / ms")
    model_json=",
  \"socket_model_send_gbps\": {\"median\": $ms_bw, \"lowest\": $ms_lo, \"highest\": $ms_hi},
  \"socket_model_rs_gbps\": {\"median\": $mr_bw, \"lowest\": $mr_lo, \"highest\": $mr_hi},
  \"socket_model_rs_over_send\": {\"median\": $m_ratio, \"lowest\": $m_rlo, \"highest\": $m_rhi}"
fi
meets() { awk -v v="$1" -v op="$2" -v t="$3" 'BEGIN {ok = (op == ">=") ? v >= t : v <= t; print (ok ? "yes" : "no")}'; }
cpus=$(nproc)
load=$(cut -d' ' -f1 /proc/loadavg)

{
    echo "rdma_cm on the sim: $rounds rounds on $cpus CPUs, load average $load at the end; $conns connections, rstream and ib_send_bw at $size B x $count."
    echo
    echo "| row | median | lowest - highest | target |"
    echo "|---|---|---|---|"
    echo "| cmtime -c $conns, all steps (connections/s) | $cm_rate | $cm_lo - $cm_hi | >= 2000: $(meets "$cm_rate" ">=" 2000) |"
    echo "| TCP connect/accept and teardown (connections/s) | $tcp_rate | $tcp_lo - $tcp_hi | |"
    echo "| cmtime time / TCP time | $cm_ratio | $cm_rlo - $cm_rhi | <= 5: $(meets "$cm_ratio" "<=" 5) |"
    echo "| rstream (Gb/s) | $rs_bw | $rs_lo - $rs_hi | |"
    echo "| ib_send_bw (Gb/s) | $ib_bw | $ib_lo - $ib_hi | |"
    echo "| rstream / ib_send_bw | $bw_ratio | $bw_rlo - $bw_rhi | >= 0.8: $(meets "$bw_ratio" ">=" 0.8) |"
    if [ "$model" = 1 ]; then
        echo "| socket model, ib_send_bw's copies (Gb/s) | $ms_bw | $ms_lo - $ms_hi | |"
        echo "| socket model, rstream's copies (Gb/s) | $mr_bw | $mr_lo - $mr_hi | |"
        echo "| socket model, rstream's / ib_send_bw's (no HCA work) | $m_ratio | $m_rlo - $m_rhi | |"
    fi
} | tee "$out/rdmacm.md"
cat >"$out/rdmacm.json" <<EOF
{
  "rounds": $rounds, "cpus": $cpus, "load_average": $load,
  "connections": $conns, "size": $size, "count": $count,
  "cmtime_per_s": {"median": $cm_rate, "lowest": $cm_lo, "highest": $cm_hi},
  "tcp_per_s": {"median": $tcp_rate, "lowest": $tcp_lo, "highest": $tcp_hi},
  "cmtime_over_tcp_time": {"median": $cm_ratio, "lowest": $cm_rlo, "highest": $cm_rhi},
  "rstream_gbps": {"median": $rs_bw, "lowest": $rs_lo, "highest": $rs_hi},
  "ib_send_bw_gbps": {"median": $ib_bw, "lowest": $ib_lo, "highest": $ib_hi},
  "rstream_over_ib_send_bw": {"median": $bw_ratio, "lowest": $bw_rlo, "highest": $bw_rhi}$model_json
}
EOF
