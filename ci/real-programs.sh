#!/usr/bin/env bash
# real-programs.sh - programs written by others, unmodified, on the sim, run through the
# launcher as a user runs them (`rdma-sim [--profile P] -- PROGRAM ...`): ibverbs-utils,
# perftest (with its less common flags, and ib_write_bw -R: rdma_cm), qperf, UCX (ucx_info,
# ucx_perftest over rc_verbs and ud_verbs, UCT rows), Open MPI (the UCX PML and the
# openib BTL, 2 and 4 ranks), libfabric's verbs provider (rdm over rxd and rxm, msg),
# rdma-core's librdmacm programs (rping, ucmatose, udaddy, rdma_server/rdma_client,
# cmtime, mckey, rsockets' rstream and riostream, iperf through librspreload.so), and rdma-core's
# pyverbs tests. Every run is bounded
# by a timeout. One row per run: program, arguments, profile, result, the figure the
# program reports, and, where the program has an alternative on this machine that needs
# no sim (UCX over tcp and over shared memory, libfabric over tcp and shm, Open MPI over
# tcp and vader), the same figure over it. Exits non-zero if any row fails.
#
#   ci/real-programs.sh [OUT_DIR]
#
# Writes OUT_DIR/real-programs.md (the table) and every run's output to
# OUT_DIR/real-programs-runs/ (OUT_DIR defaults to ci-out). The launcher is installed
# with `cargo install --path backend-sim/cabi` into OUT_DIR/install, as a user would
# (that rdma-sim carries the library), unless RDMA_SIM names a launcher to use.
#
# Environment: TIMEOUT per run in seconds (default 120); ONLY, a regular expression:
# run only the rows whose name matches; ALTERNATIVES=0: no non-sim rows; PYVERBS_FLOOR
# (see below). Needs ibverbs-utils, perftest, qperf, ucx-utils, openmpi-bin,
# libopenmpi-dev, libfabric-bin, python3-pyverbs, rdmacm-utils, iperf.
. "$(dirname "$0")/lib.sh"
out_dir "${1:-}"
runs=$out/real-programs-runs
rm -rf "$runs"
mkdir -p "$runs"
limit=${TIMEOUT:-120}
# The conditions the figures were taken in: they follow the host's CPUs and its load.
load_start=$(cut -d' ' -f1 /proc/loadavg)
started=$(date +%s)
only=${ONLY:-.}
alternatives=${ALTERNATIVES:-1}

if [ -n "${RDMA_SIM:-}" ]; then
    launcher=$RDMA_SIM
else
    cargo install --quiet --locked --path "$root/backend-sim/cabi" --root "$out/install" --target-dir "$target" --force
    launcher=$out/install/bin/rdma-sim
fi
# The launcher alone: no library beside it, none named.
unset RDMA_SIM_LIB LD_PRELOAD RDMA_SIM_DEVICES RDMA_SIM_LISTEN RDMA_SIM_PROFILE
"$launcher" lib >/dev/null

# Whether something listens on TCP port $1 (read from /proc: a probe connection would
# be the one connection a server accepts).
listening() {
    local hex
    hex=$(printf ':%04X' "$1")
    awk -v p="$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { found = 1 } END { exit !found }' \
        /proc/net/tcp /proc/net/tcp6
}

# Waits (at most the timeout) until something listens on port $1 or process $2 ends.
await_listen() {
    local waited=0
    until listening "$1"; do
        sleep 0.1
        waited=$((waited + 1))
        if [ "$waited" -gt $((limit * 10)) ] || ! kill -0 "$2" 2>/dev/null; then
            return
        fi
    done
}

port=19700
failed=0
# The rows, rendered at the end: name, program, arguments, profile, result, figure, and
# the figures of the alternatives without the sim.
rows_prog=() rows_args=() rows_profile=() rows_result=() rows_figure=() rows_alt=()

row() { # NAME COMMAND... PROFILE RESULT FIGURE
    local name=$1 n=$#
    local profile=${*:n-2:1} result=${*:n-1:1} figure=${*:n:1}
    local cmd=("${@:2:n-4}") vars=() i=0
    # `env VAR=value... PROGRAM ARGS`: the program's name in its column, the variables
    # before its arguments.
    if [ "${cmd[0]}" = env ]; then
        i=1
        while [[ ${cmd[i]} == *=* ]]; do vars+=("${cmd[i]}"); i=$((i + 1)); done
    fi
    rows_prog+=("${cmd[i]}") rows_args+=("${vars[*]}${vars:+ }${cmd[*]:i+1}")
    rows_profile+=("$profile") rows_result+=("$result") rows_figure+=("$figure") rows_alt+=("")
    printf '%-34s %-8s %-5s %s\n' "$name" "$profile" "$result" "$figure"
}

