#!/usr/bin/env bash
# capture-compare.sh - the sim's packets held against rxe0's, case by case: the chosen
# conformance cases run on the sim under the rxe profile with their traffic captured
# (`conformance --pcap`, whole packets), and on rxe0 in the Soft-RoCE VM of ci/rxe-vm.sh
# with tcpdump on its netdev (`conformance --backend ibverbs --pcap`); `capture-compare`
# puts each case's two packet sequences side by side (opcodes, PSN steps, payload
# lengths, AETH syndromes and MSN steps, RETH lengths, rkeys in the order named, atomic
# operands and original values, UD's Q_Keys and multicast groups), recomputes every rxe0 packet's ICRC with the sim's function and checks every
# packet's UDP source port against rxe's derivation.
#
#   ci/capture-compare.sh [OUT_DIR] [FILTER..]
#
# FILTERs are the runner's --filter texts (default: every group whose cases put RoCE
# packets on the wire: send, rdma, atomic, rnr, access, ud, uc, mcast, srq, mw, errors,
# qp, cq, cq-resize, order, post, aio, events, port. Not rdmacm: rdma_cm resolves the
# peer's MAC as rxe0's own netdev's, so rxe loops the CM MADs and the data back inside
# the device, and the sim's capture holds the case's own context, not the ones rdma_cm
# opens. Not remote: the peer is another process, whose traffic rxe0 loops back and
# the sim's capture of the case does not hold). Writes OUT_DIR/capture-compare.md (the comparison), OUT_DIR/sim.json
# and OUT_DIR/rxe.json (the two runs' reports), and OUT_DIR/pcap/{sim,rxe}/ (the
# captures). Exits non-zero if an ICRC or source port is not rxe's, a capture cannot be
# read, or the VM gave no status (99); the differences themselves are the output.
#
# The wire in the guest: Soft-RoCE hands a packet whose destination MAC is its own
# netdev's straight to its receive path (rxe_net.c: rxe_prepare sets the loopback mask,
# rxe_xmit_packet calls rxe_loopback), so the cases' QPs, both on rxe0, would put nothing
# on a netdev for tcpdump. Here rxe0's netdev is one end of a veth pair: the device's
# own address is routed out through it (a policy rule ahead of the local table, for
# locally sent packets only) to a neighbour MAC that is not its own, and the other end
# mirrors every RoCE v2 frame back with the destination MAC rewritten to rxe0's netdev's
# (tc: u32 on UDP port 4791, pedit, mirred), where it is received as from a switch
# (accept_local: its source address is a local one). Every packet rxe sends then leaves
# through the netdev once, and tcpdump -Q out sees it once, as a peer on a wire would.
. "$(dirname "$0")/lib.sh"
out_dir "${1:-}"
shift || true
filters=("$@")
[ ${#filters[@]} -gt 0 ] || filters=(send. rdma. atomic. rnr. access. ud. uc. mcast. srq. mw.
    errors. qp. cq. cq-resize. order. post. aio. events. port.)
fargs=()
for f in "${filters[@]}"; do fargs+=(--filter "$f"); done
cargo build --release --manifest-path "$root/Cargo.toml" -p conformance --features ibverbs \
    --bin conformance --bin capture-compare
bin=$target/release
rm -rf "$out/pcap"
mkdir -p "$out/pcap"
t0=$SECONDS

# The sim, playing rxe, whole packets (payload and ICRC) in the capture.
set +e
RDMA_SIM_PCAP_SNAPLEN=all "$bin/conformance" --backend sim --profile rxe --timeout 30 \
    --pcap "$out/pcap/sim" "${fargs[@]}" --json >"$out/sim.json"
sim_rc=$?
set -e
echo "conformance on the sim (rxe profile): exit status $sim_rc" >&2

scratch_dir
cp "$bin/conformance" "$work/"
cat >"$work/wire.sh" <<'WIRE'
# (busybox ash in the guest runs its own ip and tc applets unless given a path)
ip=/bin/ip tc=/sbin/tc
rdma link del rxe0 || exit 80
$ip link del rxenet0
$ip link add rxenet0 type veth peer name rxemirror0 || exit 81
$ip addr add 10.77.0.1/24 dev rxenet0
$ip link set rxenet0 up
$ip link set rxemirror0 up
mac=$(cat /sys/class/net/rxenet0/address)
for c in all rxenet0 rxemirror0; do echo 0 >/proc/sys/net/ipv4/conf/$c/rp_filter; done
echo 1 >/proc/sys/net/ipv4/conf/rxenet0/accept_local
$ip neigh replace 10.77.0.1 lladdr 02:00:00:00:77:02 dev rxenet0 nud permanent || exit 82
$ip route add 10.77.0.1 dev rxenet0 src 10.77.0.1 table 77
$ip rule add pref 10 iif lo to 10.77.0.1 lookup 77
$ip rule add pref 100 lookup local
$ip rule del pref 0 lookup local
$tc qdisc add dev rxemirror0 ingress || exit 83
$tc filter add dev rxemirror0 parent ffff: protocol ip u32 match ip protocol 17 0xff \
    match ip dport 4791 0xffff action pedit ex munge eth dst set "$mac" pipe \
    action mirred egress redirect dev rxemirror0 || exit 84
rdma link add rxe0 type rxe netdev rxenet0 || exit 85
WIRE
export RXEVM_DIR=${RXEVM_DIR:-/tmp/rxevm-capture}
export RXEVM_EXTRA_DEBS="tcpdump libpcap0.8 libssl3 libdbus-1-3 libsystemd0 libgcrypt20
  libgpg-error0 liblz4-1 liblzma5 libzstd1 libxtables12"
export RXEVM_EXTRA_MODS="veth sch_ingress cls_u32 act_pedit act_mirred"
set +e
# (The captures are written to the guest's tmpfs and copied once the run is done: the
# shared directory's 9p writes, one per packet, left tcpdump too far behind a burst.)
"$root/ci/rxe-vm.sh" run "$work" sh -c ". ./wire.sh && ./conformance --backend ibverbs --device rxe0 --gid-index 1 --timeout 30 --pcap /tmp/rxe ${fargs[*]} --json > rxe.json; rc=\$?; cp -r /tmp/rxe rxe; exit \$rc"
vm_rc=$?
set -e
echo "conformance on rxe0: exit status $vm_rc" >&2
[ -s "$work/rxe.json" ] && cp "$work/rxe.json" "$out/rxe.json"
[ -d "$work/rxe" ] && cp -r "$work/rxe" "$out/pcap/rxe"
[ -d "$out/pcap/rxe" ] || { echo "capture-compare: no capture from rxe0" >&2; exit 99; }

{
    echo "# The sim's packets and rxe0's, case by case"
    echo
    echo "Generated by \`ci/capture-compare.sh\` (filters: ${filters[*]}; $((SECONDS - t0)) s on this"
    echo "machine): the sim under the rxe profile and rxe0 (Soft-RoCE,"
    echo "$(sed -n 's/^linux-image-\([^|]*\)|.*/Linux \1/p' "$RXEVM_DIR/image/key"), in the VM of ci/rxe-vm.sh, emulated CPUs) run the same"
    echo "cases, each case's packets captured (the sim's own capture; tcpdump on rxe0's netdev)"
    echo "and put side by side per QP pair. How it is done and read: docs/conformance.md,"
    echo "\"Packets side by side with rxe0\"."
    echo
    echo "Verdicts: *same*; *ACK coalescing*: the same but for plain ACKs and AckReq bits (the"
    echo "sim's requester asks for an ACK once in every half of its outstanding WQEs and its"
    echo "responder answers a stream with few ACKs, docs/performance.md; rxe asks at the end of"
    echo "every message and every 66th packet of a long one, and ACKs each); *RNR retries in a timed wait*: the"
    echo "same but for how many RNR NAKs and resends fit in the case's wait (the VM's CPUs are"
    echo "emulated); *resends*: the same once packets sent again are set aside (rxe0 resent after"
    echo "its retransmit timer ran out, or answered a READ's responses with an RNR NAK when it"
    echo "could not build or send the next one and was asked again from there; the sim's TCP never"
    echo "loses a packet); *interleaving*: the same packets in another order (concurrent QPs);"
    echo "*AckReq on UC*: the same but for the AckReq bit on UC packets (rxe leaves it clear, as"
    echo "nothing acknowledges UC, and so does the sim's capture); *requests behind a NAK*: the same up to"
    echo "a NAK, the sim having sent the WRs behind the failing one before the NAK came back and"
    echo "rxe0 not; *sent on rxe0 only*: the sim put nothing on the wire (it refuses a READ's or"
    echo "atomic's local SGE before sending, rxe when the response lands; or the case moved the"
    echo "QP to ERR before the sim's engine sent what was posted, rxe sending within the post)."
    echo
    echo "Outcomes: sim $(grep -o '"status": *"pass"' "$out/sim.json" | wc -l) passed; rxe0 $(grep -o '"status": *"pass"' "$out/rxe.json" 2>/dev/null | wc -l) passed."
    echo
} >"$out/capture-compare.md"
set +e
"$bin/capture-compare" "$out/pcap/sim" "$out/pcap/rxe" --out "$out/capture-compare.body.md"
cmp_rc=$?
set -e
cat "$out/capture-compare.body.md" >>"$out/capture-compare.md"
rm -f "$out/capture-compare.body.md"
echo "capture-compare: exit status $cmp_rc; $out/capture-compare.md" >&2
[ "$vm_rc" = 99 ] && exit 99
exit $cmp_rc
