#!/usr/bin/env bash
# capture-checks.sh - the sim's captures judged by tshark. The three seed examples
# (kv-rpc, param-pool, dist-lock) run their demos with RDMA_SIM_PCAP, one file per
# process (OUT/pcap/<example>/<pid>.pcapng, removed when they pass); tshark must read
# every file with no malformed packet and no dissector error, and find the opcodes each
# example implies: SEND and its ACKs for kv-rpc's requests and replies, READ requests and
# responses for param-pool's readers, CMP_SWAP, FETCH_ADD and their ATOMIC_ACKNOWLEDGEs
# for dist-lock's two locks. With a second argument, every capture in that directory (the
# conformance run's `--pcap DIR`, one file per case) is judged the same way. The per-case
# checks of the packets a case implies are conformance/tests/capture.rs (cargo test).
# Usage: ci/capture-checks.sh OUT [CONFORMANCE_PCAP_DIR]. Exit status: 0 when every
# capture is well formed and every example's opcodes are there.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p "${1:-ci-out}"
out=$(cd "${1:-ci-out}" && pwd)
cases=${2:-}
export CARGO_PROFILE_DEV_DEBUG=${CARGO_PROFILE_DEV_DEBUG:-line-tables-only}
# The debug builds `cargo test` made already (as ci/two-hosts.sh's kv-rpc).
cargo build -q -p examples --bin kv-rpc --bin param-pool --bin dist-lock
bin=target/debug
fail=0

# The upper-layer protocols Wireshark guesses at in a SEND's payload, which would call a
# program's bytes malformed: the RoCE encoding is judged (as backend-sim/judge does).
no_guess=()
for h in rpcrdma_infiniband smb_direct_infiniband iser_infiniband sdp_infiniband smcr_infiniband fc_infiniband; do
    no_guess+=(--disable-heuristic "$h")
done

# The frames of capture $1 that tshark calls malformed or in error (none expected): with
# their severities and messages, less the one error allowed, a UDP checksum of 0 over IPv6
# (rxe sends it, RFC 6935 allows it; as backend-sim/judge's ZERO_UDP_CHECKSUM).
troubled() {
    tshark -r "$1" "${no_guess[@]}" -Y '_ws.malformed || _ws.expert.severity >= error' -T fields \
        -E separator=';' -E occurrence=a -E aggregator=, \
        -e frame.number -e _ws.expert.severity -e _ws.expert.message 2>/dev/null |
        awk -F';' '{ n = split($2, s, ","); split($3, m, ","); bad = 0
            for (i = 1; i <= n; i++) if (s[i] + 0 >= 8388608 && m[i] != "Illegal checksum value (0)") bad = 1
            if (bad || $3 ~ /Malformed/) print $1 }'
    return "${PIPESTATUS[0]}"
}

judge() {
    local bad
    if ! bad=$(troubled "$1"); then
        echo "FAIL $1: tshark cannot read it"
        fail=1
    elif [ -n "$bad" ]; then
        echo "FAIL $1: malformed or in error: frame(s) $(echo $bad | head -c 200)"
        tshark -r "$1" "${no_guess[@]}" -Y "frame.number == ${bad%%$'\n'*}" -V 2>/dev/null | tail -30
        fail=1
    fi
}

# IBA opcode numbers (RC), as tshark prints infiniband.bth.opcode.
declare -A name=([0]=SEND_FIRST [1]=SEND_MIDDLE [2]=SEND_LAST [4]=SEND_ONLY [10]=RDMA_WRITE_ONLY [12]=RDMA_READ_REQUEST
    [13]=RDMA_READ_RESPONSE_FIRST [14]=RDMA_READ_RESPONSE_MIDDLE [15]=RDMA_READ_RESPONSE_LAST [16]=RDMA_READ_RESPONSE_ONLY
    [17]=ACKNOWLEDGE [18]=ATOMIC_ACKNOWLEDGE [19]=CMP_SWAP [20]=FETCH_ADD)

# example, its demo's arguments, then alternatives ("4|0" : SEND_ONLY or SEND_FIRST) that
# must each be among the opcodes of its captures.
check_example() {
    local ex=$1 args=$2
    shift 2
    local dir=$out/pcap/$ex
    rm -rf "$dir"
    mkdir -p "$dir"
    local t0=$SECONDS
    # shellcheck disable=SC2086
    if ! RDMA_SIM_PCAP="$dir/%p.pcapng" "$bin/$ex" demo $args >"$dir/demo.log" 2>&1; then
        echo "FAIL $ex demo $args (log: $dir/demo.log)"
        tail -20 "$dir/demo.log"
        fail=1
        return
    fi
    local files=("$dir"/*.pcapng)
    if [ ! -e "${files[0]}" ]; then
        echo "FAIL $ex: no capture written in $dir"
        fail=1
        return
    fi
    for f in "${files[@]}"; do judge "$f"; done
    local seen
    seen=" $(for f in "${files[@]}"; do tshark -r "$f" "${no_guess[@]}" -Y infiniband -T fields -e infiniband.bth.opcode 2>/dev/null; done | sort -un | tr '\n' ' ')"
    local missing=()
    for want in "$@"; do
        local hit=0
        for o in ${want//|/ }; do
            case $seen in *" $o "*) hit=1 ;; esac
        done
        [ $hit = 1 ] || missing+=("$(for o in ${want//|/ }; do printf '%s ' "${name[$o]}"; done)")
    done
    local named
    named=$(for o in $seen; do printf '%s ' "${name[$o]:-$o}"; done)
    if [ ${#missing[@]} -gt 0 ]; then
        echo "FAIL $ex: no ${missing[*]}among the opcodes captured: $named"
        fail=1
    else
        echo "ok   $ex: ${#files[@]} capture(s), $((SECONDS - t0)) s, opcodes: $named"
        # (Tens of MB: kept only when something is wrong.)
        rm -f "${files[@]}"
    fi
}

check_example kv-rpc "" "4|0" 17
# (Half a second of reading: the captures of the default 2 s take tshark longer.)
check_example param-pool "--duration-ms 500" 12 "16|13"
check_example dist-lock "" 19 20 18

if [ -n "$cases" ]; then
    files=("$cases"/*.pcapng)
    if [ ! -e "${files[0]}" ]; then
        echo "FAIL no capture in $cases"
        fail=1
    else
        # One tshark over all of them (its start costs more than a case's packets); the
        # files one by one only to name the cases when something is wrong.
        all=$out/pcap/conformance-all.pcapng
        mergecap -a -w "$all" "${files[@]}"
        before=$fail
        judge "$all"
        if [ "$fail" != "$before" ]; then
            for f in "${files[@]}"; do judge "$f"; done
        else
            echo "ok   ${#files[@]} conformance case capture(s) in $cases: $(tshark -r "$all" -Y infiniband 2>/dev/null | wc -l) packets, none malformed"
        fi
        rm -f "$all"
    fi
fi
exit $fail
