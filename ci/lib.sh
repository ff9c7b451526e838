# ci/lib.sh - what the host-side ci/*.sh scripts share; bash, sourced, never run:
#
#   . "$(dirname "$0")/lib.sh"
#
# Puts the shell in strict mode (errexit, nounset, pipefail) and sets `root` (the
# checkout) and `target` (cargo's target directory, CARGO_TARGET_DIR or the checkout's,
# as an absolute path). ci/perftest-pairs.sh runs in the Soft-RoCE VM's busybox sh and
# keeps its own helpers.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
case $target in /*) ;; *) target=$root/$target ;; esac

# out_dir [DIR]: sets `out` to DIR (default: ci-out in the checkout), created, as an
# absolute path: the scripts write their reports there.
out_dir() {
    out=${1:-$root/ci-out}
    mkdir -p "$out"
    out=$(cd "$out" && pwd)
}

# need WHO HINT PROGRAM...: unless every PROGRAM is on PATH, says which is not and how
# to get it (HINT), as WHO, and exits 2.
need() {
    local who=$1 hint=$2 p
    shift 2
    for p in "$@"; do
        command -v "$p" >/dev/null || {
            echo "$who: $p not found ($hint)" >&2
            exit 2
        }
    done
}

# scratch_dir: sets `work` to a new temporary directory, removed when the script ends,
# which also ends the background jobs it left (a server left behind by a run that failed).
scratch_dir() {
    work=$(mktemp -d)
    trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
}

# wait_listen PORT: waits up to 10 s for a TCP listener on PORT; fails if none comes.
wait_listen() {
    local _
    for _ in $(seq 200); do
        ss -ltn 2>/dev/null | grep -q ":$1 " && return 0
        sleep 0.05
    done
    return 1
}

# An awk function, for scripts to put in front of their awk programs: median(a, n), the
# median of a[1..n], which it sorts in place (a[1] is then the lowest, a[n] the highest).
# shellcheck disable=SC2034
awk_median='
function median(a, n,    i, j, t) {
    for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}'

# pyverbs_ok PATTERN < LOG: how many of rdma-core's generic pyverbs tests (not test_mlx5_*,
# test_efa*) whose names match the regular expression PATTERN passed, in unittest's -v
# output: "NAME (ID) ... ok", or "ok" on a line of its own where a test printed to stdout
# after the " ... " (test_fork's test_is_fork_initialized does).
pyverbs_ok() {
    PAT=$1 awk '
        function generic(l) { return l ~ ENVIRON["PAT"] && l !~ /tests\.test_(mlx5|efa)/ }
        / \.\.\. ok$/ && generic($0) { n++ }
        /^ok$/ && prev ~ / \.\.\. / && generic(prev) { n++ }
        { prev = $0 }
        END { print n + 0 }'
}