# An alternative's figure, beside the last row's.
alt_figure() { # LABEL FIGURE
    local last=$((${#rows_alt[@]} - 1))
    rows_alt[last]="${rows_alt[last]:+${rows_alt[last]}; }$1: $2"
    printf '%-34s %-8s %-5s %s\n' "  without the sim: $1" "" "" "$2"
}

wanted() { [[ $1 =~ $only ]]; }

# sim NAME PROFILE FIGURE -- CMD... : one run of CMD on the sim.
sim() {
    local name=$1 profile=$2 figure=$3
    shift 4
    wanted "$name" || return 0
    local log=$runs/$name.log status=ok rc=0 why=()
    timeout "$limit" "$launcher" --profile "$profile" -- "$@" >"$log" 2>&1 || rc=$?
    [ "$rc" = 0 ] || { status=FAIL; why+=("$(exit_words "$rc")"); }
    local fig
    fig=$(eval "$figure" <"$log" 2>/dev/null || true)
    [ -n "$fig" ] || [ "$figure" = true ] || { status=FAIL; why+=("no figure in its output"); }
    [ "$status" = ok ] || failed=$((failed + 1))
    row "$name" "$@" "$profile" "$status" "$fig"
    [ "$status" = ok ] || fail_details "$name" "${why[*]}" "$log"
}

# pair NAME PROFILE FIGURE -- SERVER... [::: CLIENT...] : the server, then (once it
# listens on @PORT@) the client; without `:::` the client is the server's command with
# @HOST@ replaced by 127.0.0.1 (and dropped from the server's). The figure is read from
# the client's output. With PROFILE `none` both run without the sim.
pair() {
    local name=$1 profile=$2 figure=$3
    shift 4
    # An alternative belongs to the row before it, which was chosen.
    [ "$profile" = none ] || wanted "$name" || return 0
    port=$((port + 1))
    # PAIR_PORT: the port of a program that has no option for it.
    local at=${PAIR_PORT:-$port}
    local srv=() cli=() seen=0 a
    for a in "$@"; do
        if [ "$a" = ":::" ]; then seen=1; continue; fi
        a=${a//@PORT@/$at}
        if [ "$seen" = 0 ]; then
            [ "$a" = "@HOST@" ] || srv+=("$a")
        else
            cli+=("$a")
        fi
    done
    if [ "$seen" = 0 ]; then
        for a in "$@"; do
            a=${a//@PORT@/$at}
            cli+=("${a//@HOST@/127.0.0.1}")
        done
    fi
    local run=("$launcher" --profile "$profile" --)
    [ "$profile" != none ] || run=()
    # PAIR_PRELOAD: a library for both programs' LD_PRELOAD (the launcher puts the sim's
    # before it).
    [ -z "${PAIR_PRELOAD:-}" ] || run=(env LD_PRELOAD="$PAIR_PRELOAD" "${run[@]}")
    local slog=$runs/$name.server.log clog=$runs/$name.client.log status=ok
    timeout "$limit" "${run[@]}" "${srv[@]}" >"$slog" 2>&1 &
    local pid=$!
    await_listen "$at" "$pid"
    local rc=0 why=()
    timeout "$limit" "${run[@]}" "${cli[@]}" >"$clog" 2>&1 || rc=$?
    [ "$rc" = 0 ] || { status=FAIL; why+=("client $(exit_words "$rc")"); }
    # A server that serves one client exits by itself (given 5 s to); one that serves
    # for ever (PAIR_STAYS=1: qperf's) is stopped once its client is done.
    local grace=5
    [ -z "${PAIR_STAYS:-}" ] || grace=0
    if ! wait_for "$pid" "$grace"; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true;
    else
        rc=0
        wait "$pid" || rc=$?
        [ "$rc" = 0 ] || { status=FAIL; why+=("server $(exit_words "$rc")"); }
    fi
    # PAIR_RETRY: a failure the program causes itself (its output matches this), after
    # which the row runs again, three runs at most; the logs of each stay beside the
    # last run's (.run1, .run2).
    local run_no=${PAIR_RUN:-1}
    if [ "$status" = FAIL ] && [ -n "${PAIR_RETRY:-}" ] && [ "$run_no" -lt 3 ] && grep -q "$PAIR_RETRY" "$clog"; then
        mv "$slog" "$slog.run$run_no" && mv "$clog" "$clog.run$run_no"
        local PAIR_RUN=$((run_no + 1))
        pair "$name" "$profile" "$figure" -- "$@"
        return
    fi
    local fig
    fig=$(eval "$figure" <"$clog" 2>/dev/null || true)
    [ -n "$fig" ] || { status=FAIL; why+=("no figure in the client's output"); }
    [ -z "$fig" ] || [ "$run_no" = 1 ] || fig="$fig (run $run_no)"
    if [ "$profile" = none ]; then
        alt_figure "$name" "${fig:-failed}"
        return 0
    fi
    [ "$status" = ok ] || failed=$((failed + 1))
    row "$name" "${cli[@]}" "$profile" "$status" "$fig"
    [ "$status" = ok ] || fail_details "$name" "${why[*]}" "$slog" "$clog"
}

# How a program ended, from its exit status $1 (timeout's 124, a signal's 128+N).
exit_words() {
    case $1 in
        124) echo "timed out after ${limit} s" ;;
        12[5-7]) echo "could not be run (status $1)" ;;
        *) if [ "$1" -gt 128 ]; then echo "killed by signal $(kill -l "$1" 2>/dev/null || echo "$(($1 - 128))")"; else echo "exited with status $1"; fi ;;
    esac
}

# A failed row's reasons and the end of its logs, in the output itself: CI keeps the
# output, and a failure that does not repeat is diagnosed from it or not at all.
fail_details() { # NAME REASONS LOG...
    local name=$1 why=$2 log
    shift 2
    echo "  $name failed: ${why:-see the logs}"
    for log in "$@"; do
        [ -s "$log" ] || continue
        echo "  --- last lines of $(basename "$log")"
        tail -n 12 "$log" | sed 's/^/  | /'
    done
}

# Whether process $1 ends within $2 seconds.
wait_for() {
    local i
    for i in $(seq 0 $(($2 * 10))); do
        kill -0 "$1" 2>/dev/null || return 0
        sleep 0.1
    done
    return 1
}

# Figures.
devices='awk "/^ *sim/ {n++} END {if (n) print n \" device(s)\"}"'
pingpong='grep "usec/iter" | sed "s/.*= //"'
lat='awk "/#bytes/ {getline; fig=\$1 \" B: typical \" \$5 \" us\"} END {print fig}"'
latmax='awk "/#bytes/ {on=1; next} on && NF>5 && \$1+0>0 {if (\$4+0 > m) {m=\$4; at=\$1}; last=\$1 \" B: typical \" \$5 \" us\"} END {if (last) print last \", worst t_max \" m \" us at \" at \" B\"}"'
bw='awk "/#bytes/ {getline; fig=\$1 \" B: \" \$4 \" MB/s\"} END {print fig}"'
qperf='awk "/=/ {printf \"%s%s %s %s\", sep, \$1, \$3, \$4; sep=\", \"} END {if (sep) print \"\"}"'
ucx_lat='awk "/^Final:/ {print \"median \" \$3 \" us, average \" \$4 \" us\"}"'
ucx_bw='awk "/^Final:/ {print \$6 \" MB/s\"}"'
ucx_rate='awk "/^Final:/ {print \$8 \" msg/s, average \" \$4 \" us\"}"'
mpi='grep "^latency 8 B"'
fi_pp='awk "/^bytes/ {getline; print \$1 \" B: \" \$7 \" us/xfer\"}"'

# ---------------------------------------------------------------- ibverbs-utils, perftest
sim ibv_devices portable "$devices" -- ibv_devices
sim ibv_devinfo-rxe rxe 'awk "/link_layer/ {print \"link_layer \" \$2}"' -- ibv_devinfo -v
pair ibv_rc_pingpong portable "$pingpong" -- ibv_rc_pingpong -c -p @PORT@ @HOST@
pair ibv_rc_pingpong-gid portable "$pingpong" -- ibv_rc_pingpong -c -g 0 -p @PORT@ @HOST@
pair ibv_rc_pingpong-events portable "$pingpong" -- ibv_rc_pingpong -c -e -p @PORT@ @HOST@
pair ibv_rc_pingpong-wr-api portable "$pingpong" -- ibv_rc_pingpong -c -N -p @PORT@ @HOST@
pair ibv_uc_pingpong portable "$pingpong" -- ibv_uc_pingpong -c -p @PORT@ @HOST@
pair ibv_srq_pingpong portable "$pingpong" -- ibv_srq_pingpong -c -p @PORT@ @HOST@
pair ibv_ud_pingpong portable "$pingpong" -- ibv_ud_pingpong -c -p @PORT@ @HOST@
for g in 0 1; do
    pair "ibv_rc_pingpong-rxe-gid$g" rxe "$pingpong" -- ibv_rc_pingpong -c -g "$g" -p @PORT@ @HOST@
    pair "ibv_ud_pingpong-rxe-gid$g" rxe "$pingpong" -- ibv_ud_pingpong -c -g "$g" -p @PORT@ @HOST@
done
for t in send write read atomic; do
    pair "ib_${t}_lat" portable "$lat" -- "ib_${t}_lat" -p @PORT@ @HOST@
    pair "ib_${t}_bw" portable "$bw" -- "ib_${t}_bw" -p @PORT@ @HOST@
    # Under mlx5 the device reports a ConnectX-5's ids, and perftest takes its ConnectX
    # paths (the ibv_wr_* API, inline data).
    pair "ib_${t}_lat-mlx5" mlx5 "$lat" -- "ib_${t}_lat" -p @PORT@ @HOST@
    pair "ib_${t}_bw-rxe" rxe "$bw" -- "ib_${t}_bw" -p @PORT@ @HOST@
done
for t in send_lat send_bw write_lat write_bw; do
    case $t in *_lat) f=$lat ;; *) f=$bw ;; esac
    pair "ib_${t}-uc" portable "$f" -- "ib_$t" -c UC -p @PORT@ @HOST@
