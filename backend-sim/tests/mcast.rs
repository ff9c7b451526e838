//! UD multicast on the sim (`man ibv_attach_mcast`; IBA 10.5, 9.6.1.4; rxe's
//! `rxe_rcv_mcast_pkt()`): a datagram to a group reaches every attached QP of every
//! device with members, each checking its own Q_Key and taking its own receive behind a
//! GRH whose destination is the MGID, and no QP that is not attached; the sender
//! receives its own unless it was created with `IBV_QP_CREATE_BLOCK_SELF_MCAST_LB`;
//! detaching, and dropping a QP, end its membership; each member device gets one copy,
//! whatever its number of attached QPs.

mod common;

use std::time::Duration;

use backend_sim::{Profile, SimMr, SimQp};
use verbs_api::*;

const WAIT: Duration = Duration::from_secs(5);
const QUIET: Duration = Duration::from_millis(300);
const QKEY: u32 = 0x1111_1111;
const GRH: usize = 40;
const MLID: u16 = 0xc001;

/// A group of its own for each test (the host's view of groups is shared by every
/// process of the user, tests running at once among them).
fn group() -> Gid {
    let mut g = [0u8; 16];
    g[0] = 0xff;
    g[1] = 0x12;
    g[8..].copy_from_slice(&rand_bytes());
    Gid(g)
}

/// The same as an IPv4 multicast address (`::ffff:239.x.y.z`), as RoCE over IPv4 names
/// groups.
fn group_v4() -> Gid {
    let r = rand_bytes();
    Gid::from(std::net::Ipv4Addr::new(239, r[0], r[1], r[2]))
}

fn rand_bytes() -> [u8; 8] {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    (t ^ (std::process::id() as u64) << 40).to_le_bytes()
}

/// One device's side: a PD, a CQ, a region of receive slots of 1 KiB.
struct Side {
    dev: common::Device,
    mr: SimMr,
}

impl std::ops::Deref for Side {
    type Target = common::Device;
    fn deref(&self) -> &common::Device {
        &self.dev
    }
}

impl Side {
    fn new(dev: common::Device) -> Side {
        let mr = dev.pd.reg_mr(64 << 10, AccessFlags::LOCAL_WRITE).unwrap();
        Side { dev, mr }
    }

    fn qp(&self, qkey: u32, flags: u32) -> SimQp {
        let qp = self
            .pd
            .create_qp(&QpInitAttr::ud(&self.cq, &self.cq, QpCap::new(64, 64)).with_create_flags(flags))
            .unwrap();
        let up = [
            (
                QpAttr {
                    qp_state: QpState::Init,
                    port_num: 1,
                    qkey,
                    ..Default::default()
                },
                QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
            ),
            (
                QpAttr {
                    qp_state: QpState::Rtr,
                    ..Default::default()
                },
                QpAttrMask::STATE,
            ),
            (
                QpAttr {
                    qp_state: QpState::Rts,
                    sq_psn: 1,
                    ..Default::default()
                },
                QpAttrMask::STATE | QpAttrMask::SQ_PSN,
            ),
        ];
        for (a, m) in up {
            qp.modify(&a, m).unwrap();
        }
        qp
    }

    /// Posts a receive into slot `slot` (1 KiB) of `qp`, its wr_id the slot.
    fn recv(&self, qp: &SimQp, slot: usize) {
        self.mr.fill(0);
        qp.post_recv(&[RecvWr::new(
            slot as u64,
            &[self.mr.sge(slot << 10, 1024).unwrap()],
        )])
        .unwrap();
    }

    /// An address handle to group `mgid` through GID index `sgid`.
    fn group_ah(&self, mgid: Gid) -> backend_sim::SimAh {
        self.pd
            .create_ah(&AhAttr {
                grh: GlobalRoute {
                    dgid: mgid,
                    sgid_index: 1,
                    hop_limit: 9,
                    traffic_class: 0x20,
                    flow_label: 0x12345,
                },
                dlid: MLID,
                is_global: true,
                port_num: 1,
                ..Default::default()
            })
            .unwrap()
    }

    /// Sends `payload` from `qp` to the group through `ah` and waits for the WR.
    fn send(&self, qp: &SimQp, ah: &backend_sim::SimAh, payload: &[u8]) {
        let at = 60 << 10;
        self.mr.write(at, payload).unwrap();
        qp.post_send(&[SendWr::send(99, &[self.mr.sge(at, payload.len()).unwrap()])
            .signaled()
            .ud(ah, MULTICAST_QPN, QKEY)])
            .unwrap();
        let wc = poll_n(&self.cq, 1, WAIT).unwrap();
        assert_eq!((wc[0].wr_id, wc[0].status), (99, WcStatus::Success), "{wc:?}");
    }

