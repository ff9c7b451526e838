#!/usr/bin/env bash
# pyverbs-rxe.sh - rdma-core's pyverbs tests on rxe0 itself, in the Soft-RoCE VM of
# ci/rxe-vm.sh (its guest with Python and python3-pyverbs added), so that the sim's rxe
# profile can be held against rxe0 test for test (ci/real-programs.sh runs the same tests
# under the profile, its floor what rxe0 passes). Prints how many of the generic tests
# (not test_mlx5_*, test_efa*) pass and how many tests fail, in test_rdmacm and in the
# rest, and the skips by reason. (test_rdmacm skips here: rxe0's netdev is a dummy, which
# gives the device no /sys/class/infiniband/rxe0/device/net for pyverbs to find.)
#
#   ci/pyverbs-rxe.sh [OUT_DIR]
#
# Writes OUT_DIR/pyverbs-rxe.log (unittest's -v output) and OUT_DIR/pyverbs-rxe.txt (the
# counts, and each skipped or failed test with its reason). The image has a cache
# directory of its own (RXEVM_DIR, default /tmp/rxevm-pyverbs), so that the other VM
# scripts' image is not rebuilt. RXEVM_TIMEOUT defaults to 1200 here (hundreds of tests,
# under TCG where there is no KVM). Exits with the VM's status (99: no status).
. "$(dirname "$0")/lib.sh"
out_dir "${1:-}"
scratch_dir
export RXEVM_DIR=${RXEVM_DIR:-/tmp/rxevm-pyverbs} RXEVM_TIMEOUT=${RXEVM_TIMEOUT:-1200}
# The interpreter, its standard library's shared objects' libraries, and pyverbs (the
# tests come from the host's copy: the guest image keeps no /usr/share).
export RXEVM_EXTRA_DEBS="python3-minimal python3.11-minimal libpython3.11-minimal
  libpython3.11-stdlib libpython3.11 python3-pyverbs libexpat1 libssl3 libffi8 libbz2-1.0
  liblzma5 libsqlite3-0 libncursesw6 libtinfo6 libreadline8 libuuid1 libcrypt1 libdb5.3
  libnsl2 libtirpc3"
cp -r /usr/share/doc/rdma-core/tests "$work/tests"
gunzip -f "$work/tests"/*.gz
# As ci/real-programs.sh runs them: test_rdmacm in a run of its own.
mapfile -t suite < <(cd "$work/tests" && ls test_*.py | sed 's/\.py$//' | grep -vxE 'test_(mlx5_)?rdmacm')
cat >"$work/run.sh" <<RUN
cd tests
python3 run_tests.py -v ${suite[*]} >../suite.log 2>&1
python3 run_tests.py -v test_rdmacm >../rdmacm.log 2>&1
exit 0
RUN
set +e
"$root/ci/rxe-vm.sh" run "$work" sh run.sh
rc=$?
set -e
cat "$work/suite.log" "$work/rdmacm.log" >"$out/pyverbs-rxe.log" 2>/dev/null || true
{
    for part in suite rdmacm; do
        log=$work/$part.log
        [ -s "$log" ] || { echo "$part: no output"; continue; }
        echo "$part: $(pyverbs_ok . <"$log") generic tests pass (not test_mlx5_*, test_efa*)," \
            "$(grep -cE '^(FAIL|ERROR): ' "$log" || true) failed; $(grep -E '^(OK|FAILED)' "$log" | tail -n1)"
    done
    echo
    echo "skipped, by reason (every test, test_mlx5_* and test_efa* too):"
    { grep -hE ' \.\.\. skipped' "$work"/suite.log "$work"/rdmacm.log 2>/dev/null || true; } |
        sed 's/.*skipped //' | sort | uniq -c | sort -rn
    echo
    echo "failed:"
    grep -hE '^(FAIL|ERROR): ' "$work"/suite.log "$work"/rdmacm.log 2>/dev/null || true
} | tee "$out/pyverbs-rxe.txt"
echo "pyverbs on rxe0: VM exit status $rc" >&2
exit $rc