done
pair ib_send_lat-ud portable "$lat" -- ib_send_lat -c UD -p @PORT@ @HOST@
pair ib_send_bw-ud portable "$bw" -- ib_send_bw -c UD -p @PORT@ @HOST@
# perftest's less common flags.
for i in 1 2 3; do
    pair "ib_write_bw-bidir-$i" portable "$bw" -- ib_write_bw -b -q 2 -s 1048576 -n 200 -p @PORT@ @HOST@
done
pair ib_read_bw-bidir portable "$bw" -- ib_read_bw -b -q 2 -s 1048576 -n 200 -p @PORT@ @HOST@
for t in send write read; do
    pair "ib_${t}_lat-all" portable "$latmax" -- "ib_${t}_lat" -a -n 200 -p @PORT@ @HOST@
done
pair ib_send_lat-ud-all portable "$latmax" -- ib_send_lat -c UD -a -n 200 -p @PORT@ @HOST@
pair ib_write_bw-post-list portable "$bw" -- ib_write_bw --post_list 16 -n 4096 -p @PORT@ @HOST@
pair ib_write_bw-cq-mod portable "$bw" -- ib_write_bw --cq-mod 16 -p @PORT@ @HOST@
pair ib_send_lat-events portable "$lat" -- ib_send_lat -e -p @PORT@ @HOST@
pair ib_send_bw-events portable "$bw" -- ib_send_bw -e -p @PORT@ @HOST@
pair ib_write_bw-duration portable 'awk "/#bytes/ {getline; print \$1 \" B: \" \$4 \" MB/s over 2 s\"}"' -- ib_write_bw -D 2 -p @PORT@ @HOST@
pair ib_read_bw-outstanding portable "$bw" -- ib_read_bw -o 4 -p @PORT@ @HOST@
pair ib_send_bw-srq-16qp portable "$bw" -- ib_send_bw --use-srq -q 16 -p @PORT@ @HOST@
for a in FETCH_AND_ADD CMP_AND_SWAP; do
    pair "ib_atomic_lat-$a" portable "$lat" -- ib_atomic_lat -A "$a" -p @PORT@ @HOST@
    pair "ib_atomic_bw-$a" portable "$bw" -- ib_atomic_bw -A "$a" -p @PORT@ @HOST@
