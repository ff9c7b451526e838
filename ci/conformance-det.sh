#!/usr/bin/env bash
# The conformance suite's send, rdma and atomic cases on the deterministic backend
# (backend-sim-det) under a range of seeds and one fault mix, each seed run twice: every
# case must pass and both runs must print the same trace. atomic.concurrent is left out:
# it posts from four threads, which a deterministic world refuses.
#
#   ci/conformance-det.sh FIRST LAST LOSS DUP    # e.g. ci/conformance-det.sh 0 49 10 10
set -euo pipefail
first=${1:-0} last=${2:-19} loss=${3:-5} dup=${4:-5}
cd "$(dirname "$0")/.."
cargo build --release -q -p conformance
bin=target/release/conformance
cases=(-f send. -f rdma. -f atomic.fetch -f atomic.cmp -f atomic.wrap)
run() {
    "$bin" --backend det --seed "$1" --loss "$loss" --dup "$dup" "${cases[@]}" 2>&1 >/dev/null || {
        echo "seed $1: a case failed; replay: $bin --backend det --seed $1 --loss $loss --dup $dup ${cases[*]}" >&2
        exit 1
    }
}
for seed in $(seq "$first" "$last"); do
    a=$(run "$seed" | grep -o 'det: seed.*')
    b=$(run "$seed" | grep -o 'det: seed.*')
    if [ "$a" != "$b" ]; then
        echo "seed $seed: two runs differ:"; echo "  $a"; echo "  $b"; exit 1
    fi
done
echo "seeds $first..=$last (loss $loss%, dup $dup%): every case passed, each seed's two runs gave the same trace"
