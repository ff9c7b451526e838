#!/usr/bin/env bash
# package-check.sh - the library crates as crates.io would get them: `cargo package` for
# verbs-api, backend-sim-proto, backend-sim and backend-ibverbs together (so that each is built, unless
# --no-verify is given, against the others as packaged rather than against crates.io),
# then each package's file list, which must hold its README and both license files.
# backend-ibverbs builds rdma-sys (libibverbs-dev, librdmacm-dev, pkg-config,
# libclang-dev). Arguments go to `cargo package` (e.g. --no-verify). Exit status: 0 when
# every crate packages and holds its files.
set -euo pipefail
cd "$(dirname "$0")/.."
crates=(verbs-api backend-sim-proto backend-sim backend-ibverbs)
required=(Cargo.toml README.md LICENSE-MIT LICENSE-APACHE)
start=$(date +%s)
args=()
for c in "${crates[@]}"; do args+=(-p "$c"); done
# Cargo unpacks each crate it packages into $CARGO_HOME/registry/src/<its local
# registry>/<crate>-<version> to build the others against it, and a later run whose
# version is unchanged reuses that folder as it is: the check would build the first
# run's sources. So those folders go first (crates.io's own are left alone).
home=${CARGO_HOME:-$HOME/.cargo}
for c in "${crates[@]}"; do
    v=$(cargo pkgid -p "$c" | sed 's/.*[#@]//')
    for d in "$home"/registry/src/*/"$c-$v"; do
        case $d in */index.crates.io-*) continue ;; esac
        if [ -d "$d" ]; then rm -rf "$d"; fi
    done
done
# --allow-dirty: the check is of the manifests and files, so that it also runs on a tree
# with uncommitted changes.
cargo package "${args[@]}" --allow-dirty "$@"
missing=0
for c in "${crates[@]}"; do
    list=$(cargo package -p "$c" --list --allow-dirty 2>/dev/null)
    echo "== $c: $(wc -l <<<"$list") files"
    for f in "${required[@]}"; do
        if ! grep -qx "$f" <<<"$list"; then
            # A license file reaches a package as a link to the top-level one.
            echo "   missing: $f (for a license file: a link in the crate's folder to the top-level one)"
            missing=1
        fi
    done
done
echo "package check done in $(( $(date +%s) - start ))s"
exit "$missing"