done

# ---------------------------------------------------------------- qperf
# A server per test (qperf's serves for ever); -cp1 polls the CQ, the default waits for
# events.
for mode in events polling; do
    opt=()
    [ "$mode" = events ] || opt=(-cp1)
    for t in rc_lat rc_bw rc_rdma_read_bw rc_rdma_write_lat rc_compare_swap_mr ver_rc_compare_swap uc_lat ud_lat ud_bw; do
        # ud_bw's default message (2 KiB) is above the port's active MTU (1024, as on an
        # rxe on Ethernet): the HCA sends nothing and completes the send (IBA
        # C10-93.1.1, rxe_req.c), so nothing would be received. One MTU's worth is.
        size=()
        [ "$t" != ud_bw ] || size=(-m 1024)
        PAIR_STAYS=1 pair "qperf-$t-$mode" portable "$qperf" -- qperf -lp @PORT@ ::: qperf -lp @PORT@ 127.0.0.1 -t 1 "${opt[@]}" "${size[@]}" "$t"
    done
done

# ---------------------------------------------------------------- UCX
# UCX 1.13 on the rxe profile picks GID 0 (UCX_IB_GID_INDEX=0), as on a real rxe: its UD
# transport reads the IP version of a datagram's GRH from wc.sl, which rxe leaves 0.
ucx_env() { # PROFILE TLS
    local e=(env "UCX_TLS=$2" UCX_NET_DEVICES=sim0:1 UCX_WARN_UNUSED_ENV_VARS=n)
    [ "$1" != rxe ] || e+=(UCX_IB_GID_INDEX=0)
    printf '%s\n' "${e[@]}"
}
ucx_alt() { # NAME TEST... : the same UCP test over tcp and over shared memory
    [ "$alternatives" = 1 ] || return 0
    local name=$1 f
    shift
    case $* in *lat*) f=$ucx_lat ;; *_bw* | *"-s "*) f=$ucx_bw ;; *) f=$ucx_rate ;; esac
    for tls in tcp posix; do
        pair "$tls" none "$f" -- env UCX_TLS="$tls,self" UCX_WARN_UNUSED_ENV_VARS=n ucx_perftest -p @PORT@ @HOST@ "$@"
    done
}
for profile in portable rxe; do
    sim "ucx_info-$profile" "$profile" 'awk "/Transport: (rc_verbs|ud_verbs)/ {t[\$3]=1} /Device: sim0/ {d=1} END {if (d && t[\"rc_verbs\"] && t[\"ud_verbs\"]) print \"sim0:1 with rc_verbs and ud_verbs\"}"' -- ucx_info -d
    mapfile -t rc < <(ucx_env "$profile" rc_v,self)
    mapfile -t ud < <(ucx_env "$profile" ud_v,self)
    ucp() { # NAME FIGURE TLS-ENV-NAME TEST...
        local name=$1 f=$2 e=$3
        shift 3
        local -n envs=$e
        wanted "$name-$profile" || return 0
        pair "$name-$profile" "$profile" "$f" -- "${envs[@]}" ucx_perftest -p @PORT@ @HOST@ "$@"
        [ "$profile" != portable ] || ucx_alt "$name" "$@"
    }
    ucp ucx-tag_lat "$ucx_lat" rc -t tag_lat -n 20000
    ucp ucx-tag_bw-eager "$ucx_bw" rc -t tag_bw -s 4096 -n 20000
    ucp ucx-tag_bw-rndv "$ucx_bw" rc -t tag_bw -s 1048576 -n 500
    ucp ucx-put_bw "$ucx_bw" rc -t ucp_put_bw -s 1048576 -n 500
    ucp ucx-get "$ucx_bw" rc -t ucp_get -s 65536 -n 2000
    ucp ucx-fadd "$ucx_rate" rc -t ucp_fadd -n 20000
    ucp ucx-am_lat "$ucx_lat" rc -t ucp_am_lat -n 20000
    ucp ucx-ud-tag_lat "$ucx_lat" ud -t tag_lat -n 20000
    ucp ucx-ud-tag_bw "$ucx_bw" ud -t tag_bw -s 65536 -n 2000
    # UCT on rc_verbs itself.
    for t in "put_bw -s 65536 -n 2000 -D zcopy" "get -s 65536 -n 2000 -D zcopy" "am_lat -n 20000"; do
        case $t in *lat*) f=$ucx_lat ;; *) f=$ucx_bw ;; esac
        # shellcheck disable=SC2086
        pair "uct-rc_verbs-${t%% *}-$profile" "$profile" "$f" -- "${rc[@]}" ucx_perftest -p @PORT@ @HOST@ -x rc_verbs -d sim0:1 -t $t
    done