    /// The receive completions that arrive within [`QUIET`] (after the first, if any).
    fn received(&self) -> Vec<WorkCompletion> {
        poll_quiet(&self.cq, QUIET).unwrap()
    }
}

fn two_devices(profile: Profile) -> (Side, Side) {
    let (a, b) = common::two_devices(profile, 256);
    (Side::new(a), Side::new(b))
}

#[test]
fn a_group_datagram_reaches_every_attached_qp_of_every_device() {
    let mgid = group();
    let (a, b) = two_devices(Profile::Portable);
    let sender = a.qp(QKEY, 0);
    let a1 = a.qp(QKEY, 0);
    let stranger = a.qp(QKEY, 0);
    let b1 = b.qp(QKEY, 0);
    let b2 = b.qp(QKEY, 0);
    let other_key = b.qp(0x2222, 0);
    for qp in [&a1, &b1, &b2, &other_key] {
        qp.attach_mcast(&mgid, MLID).unwrap();
    }
    for (i, qp) in [&a1, &stranger, &sender].into_iter().enumerate() {
        a.recv(qp, i);
    }
    for (i, qp) in [&b1, &b2, &other_key].into_iter().enumerate() {
        b.recv(qp, i);
    }
    let ah = a.group_ah(mgid);
    a.send(&sender, &ah, b"to the group");
    let on_a = a.received();
    assert_eq!(on_a.len(), 1, "{on_a:?}");
    assert_eq!((on_a[0].qp_num, on_a[0].src_qp), (a1.qp_num(), sender.qp_num()));
    let mut on_b: Vec<u32> = b.received().iter().map(|w| w.qp_num).collect();
    on_b.sort();
    let mut want = vec![b1.qp_num(), b2.qp_num()];
    want.sort();
    assert_eq!(on_b, want);
    assert_eq!(b.ctx.query_port(1).unwrap().qkey_viol_cntr, 1);
    // Behind the GRH: the sender's GID, the group's as the destination.
    let wc = &on_a[0];
    assert!(wc.wc_flags.contains(WcFlags::GRH));
    assert_eq!(wc.byte_len as usize, GRH + 12);
    let mut grh = [0u8; GRH];
    a.mr.read(0, &mut grh).unwrap();
    assert_eq!(&grh[8..24], &a.ctx.query_gid(1, 1).unwrap().0);
    assert_eq!(&grh[24..40], &mgid.0);
    let mut payload = [0u8; 12];
    a.mr.read(GRH, &mut payload).unwrap();
    assert_eq!(&payload, b"to the group");
}

/// A capture (`SimContext::capture_to`) holds a multicast datagram once, as the packet a
/// fabric carries: to the group's IP, its Ethernet multicast MAC and QP 0xFFFFFF, from
/// the sender's port, whatever the number of member devices and QPs; tshark reads it.
#[test]
fn a_group_datagram_is_captured_once_to_the_group() {
    use backend_sim::capture::{Buffer, Snaplen};
    use backend_sim_proto::capture::{parse::parse, read::packets};
    let mgid = group_v4();
    let (a, b) = two_devices(Profile::Rxe);
    let buf = Buffer::new();
    let cap = a.ctx.capture_to(buf.clone(), Snaplen::Whole).unwrap();
    let sender = a.qp(QKEY, 0);
    let (a1, b1, b2) = (a.qp(QKEY, 0), b.qp(QKEY, 0), b.qp(QKEY, 0));
    for qp in [&a1, &b1, &b2] {
        qp.attach_mcast(&mgid, MLID).unwrap();
    }
    a.recv(&a1, 0);
    b.recv(&b1, 0);
    b.recv(&b2, 1);
    a.send(&sender, &a.group_ah(mgid), b"to the group");
    assert_eq!(b.received().len(), 2);
    cap.flush();
    let file = buf.contents();
    let caps = packets(&file).unwrap();
    let sent: Vec<_> = caps.iter().filter(|c| c.ip.is_some()).collect();
    assert_eq!(sent.len(), 1, "one packet to the group");
    let p = parse(sent[0].data, sent[0].ip.unwrap(), sent[0].orig_len).unwrap();
    let v4 = std::net::Ipv6Addr::from(mgid.0).to_ipv4_mapped().unwrap();
    assert_eq!(p.dst, std::net::IpAddr::V4(v4));
    assert_eq!(p.headers.bth.dst_qpn, MULTICAST_QPN);
    assert_eq!(p.payload_len, 12);
    assert_eq!(p.icrc_ok, Some(true));
    let o = v4.octets();
    assert_eq!(&sent[0].data[..6], &[0x01, 0x00, 0x5e, o[1] & 0x7f, o[2], o[3]]);
    let rows = capture_judge::well_formed_of(&file, &["infiniband.bth.destqp"]);
    assert!(
        rows.iter().any(|r| r[0] == format!("{MULTICAST_QPN:#x}")),
        "{rows:?}"
    );
}

