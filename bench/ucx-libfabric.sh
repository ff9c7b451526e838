#!/usr/bin/env bash
# The reference points, measured on this machine: UCX over TCP (ucx_perftest) and
# libfabric's tcp provider (fi_pingpong), on loopback, 8 B latency, UCX fetch-and-add and
# 1 MiB tag bandwidth. Run it next to perf-compare to compare in one sitting:
#
#   apt-get install ucx-utils libfabric-bin      # Debian bookworm: UCX 1.13.1, libfabric 1.17.0
#   cargo run --release -p examples --bin perf-compare && bench/ucx-libfabric.sh
#
# Prints one line per test. UCX's latency tests report half the round trip (like
# perf's send_lat); ucp_fadd is a whole fetch-and-add (like perf's atomic_lat);
# fi_pingpong's usec/xfer is one way.
set -euo pipefail
command -v ucx_perftest >/dev/null && command -v fi_pingpong >/dev/null || {
    echo "needs ucx_perftest and fi_pingpong: apt-get install ucx-utils libfabric-bin" >&2
    exit 2
}
port=$((20000 + RANDOM % 10000))
export UCX_TLS=tcp UCX_NET_DEVICES=lo

ucx() { # test size iterations
    port=$((port + 1))
    timeout 120 ucx_perftest -p "$port" >/dev/null 2>&1 &
    sleep 0.5
    timeout 120 ucx_perftest 127.0.0.1 -p "$port" -t "$1" -s "$2" -n "$3" 2>&1 |
        awk -v t="$1" -v s="$2" '/^Final/ {printf "ucx %-9s %8s B: p50 %s us, avg %s us, %s MB/s\n", t, s, $3, $4, $6}'
    wait
}

fabric() { # size iterations
    port=$((port + 1))
    timeout 120 fi_pingpong -p tcp -e msg -B "$port" -S "$1" -I "$2" >/dev/null 2>&1 &
    sleep 0.5
    timeout 120 fi_pingpong -p tcp -e msg -P "$port" -S "$1" -I "$2" 127.0.0.1 2>&1 |
        awk -v s="$1" '$1 == s {printf "libfabric fi_pingpong %8s B: %s us per transfer (one way), %s MB/s\n", s, $7, $6}'
    wait
}

ucx tag_lat 8 100000
ucx ucp_fadd 8 100000
ucx tag_bw 1048576 5000
fabric 8 100000