done

# ---------------------------------------------------------------- Open MPI
mkdir -p "$out/install"
mpi_prog=$out/install/mpi_pingpong
mpicc -std=gnu11 -O2 -o "$mpi_prog" "$root/backend-sim/cabi/tests/c/mpi_pingpong.c"
mpirun_args=(mpirun --oversubscribe --bind-to none)
[ "$(id -u)" != 0 ] || mpirun_args+=(--allow-run-as-root)
mpi_row() { # NAME PROFILE RANKS MCA... : on the sim
    local name=$1 profile=$2 n=$3
    shift 3
    local e=(-x UCX_NET_DEVICES=sim0:1 -x UCX_WARN_UNUSED_ENV_VARS=n -x UCX_TLS=rc_v,self)
    [ "$profile" != rxe ] || e+=(-x UCX_IB_GID_INDEX=0)
    sim "$name-$profile-np$n" "$profile" "$mpi" -- "${mpirun_args[@]}" -np "$n" "${e[@]}" "$@" "$mpi_prog"
}
mpi_alt() { # RANKS BTL: after the row of mpi-pml-ucx-portable-npRANKS
    [ "$alternatives" = 1 ] && wanted "mpi-pml-ucx-portable-np$1" || return 0
    local log=$runs/mpi-$2-np$1.log fig
    timeout "$limit" "${mpirun_args[@]}" -np "$1" --mca pml ob1 --mca btl "$2,self" "$mpi_prog" >"$log" 2>&1 || true
    fig=$(eval "$mpi" <"$log" 2>/dev/null || true)
    alt_figure "$2" "${fig:-failed}"
}
for n in 2 4; do
    mpi_row mpi-pml-ucx portable "$n" --mca pml ucx
    mpi_alt "$n" tcp
    mpi_alt "$n" vader
    mpi_row mpi-pml-ucx rxe "$n" --mca pml ucx
    # The openib BTL connects over RoCE through its rdmacm CPC only, which Debian's Open
    # MPI is built without (btl_openib_cpc_include=rdmacm: "All possible valid names:
    # udcm"), so it runs on the default (InfiniBand) profile here.
    mpi_row mpi-btl-openib portable "$n" --mca pml ob1 --mca btl openib,self --mca btl_openib_allow_ib true --mca btl_openib_warn_no_device_params_found 0
