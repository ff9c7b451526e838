#!/usr/bin/env bash
# Two hosts on one machine, the way the sim is used across hosts: two network namespaces
# joined by a veth pair (10.78.0.1 and 10.78.0.2, no default route, so nothing but the
# pair's own link exists), each process listening on the wildcard address.
#
# 1. kv-rpc server in one namespace, its client in the other (RDMA_SIM_LISTEN=0.0.0.0 on
#    both: each device must advertise its namespace's address, not 0.0.0.0).
# 2. The conformance suite's `remote` cases: a runner with `--serve` in one namespace
#    serves the server halves, a runner with `--peer` in the other runs and reports them.
#
# Needs root (ip netns). Every wait is bounded; the namespaces are removed on exit.
# Usage: ci/two-hosts.sh [OUT_DIR]   (writes OUT_DIR/remote.json; default ci-out)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-ci-out}
mkdir -p "$out"

# The builds the earlier steps of .ci/run made (no-ops there): the examples in the test
# profile, the runner in release.
cargo build -q -p examples --bin kv-rpc
cargo build --release -q -p conformance --bin conformance
kv=$PWD/target/debug/kv-rpc
conf=$PWD/target/release/conformance

a=verbs-rs-a
b=verbs-rs-b
cleanup() {
    ip netns del "$a" 2>/dev/null || true
    ip netns del "$b" 2>/dev/null || true
}
trap cleanup EXIT
cleanup
ip netns add "$a"
ip netns add "$b"
ip link add vrs-a type veth peer name vrs-b
ip link set vrs-a netns "$a"
ip link set vrs-b netns "$b"
ip -n "$a" addr add 10.78.0.1/24 dev vrs-a
ip -n "$b" addr add 10.78.0.2/24 dev vrs-b
for ns in "$a" "$b"; do
    ip -n "$ns" link set lo up
done
ip -n "$a" link set vrs-a up
ip -n "$b" link set vrs-b up
in_a() { ip netns exec "$a" env RDMA_SIM_LISTEN=0.0.0.0 "$@"; }
in_b() { ip netns exec "$b" env RDMA_SIM_LISTEN=0.0.0.0 "$@"; }

# Waits (bounded: 20 s) until something listens on TCP port $2 in namespace $1.
listening() {
    for _ in $(seq 200); do
        ip netns exec "$1" ss -Hltn "sport = :$2" | grep -q . && return 0
        sleep 0.1
    done
    echo "nothing listens on port $2 in $1" >&2
    return 1
}

echo "--- kv-rpc: server in $a (10.78.0.1), client in $b (10.78.0.2)"
in_a timeout 60 "$kv" server --listen 0.0.0.0:18515 --clients 2 &
server=$!
listening "$a" 18515
in_b timeout 60 "$kv" client --server 10.78.0.1:18515 --clients 2
wait "$server"

echo "--- conformance remote cases: server halves in $a, client halves (reported) in $b"
cases=$("$conf" --list --filter remote. | wc -l)
in_a timeout 120 "$conf" --serve 0.0.0.0:18600 --serve-cases "$cases" &
server=$!
listening "$a" 18600
in_b timeout 120 "$conf" --peer 10.78.0.1:18600 --filter remote. --json >"$out/remote.json"
wait "$server"
"$conf" --render "$out/remote.json"
