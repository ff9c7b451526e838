#!/usr/bin/env bash
# cabi-programs.sh - unmodified libibverbs programs on the sim: Debian's ibverbs-utils
# and perftest, each as server and client on loopback with libibverbs_sim.so preloaded
# (backend-sim/cabi), every run bounded by a timeout. Prints one row per program
# (command, result, the figure it reports) and exits non-zero if any program fails.
#
#   ci/cabi-programs.sh [OUT_DIR]
#
# Writes OUT_DIR/cabi-programs.md (OUT_DIR defaults to ci-out) and every run's output to
# OUT_DIR/cabi-programs-runs/. Needs the packages ibverbs-utils and perftest.
#
# Environment: TIMEOUT per run in seconds (default 120).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/ci-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
runs=$out/cabi-programs-runs
rm -rf "$runs"
mkdir -p "$runs"
target=${CARGO_TARGET_DIR:-$root/target}
case $target in /*) ;; *) target=$root/$target ;; esac
limit=${TIMEOUT:-120}

cargo build --release --manifest-path "$root/Cargo.toml" -p backend-sim-cabi
lib=$target/release/libibverbs_sim.so
test -f "$lib"

# Every program sees one sim device; RDMA_SIM_LISTEN is left to its default (loopback,
# a port below 0xC000, so that LIDs are unicast LIDs).
run() { env LD_PRELOAD="$lib" RDMA_SIM_DEVICES=1 timeout "$limit" "$@"; }

# Whether something listens on TCP port $1 (read from /proc: a probe connection would
# be the one connection a server accepts).
listening() {
    local hex
    hex=$(printf ':%04X' "$1")
    awk -v p="$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { found = 1 } END { exit !found }' \
        /proc/net/tcp /proc/net/tcp6
}

port=18900
failed=0
table="| command | result | figure |
|---|---|---|"

row() { table="$table
| \`$1\` | $2 | $3 |"; printf '%-58s %-6s %s\n' "$1" "$2" "$3"; }

# single NAME FIGURE_CMD -- PROGRAM ARGS...: one run.
single() {
    local name=$1 figure=$2
    shift 3
    local log=$runs/$name.log status=ok
    run "$@" >"$log" 2>&1 || status=FAIL
    [ "$status" = ok ] || failed=$((failed + 1))
    row "$*" "$status" "$(eval "$figure" <"$log" 2>/dev/null || true)"
}

# pair NAME FIGURE_CMD -- PROGRAM ARGS...: the program as server (with ARGS and -p PORT)
# and as client (the same plus 127.0.0.1); the figure is taken from the client's output.
pair() {
    local name=$1 figure=$2
    shift 3
    port=$((port + 1))
    local srv=$runs/$name.server.log cli=$runs/$name.client.log status=ok
    run "$@" -p "$port" >"$srv" 2>&1 &
    local pid=$!
    local waited=0
    until listening "$port"; do
        sleep 0.1
        waited=$((waited + 1))
        if [ "$waited" -gt $((limit * 10)) ] || ! kill -0 "$pid" 2>/dev/null; then
            break
        fi
    done
    run "$@" -p "$port" 127.0.0.1 >"$cli" 2>&1 || status=FAIL
    wait "$pid" || status=FAIL
    [ "$status" = ok ] || failed=$((failed + 1))
    row "$* -p $port [127.0.0.1]" "$status" "$(eval "$figure" <"$cli" 2>/dev/null || true)"
}

devices='awk "/^ *sim/ {n++} END {print n \" device(s)\"}"'
devinfo='awk "/port_lid/ {print \"port_lid \" \$2}"'
pingpong='grep "usec/iter" | sed "s/.*= //"'
lat='awk "/#bytes/ {getline; print \$1 \" B: typical \" \$5 \" us, average \" \$6 \" us\"}"'
bw='awk "/#bytes/ {getline; print \$1 \" B: average \" \$4 \" MB/s, \" \$5 \" Mpps\"}"'

single ibv_devices "$devices" -- ibv_devices
single ibv_devinfo "$devinfo" -- ibv_devinfo -v
pair ibv_rc_pingpong "$pingpong" -- ibv_rc_pingpong -c
pair ibv_rc_pingpong-gid "$pingpong" -- ibv_rc_pingpong -c -g 0
pair ibv_rc_pingpong-events "$pingpong" -- ibv_rc_pingpong -c -e
pair ibv_rc_pingpong-wr-api "$pingpong" -- ibv_rc_pingpong -c -N
pair ibv_uc_pingpong "$pingpong" -- ibv_uc_pingpong -c
pair ibv_srq_pingpong "$pingpong" -- ibv_srq_pingpong -c
pair ibv_ud_pingpong "$pingpong" -- ibv_ud_pingpong -c
for t in send write read; do
    pair "ib_${t}_lat" "$lat" -- "ib_${t}_lat"
    pair "ib_${t}_bw" "$bw" -- "ib_${t}_bw"
done
pair ib_atomic_lat "$lat" -- ib_atomic_lat
pair ib_atomic_bw "$bw" -- ib_atomic_bw
for t in send_lat send_bw write_lat write_bw; do
    case $t in *_lat) f=$lat ;; *) f=$bw ;; esac
    pair "ib_${t}-uc" "$f" -- "ib_$t" -c UC
done
pair ib_send_lat-ud "$lat" -- ib_send_lat -c UD
pair ib_send_bw-ud "$bw" -- ib_send_bw -c UD
pair ib_send_lat-srq "$lat" -- ib_send_lat --use-srq
pair ib_send_bw-srq "$bw" -- ib_send_bw --use-srq
# Under the mlx5 profile the device reports a ConnectX-5's vendor and part ids, and
# perftest takes its ConnectX paths: the ibv_wr_* API and inline data.
mlat='awk "/ibv_wr\* API/ {api=\$4} /#bytes/ {getline; fig=\$1 \" B: typical \" \$5 \" us\"} END {print fig \", ibv_wr* API \" api}"'
mbw='awk "/ibv_wr\* API/ {api=\$4} /#bytes/ {getline; fig=\$1 \" B: average \" \$4 \" MB/s\"} END {print fig \", ibv_wr* API \" api}"'
for t in send_lat send_bw write_lat write_bw read_lat read_bw atomic_lat atomic_bw; do
    case $t in *_lat) f=$mlat ;; *) f=$mbw ;; esac
    pair "ib_${t}-mlx5" "$f" -- env RDMA_SIM_PROFILE=mlx5 "ib_$t"
done

# Under the rxe profile the port is Ethernet (RoCE v2), LID 0, with rxe's GID table: GID 0
# the link-local default GID, GID 1 the device's IPv4 address; peers are found by GID.
gids='awk "/gid_tbl_len/ {n=\$2} /GID\[/ {g=g \" \" \$3} END {print \"gid_tbl_len \" n \",\" g}"'
single ibv_devinfo-rxe "$gids" -- env RDMA_SIM_PROFILE=rxe ibv_devinfo -v
for g in 0 1; do
    pair "ibv_rc_pingpong-rxe-gid$g" "$pingpong" -- env RDMA_SIM_PROFILE=rxe ibv_rc_pingpong -c -g "$g"
    pair "ibv_ud_pingpong-rxe-gid$g" "$pingpong" -- env RDMA_SIM_PROFILE=rxe ibv_ud_pingpong -c -g "$g"
done

printf '%s\n' "$table" >"$out/cabi-programs.md"
echo "cabi-programs: $failed failed; table in $out/cabi-programs.md, logs in $runs"
[ "$failed" -eq 0 ]