done

# ---------------------------------------------------------------- libfabric
sim fi_info-verbs portable 'awk "/domain: sim0/ {n++} END {if (n) print n \" sim0 endpoint(s)\"}"' -- fi_info -p verbs
pair fi_pingpong-rxd portable "$fi_pp" -- fi_pingpong -p 'verbs;ofi_rxd' -e rdm -B @PORT@ -I 1000 -S 64 -c ::: fi_pingpong -p 'verbs;ofi_rxd' -e rdm -P @PORT@ -I 1000 -S 64 -c 127.0.0.1
if [ "$alternatives" = 1 ] && wanted fi_pingpong-rxd; then
    for p in tcp shm; do
        pair "$p" none "$fi_pp" -- fi_pingpong -p "$p" -e rdm -B @PORT@ -I 1000 -S 64 -c ::: fi_pingpong -p "$p" -e rdm -P @PORT@ -I 1000 -S 64 -c 127.0.0.1
    done
fi
# libfabric's msg endpoints connect through rdma_cm (verbs -e msg, and verbs;ofi_rxm
# whose rdm endpoints are msg endpoints underneath).
pair fi_pingpong-msg portable "$fi_pp" -- fi_pingpong -p verbs -e msg -B @PORT@ -I 1000 -S 64 -c ::: fi_pingpong -p verbs -e msg -P @PORT@ -I 1000 -S 64 -c 127.0.0.1
# ofi_rxm sizes its CQs from the universe size (256 peers by default: 65536 entries),
# above the 32767 of rxe (and of the sim's profiles): it fails with "Unable to create
# verbs CQ" there, and runs with a smaller universe.
pair fi_pingpong-rxm portable "$fi_pp" -- env FI_UNIVERSE_SIZE=16 fi_pingpong -p 'verbs;ofi_rxm' -e rdm -B @PORT@ -I 1000 -S 64 -c ::: env FI_UNIVERSE_SIZE=16 fi_pingpong -p 'verbs;ofi_rxm' -e rdm -P @PORT@ -I 1000 -S 64 -c 127.0.0.1

# ---------------------------------------------------------------- rdma_cm (librdmacm)
# rdma-core's librdmacm programs, the rdma_cm port being the pair's port: the server
# listens there (the sim's rendezvous is a TCP listener at it), the client connects.
# rping -V checks every ping's data and fails on a mismatch.
# (Its threads' lines may interleave in the log: the pings are counted by number.)
rping_fig() { grep -o 'rdma-ping-[0-9]*' | sort -u | awk 'END {if (NR == 1000) print NR " pings, data verified"}'; }
ok_fig() { # FINAL-LINE-PATTERN TEXT: a figure that is TEXT if the client printed the line
    printf 'grep -q %q && echo %q' "$1" "$2"
}
for profile in portable rxe; do
    pair "rping-$profile" "$profile" rping_fig -- rping -s -v -V -C 1000 -a 127.0.0.1 -p @PORT@ ::: rping -c -v -V -C 1000 -a 127.0.0.1 -p @PORT@
    pair "ucmatose-$profile" "$profile" "$(ok_fig '^return status 0' '8 connections, 100 messages each way')" -- ucmatose -p @PORT@ -c 8 -C 100 ::: ucmatose -s 127.0.0.1 -p @PORT@ -c 8 -C 100
    # udaddy has no port option: rdma_cm port 7174.
    PAIR_PORT=7174 pair "udaddy-$profile" "$profile" "$(ok_fig '^return status 0' '4 UD endpoints, 50 datagrams each way')" -- udaddy -c 4 -C 50 ::: udaddy -s 127.0.0.1 -c 4 -C 50
    pair "rdma_server-$profile" "$profile" "$(ok_fig '^rdma_client: end 0' 'rdma_getaddrinfo, rdma_create_ep, a send and a receive')" -- rdma_server -p @PORT@ ::: rdma_client -s 127.0.0.1 -p @PORT@
done
# rsockets: both ends run the same test (-T v: the receiver checks the data).
rs_fig() { awk '/^custom/ {fig = $2 " x " $3 ": " $7 " Gb/s, " $8 " us/xfer"} END {if (fig) print fig ", data verified"}'; }
for p in rstream riostream; do
    pair "$p" portable rs_fig -- "$p" -p @PORT@ -S 65536 -C 2000 -T v ::: "$p" -s 127.0.0.1 -p @PORT@ -S 65536 -C 2000 -T v