#[test]
fn the_sender_receives_its_own_unless_it_blocks_it() {
    let mgid = group();
    let (a, _b) = two_devices(Profile::Mlx5);
    let sender = a.qp(QKEY, 0);
    let blocking = a.qp(QKEY, QP_CREATE_BLOCK_SELF_MCAST_LB);
    for qp in [&sender, &blocking] {
        qp.attach_mcast(&mgid, MLID).unwrap();
    }
    a.recv(&sender, 0);
    a.recv(&blocking, 1);
    let ah = a.group_ah(mgid);
    a.send(&sender, &ah, b"one");
    let got: Vec<(u32, u32)> = a.received().iter().map(|w| (w.qp_num, w.src_qp)).collect();
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(got.contains(&(sender.qp_num(), sender.qp_num())));
    assert!(got.contains(&(blocking.qp_num(), sender.qp_num())));
    a.recv(&sender, 0);
    a.send(&blocking, &ah, b"two");
    let got: Vec<(u32, u32)> = a.received().iter().map(|w| (w.qp_num, w.src_qp)).collect();
    assert_eq!(got, vec![(sender.qp_num(), blocking.qp_num())]);
    // The rxe profile's device takes no create flag.
    let (r, _) = two_devices(Profile::Rxe);
    let e =
        r.pd.create_qp(
            &QpInitAttr::ud(&r.cq, &r.cq, QpCap::new(4, 4)).with_create_flags(QP_CREATE_BLOCK_SELF_MCAST_LB),
        )
        .err()
        .map(|e| e.errno());
    assert_eq!(e, Some(libc::EOPNOTSUPP));
}

/// Two devices, a sender on the first and a QP of the second attached to `mgid`, which
/// received the group's first datagram; the sender's address handle to the group.
fn a_sender_and_a_member(mgid: Gid) -> (Side, Side, SimQp, SimQp, backend_sim::SimAh) {
    let (a, b) = two_devices(Profile::Portable);
    let sender = a.qp(QKEY, 0);
    let b1 = b.qp(QKEY, 0);
    b1.attach_mcast(&mgid, MLID).unwrap();
    let ah = a.group_ah(mgid);
    b.recv(&b1, 0);
    a.send(&sender, &ah, b"first");
    assert_eq!(b.received().len(), 1);
    (a, b, sender, b1, ah)
}

#[test]
fn detaching_and_dropping_end_a_membership() {
    let mgid = group();
    let (a, b, sender, b1, ah) = a_sender_and_a_member(mgid);
    b1.detach_mcast(&mgid, MLID).unwrap();
    assert_eq!(b1.detach_mcast(&mgid, MLID).unwrap_err().errno(), libc::EINVAL);
    b.recv(&b1, 0);
    a.send(&sender, &ah, b"second");
    assert!(b.received().is_empty());
    b1.attach_mcast(&mgid, MLID).unwrap();
    drop(b1);
    let b2 = b.qp(QKEY, 0);
    b.recv(&b2, 0);
    a.send(&sender, &ah, b"third");
    assert!(b.received().is_empty());
    assert_eq!(
        b.ctx.counters().ud_dropped,
        0,
        "a device without members is not sent to"
    );
}

#[test]
fn a_device_gets_one_copy_for_all_its_members() {
    let mgid = group_v4();
    let (a, b) = two_devices(Profile::Rxe);
    let sender = a.qp(QKEY, 0);
    let members: Vec<SimQp> = (0..4).map(|_| b.qp(QKEY, 0)).collect();
    for (i, qp) in members.iter().enumerate() {
        qp.attach_mcast(&mgid, 0).unwrap();
        b.recv(qp, i);
    }
    let ah = a.group_ah(mgid);
    a.send(&sender, &ah, b"x");
    let got = b.received();
    assert_eq!(got.len(), 4, "{got:?}");
    // RoCE: the IPv4 header, to the group's address.
    let mut grh = [0u8; GRH];
    b.mr.read(0, &mut grh).unwrap();
    assert_eq!(grh[20], 0x45);
    assert_eq!(&grh[36..40], &mgid.0[12..16]);
}

/// A member device whose LID changes stays a member (a switch forwards a group to a
/// port, whatever its LID): the group's next datagram still reaches its QP.
#[test]
fn a_member_whose_lid_changes_still_receives_the_group() {
    let (a, b, sender, b1, ah) = a_sender_and_a_member(group());
    b.ctx.faults().change_lid().unwrap();
    b.recv(&b1, 1);
    a.send(&sender, &ah, b"after");
    let got = b.received();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!((got[0].wr_id, got[0].status), (1, WcStatus::Success));
}
