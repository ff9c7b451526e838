#!/bin/sh
# perftest-pairs.sh - the alternating pairs behind ci/perftest-vs-perf.sh (rxe0 in the
# Soft-RoCE VM, busybox sh) and ci/perftest-vs-perf-sim.sh (the sim on the host, perftest
# through backend-sim/cabi). POSIX sh; run from a directory holding `runs/`. For each
# row, PAIRS pairs, the order inside a pair swapped every time (perftest first, then
# perf first, ...), the rows taken in turn, each tool as server and client on loopback.
# Writes runs/TEST-SIZE__PAIR__perftest.txt and runs/TEST-SIZE__PAIR__perf.json; exits 1 if a
# perf run failed (a perftest run without figures is repeated once and left as it is).
#
# Environment:
#   ROWS            "test:size:iterations ..." (atomics ignore the size)
#   PAIRS           pairs per row
#   PERFTEST_ENV    prefix of every perftest command (e.g. "env LD_PRELOAD=... ")
#   PERFTEST_FLAGS  flags of both perftest sides (device, ACK timeout, ...)
#   PERF            the perf binary
#   PERF_FLAGS      flags of perf (backend, device, ACK timeout, ...)
#   PORT            first perftest port (each run takes the next)
port=${PORT:-18600}
fail=0
nap() { usleep 50000 2>/dev/null || sleep 0.05; }
listening() { # port
    { netstat -ltn 2>/dev/null || ss -ltn 2>/dev/null; } | grep -q ":$1 "
}
wait_listen() { # port
    i=0
    while [ $i -lt 100 ]; do
        listening "$1" && return 0
        nap
        i=$((i + 1))
    done
    return 1
}
perftest_once() { # test size iters out
    port=$((port + 1))
    flags="$PERFTEST_FLAGS -p $port -s $2 -n $3"
    [ "${1%_lat}" = atomic ] && flags="$PERFTEST_FLAGS -p $port -n $3"
    # shellcheck disable=SC2086
    $PERFTEST_ENV ib_$1 $flags >"$4.server" 2>&1 &
    spid=$!
    wait_listen $port || echo "perftest server did not listen on $port" >>"$4"
    # shellcheck disable=SC2086
    timeout 120 $PERFTEST_ENV ib_$1 $flags 127.0.0.1 >>"$4" 2>&1 || echo "exit status $?" >>"$4"
    wait $spid
}
# perftest prints inf or zeros when its sampling of the CPU frequency fails (a
# correlation below 0.9, which happens under emulation): such a run is repeated once.
# A bandwidth run's peak is 0.00 by design above 20000 iterations (perftest skips the
# peak there), so that column need only be a number.
has_figures() { # file: the row after the header, every figure a positive number
    awk '/#bytes/ { peak = /BW peak/; getline; ok = NF >= 5
            for (i = 3; i <= NF; i++)
                if ($i !~ /^[0-9.]+$/ || ($i + 0 <= 0 && !(peak && i == 3))) ok = 0 }
        END { exit !ok }' "$1"
}
perftest_run() { # test size iters out
    : >"$4"
    perftest_once "$@"
    if ! has_figures "$4"; then
        mv "$4" "$4.failed"
        perftest_once "$@"
    fi
}
perf_run() { # test size iters out
    sz="-s $2"
    [ "${1%_lat}" = atomic ] && sz=""
    # shellcheck disable=SC2086
    if ! timeout 120 $PERF $1 $PERF_FLAGS $sz -n $3 --perftest --json >"$4" 2>"$4.err"; then
        echo "perf $1 -s $2 failed:" >&2
        cat "$4.err" >&2
        fail=1
    fi
}
# Round-robin over the rows, one pair of each at a time: a change in the machine's load
# during the sitting (other tenants of a VM host, a CPU frequency step) then falls on
# every row alike instead of on the rows that happen to run at that moment.
p=1
while [ $p -le "$PAIRS" ]; do
    for r in $ROWS; do
        t=${r%%:*}; rest=${r#*:}; s=${rest%%:*}; n=${rest#*:}
        base=runs/${t}-${s}__${p}
        if [ $((p % 2)) -eq 1 ]; then
            perftest_run "$t" "$s" "$n" "${base}__perftest.txt"
            perf_run "$t" "$s" "$n" "${base}__perf.json"
        else
            perf_run "$t" "$s" "$n" "${base}__perf.json"
            perftest_run "$t" "$s" "$n" "${base}__perftest.txt"
        fi
    done
    echo "pair $p of $PAIRS done (every row)"
    p=$((p + 1))
done
exit $fail