done
# A plain TCP program on rsockets: librspreload.so turns its sockets into rsockets.
# iperf (2) rather than iperf3, which asks every socket for TCP_INFO (rsockets: ENOTSUP).
iperf_fig() { awk '/ sec .*bits\/sec/ {fig = $(NF - 1) " " $NF} END {if (fig) print fig}'; }
PAIR_PRELOAD=/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so pair iperf-rsockets portable iperf_fig -- iperf -s -p @PORT@ ::: iperf -c 127.0.0.1 -p @PORT@ -t 2
# perftest's -R: the QPs connected through rdma_cm, and its own exchange too. Its server
# destroys the listener of that exchange and listens anew for the test's QPs only once
# its SEND of the last handshake completed, while the client connects as soon as it has
# that message; a request that comes first is rejected (reason 8, no listener: the IB
# CM's answer), as on any HCA. perftest 4.5-0.17's own retry after that reject uses the
# ids and nodes it has just freed and segfaults (perftest's upstream fix: "Fix crashes
# and logical flaws in RDMA CM connection retry"), and the row then runs again. The
# sim no longer adds to the race (a client that turns to rdma_cm sends the ACK it owes
# at once, not after the progress thread's grace period), but on a loaded 2-CPU host
# the server is still sometimes scheduled out past the client's request. ib_send_lat -R loses that race in
# most runs on a 2-CPU host (its server's log shows its new listen after the client's
# request): it has no row.
for profile in portable rxe; do
    PAIR_RETRY='RDMA_CM_EVENT_REJECTED; error: 8' pair "ib_write_bw-R-$profile" "$profile" "$bw" -- ib_write_bw -R -p @PORT@ @HOST@
done
# mckey: UD multicast through rdma_cm (rdma_join_multicast_ex, librdmacm's attach of
# the QP to the event's MGID and MLID, leave). The receiver joins and waits for every
# datagram; once its "joined" line is out, the sender joins and sends to the group.
# Each profile has a group of its own.
mckey_pair() { # NAME PROFILE GROUP: a row of the receiver's result
    local name=$1 profile=$2 group=$3
    wanted "$name" || return 0
    local rlog=$runs/$name.receiver.log slog=$runs/$name.sender.log status=ok waited=0
    local args=(-m "$group" -b 127.0.0.1 -C 100)
    timeout "$limit" "$launcher" --profile "$profile" -- stdbuf -oL mckey "${args[@]}" >"$rlog" 2>&1 &
    local pid=$!
    until grep -q '^mckey: joined' "$rlog"; do
        sleep 0.1
        waited=$((waited + 1))
        if [ "$waited" -gt $((limit * 10)) ] || ! kill -0 "$pid" 2>/dev/null; then break; fi
    done
    timeout "$limit" "$launcher" --profile "$profile" -- mckey "${args[@]}" -s >"$slog" 2>&1 || status=FAIL
    wait "$pid" || status=FAIL
    local fig
    fig=$(grep -q '^return status 0' "$rlog" && grep -o 'joined dgid: [^ ]* mlid [^ ]*' "$rlog" | sed 's/^joined //; s/$/: 100 datagrams received/')
    [ -n "$fig" ] || status=FAIL
    [ "$status" = ok ] || failed=$((failed + 1))
    row "$name" mckey "${args[@]}" "$profile" "$status" "$fig"
    [ "$status" = ok ] || fail_details "$name" "" "$rlog" "$slog"
}
mckey_pair mckey-portable portable 239.1.2.3
mckey_pair mckey-rxe rxe 239.1.2.4
# cmtime: setup and teardown of 100 connections, all of them at once (the rate at 1000
# against TCP's: ci/rdmacm-bench.sh).
cmtime_fig() { awk -F: '/^(create id|resolve addr|resolve route|create qp|connect|disconnect|destroy) *:/ {split($2, a, " "); t += a[1]; n++} END {if (n == 7) printf "100 connections: %.0f ms in all steps, %.0f/s\n", t, 100000 / t}'; }
pair cmtime portable cmtime_fig -- cmtime -b 127.0.0.1 -p @PORT@ -c 100 ::: cmtime -s 127.0.0.1 -p @PORT@ -c 100

