#!/usr/bin/env bash
# call-cost.sh - what backend-ibverbs costs over C, per call, on rxe0 in the Soft-RoCE VM
# of ci/rxe-vm.sh: backend-ibverbs/bench/call_cost.c (libibverbs called directly) and
# backend-ibverbs/examples/call_cost.rs (the same calls through backend-ibverbs) run
# under `valgrind --tool=callgrind`, which counts the instructions of each measured
# function (libibverbs and the provider included) without the noise of a clock. The
# host's valgrind (Debian bookworm, as the guest) is copied into the shared directory.
#
#   ci/call-cost.sh [OUT_DIR] [ITERS]
#
# Prints, per call, the instructions of C, of Rust and the difference, and writes
# OUT_DIR/call-cost.md and OUT_DIR/call-cost.json (OUT_DIR defaults to ci-out, ITERS to
# 1000). Needs gcc, libibverbs-dev and valgrind on the host.
. "$(dirname "$0")/lib.sh"
out_dir "${1:-}"
iters=${2:-1000}
need call-cost.sh "apt-get install gcc valgrind" gcc valgrind callgrind_annotate

cargo build --release --manifest-path "$root/Cargo.toml" -p backend-ibverbs --example call_cost
scratch_dir
cp "$target/release/examples/call_cost" "$work/call_cost_rust"
gcc -O2 -Wall -o "$work/call_cost_c" "$root/backend-ibverbs/bench/call_cost.c" -libverbs
mkdir "$work/vg"
cp /usr/bin/valgrind.bin "$work/vg/valgrind"
cp /usr/libexec/valgrind/callgrind-amd64-linux /usr/libexec/valgrind/vgpreload_core-amd64-linux.so \
    /usr/libexec/valgrind/default.supp "$work/vg/"

cat >"$work/run.sh" <<GUEST
#!/bin/sh
export VALGRIND_LIB=/mnt/host/vg
rc=0
for phase in send inline empty recv; do
    for lang in c rust; do
        ./vg/valgrind --tool=callgrind --callgrind-out-file=cg.\$lang.\$phase \\
            --toggle-collect='*cc_*' ./call_cost_\$lang rxe0 1 $iters \$phase >log.\$lang.\$phase 2>&1 || {
            cat log.\$lang.\$phase; rc=1; }
    done
done
exit \$rc
GUEST

"$root/ci/rxe-vm.sh" run "$work" sh run.sh

# Inclusive instructions of each measured function, per call.
count() { # file function (awk reads to the end: an early exit would fail the pipe)
    callgrind_annotate --inclusive=yes "$1" |
        awk -v f="$2" '!n && ($0 ~ ("[:]" f " ") || $0 ~ ("::" f " ")) { gsub(",", "", $1); n = $1 }
            END { if (n) print n }'
}
{
    echo "| call | C (instructions) | backend-ibverbs | overhead |"
    echo "|---|---|---|---|"
    json="{\"iterations\": $iters, \"calls\": ["
    sep=""
    for row in "post_send:send:cc_post_send" "post_send (8 B inline):inline:cc_post_send" \
        "poll (one completion):send:cc_poll" \
        "poll (empty CQ):empty:cc_poll" "post_recv:recv:cc_post_recv"; do
        name=${row%%:*}; rest=${row#*:}; phase=${rest%%:*}; fn=${rest#*:}
        c=$(count "$work/cg.c.$phase" "$fn"); r=$(count "$work/cg.rust.$phase" "$fn")
        [ -n "$c" ] && [ -n "$r" ] || { echo "call-cost.sh: no count for $fn in $phase" >&2; exit 1; }
        cp=$((c / iters)); rp=$((r / iters))
        echo "| $name | $cp | $rp | +$((rp - cp)) |"
        json="$json$sep{\"call\": \"$name\", \"c\": $cp, \"rust\": $rp}"
        sep=", "
    done
    echo "$json]}" >"$out/call-cost.json"
} | tee "$out/call-cost.md"