# ---------------------------------------------------------------- pyverbs
# rdma-core's own tests (python3-pyverbs ships them, some gzipped). A row fails if a test
# fails or errors, or if fewer of the generic tests (not test_mlx5_*, test_efa*) pass
# than the floor of its profile; the floors only rise. The sim logs at level error only
# here: a refusal's warning, written to the same stream as unittest's verdict, would split
# a "... ok" line and hide that test from the count. test_rdmacm (rdma_cm through
# /dev/infiniband/rdma_cm; its players are forked from the suite's process, and open
# devices of their own there, as on an HCA) runs in a process of its own, with a floor
# of its own and a second try (see below), which the rest of the suite does not need.
# test_mlx5_rdmacm is left out: under the mlx5 profile its DC-as-external-QP test's
# players fail (open, not investigated), elsewhere it skips.
# Under rxe the floors are every generic test rxe0 passes (ci/pyverbs-rxe.sh: rdma-core
# 44 on Linux 6.1's rxe), none failing; each test skipped needs what rxe0 lacks as well
# (device memory, ODP, dma-buf, XRC, raw packet QPs, flows, parent domains, rereg_mr, tag
# matching, completion timestamps, importing a device) or the host has not (huge pages,
# CUDA), but for RDMA Atomic Write (test_qp_ex_rc_atomic_write), which the sim refuses at
# ibv_create_qp_ex and rxe0 fails (rdma-core 44's provider takes it, Linux 6.1's rxe has
# no such operation).
declare -A floor=([portable]=84 [rxe]=86 [mlx5]=90)
declare -A cm_floor=([portable]=10 [rxe]=10 [mlx5]=10)
pyv=$out/install/pyverbs-tests
rm -rf "$pyv"
cp -r /usr/share/doc/rdma-core/tests "$pyv"
gunzip -f "$pyv"/*.gz
mapfile -t suite < <(cd "$pyv" && ls test_*.py | sed 's/\.py$//' | grep -vxE 'test_(mlx5_)?rdmacm')
pyverbs() { # NAME PROFILE FLOOR PATTERN TESTS...: a row of the tests whose names match PATTERN
    local name=$1 profile=$2 want=$3 pattern=$4
    shift 4
    wanted "$name" || return 0
    local log=$runs/$name.log status passed bad try=0 note=
    while :; do
        try=$((try + 1))
        status=ok
        (cd "$pyv" && RUST_LOG=error timeout $((limit * 5)) "$launcher" --profile "$profile" -- /usr/bin/python3 run_tests.py -v "$@" >"$log" 2>&1) || status=FAIL
        passed=$(pyverbs_ok "$pattern" <"$log")
        bad=$(grep -cE '^(FAIL|ERROR): ' "$log" || true)
        [ "$passed" -ge "$want" ] || status=FAIL
        [ "$status" = FAIL ] && [ "$try" -lt "${PYV_TRIES:-1}" ] || break
        cp "$log" "$log.$try"
        note=" (run $((try + 1)); run $try's log: $name.log.$try)"
    done
    [ "$status" = ok ] || failed=$((failed + 1))
    local which=${PYV_LABEL:-$1}
    row "$name" python3 run_tests.py -v "$which" "$profile" "$status" "$passed tests pass (floor $want; not test_mlx5_*, test_efa*), $bad failed, $(grep -cE ' \.\.\. skipped' "$log" || true) skipped$note"
    if [ "$status" != ok ]; then
        { grep -E '^(FAIL|ERROR): ' "$log" || true; } >"$runs/$name.failures"
        fail_details "$name" "" "$runs/$name.failures" "$log"
    fi
    # (A row with no skips: grep finds nothing, which must not end the script.)
    { grep -E ' \.\.\. skipped' "$log" || true; } | sed 's/.*skipped //' | sort | uniq -c | sort -rn >"$runs/$name.skips"
}
for profile in portable rxe mlx5; do
    PYV_LABEL="(all but test_rdmacm, test_mlx5_rdmacm)" pyverbs "pyverbs-$profile" "$profile" "${floor[$profile]}" . "${suite[@]}"
    # test_rdmacm_async_traffic failed 1 of 4 runs under the rxe profile (its passive
    # player raised an exception with no message); open: a second run is allowed, and
    # the row says so. Without that flake test_rdmacm could run in the suite's process
    # (it passes there otherwise, ReservedQPTest's open device and all).
    PYV_TRIES=2 PYV_LABEL="test_rdmacm" pyverbs "pyverbs-rdmacm-$profile" "$profile" "${cm_floor[$profile]}" 'tests\.test_rdmacm\.' test_rdmacm
done

{
    echo "Generated by ci/real-programs.sh: $(nproc) CPUs, load average $load_start at the start and $(cut -d' ' -f1 /proc/loadavg) at the end, $(( $(date +%s) - started )) s; each figure is one run."
    echo
    echo "| program | arguments | profile | result | figure | without the sim |"
    echo "|---|---|---|---|---|---|"
    for i in "${!rows_prog[@]}"; do
        echo "| \`${rows_prog[i]}\` | \`${rows_args[i]}\` | ${rows_profile[i]} | ${rows_result[i]} | ${rows_figure[i]} | ${rows_alt[i]:--} |"
    done
} >"$out/real-programs.md"
echo "real-programs: ${#rows_prog[@]} rows, $failed failed; table in $out/real-programs.md, logs in $runs"
[ "$failed" -eq 0 ]
