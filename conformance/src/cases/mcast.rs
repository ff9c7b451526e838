//! UD multicast (`man ibv_attach_mcast`; IBA 10.5 and 9.6.1.4; the kernel's
//! `ib_attach_mcast()`): only a UD QP joins, only a multicast GID (and on InfiniBand a
//! multicast LID) names a group, a datagram sent to the group reaches every attached QP
//! and no other, each receiver checks its own Q_Key, the receive holds the GRH whose
//! destination is the group, and a QP that detached receives no more.
//!
//! On a RoCE port the cases also join the group's IPv4 address at the IP level for their
//! duration, as rdma_cm's `rdma_join_multicast` does (cma.c `cma_igmp_send()`): rxe hands
//! a group's datagram to the IP stack (rxe_net.c `rxe_send()`, its loopback shortcut is
//! for unicast only), which loops a copy back to the host's own rxe only if the host is a
//! member (`ip_mc_output()`); `ibv_attach_mcast` alone joins at the link level.

use verbs_api::{
    AhAttr, Backend, Context, Gid, GlobalRoute, LinkLayer, MemoryRegion, ProtectionDomain, QpInitAttr,
    QueuePair, RecvWr, SendWr, WcFlags, WcStatus, MULTICAST_QPN,
};

use super::case;
use super::ud::{UdSetup, GRH, QKEY, QUIET};
use crate::env::ud_to_rts;
use crate::{ensure, ensure_eq, CaseResult, Env, Failure, Outcome};

pub fn list<B: Backend>() -> Vec<crate::Case<B>> {
    vec![
        case!(
            "mcast.attach-checks",
            "attach_mcast refuses (EINVAL) a GID that is not multicast and a QP that is not UD; detaching a group not joined is EINVAL",
            "man ibv_attach_mcast; Linux ib_attach_mcast()/ib_detach_mcast() (rdma_is_multicast_addr, IB_QPT_UD)",
            attach_checks,
            requires [Ud]
        ),
        case!(
            "mcast.deliver",
            "a datagram to a group reaches each attached QP once (src_qp the sender, IBV_WC_GRH, the GRH's destination the group) and no QP that is not attached",
            "IBA 10.5 (multicast), 9.6.1.4; man ibv_attach_mcast, man ibv_poll_cq (IBV_WC_GRH)",
            deliver,
            requires [Ud]
        ),
        case!(
            "mcast.qkey",
            "each member checks the datagram's Q_Key against its own: the member with another Q_Key receives nothing",
            "IBA 10.2.4 C10-15 (Q_Key checked at each receiving QP), 10.5",
            qkey,
            requires [Ud]
        ),
        case!(
            "mcast.detach",
            "a QP that detached from the group receives none of its datagrams; the members left still do",
            "man ibv_detach_mcast",
            detach,
            requires [Ud]
        ),
    ]
}

/// A group of this run's own (tests and other runs on the host use others), and its LID:
/// on an Ethernet (RoCE) port an IPv4 multicast address as RoCE v2 names groups (the
/// LID unused), on InfiniBand an IPv6-style MGID and a multicast LID.
fn group<B: Backend>(env: &Env<B>) -> Result<(Gid, u16), Failure> {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        ^ (std::process::id() as u64) << 32;
    let r = t.to_le_bytes();
    if env.ctx.query_port(1)?.link_layer == LinkLayer::Ethernet {
        Ok((Gid::from(std::net::Ipv4Addr::new(239, r[0], r[1], r[2])), 0))
    } else {
        let mut g = [0u8; 16];
        g[0] = 0xff;
        g[1] = 0x12;
        g[8..].copy_from_slice(&r);
        Ok((Gid(g), 0xc001))
    }
}

/// On a RoCE port, the host's IP-level membership of the group while it lives
/// ([`verbs_api::mcast::ip_join`]); `None` where there is nothing to join, or the join
/// failed (the delivery checks then say what did not arrive).
fn ip_join<B: Backend>(env: &Env<B>, mgid: &Gid) -> Option<std::net::UdpSocket> {
    let local = env.ctx.query_gid(1, env.cfg.gid_index as u32).ok()?;
    verbs_api::mcast::ip_join(mgid, &local).ok().flatten()
}

/// `n` receivers (QPs beside `u`'s receiver, on `u`'s receive CQ) with Q_Keys `qkeys`,
/// and an address handle of `u`'s to group `(mgid, mlid)`.
fn members<B: Backend>(
    env: &Env<B>,
    u: &UdSetup<B>,
    qkeys: &[u32],
    (mgid, mlid): (Gid, u16),
) -> Result<Members<B>, Failure> {
    let params = env.params();
    let mut v = Vec::new();
    let join = ip_join(env, &mgid);
    for (i, k) in qkeys.iter().enumerate() {
        let q =
            u.pd.create_qp(&QpInitAttr::ud(&u.cq_r, &u.cq_r, env.opts().cap))?;
        ud_to_rts(&q, &params, *k, 0x40 + i as u32)?;
        q.attach_mcast(&mgid, mlid)?;
        v.push(q);
    }
    let ah = u.pd.create_ah(&AhAttr {
        grh: GlobalRoute {
            dgid: mgid,
            sgid_index: env.cfg.gid_index,
            hop_limit: 1,
            ..Default::default()
        },
        dlid: mlid,
        is_global: true,
        port_num: 1,
        ..Default::default()
    })?;
    Ok(Members {
        qps: v,
        ah,
        _join: join,
    })
}

/// The members [`members`] made, the address handle to their group, and the host's
/// IP-level membership on RoCE.
struct Members<B: Backend> {
    qps: Vec<B::Qp>,
    ah: B::Ah,
    _join: Option<std::net::UdpSocket>,
}

/// Posts a receive of [`GRH`] + 64 bytes in slot `i` (of 256 bytes) of `u.dst` on each
/// QP of `qps`, wr_id `i`.
fn post_each<B: Backend>(u: &UdSetup<B>, qps: &[B::Qp]) -> Result<(), Failure> {
    for (i, q) in qps.iter().enumerate() {
        q.post_recv(&[RecvWr::new(i as u64, &[u.dst.sge(i * 256, GRH + 64)?])])?;
    }
    Ok(())
}

/// Sends 64 bytes from `u.s[0]` to the group through `ah`; the WR must complete SUCCESS.
fn send<B: Backend>(env: &Env<B>, u: &UdSetup<B>, ah: &B::Ah, wr_id: u64) -> Result<(), Failure> {
    u.s[0].post_send(&[SendWr::send(wr_id, &[u.src.sge(0, 64)?])
        .signaled()
        .ud(ah, MULTICAST_QPN, QKEY)])?;
    let wc = env.wait1(&u.cq_s)?;
    ensure_eq!(
        (wc.wr_id, wc.status),
        (wr_id, WcStatus::Success),
        "the send to the group"
    );
    Ok(())
}

/// The receive completions within [`QUIET`] of the first (or none), as (QP, wr_id).
fn arrived<B: Backend>(env: &Env<B>, u: &UdSetup<B>) -> Result<Vec<(u32, u64)>, Failure> {
    let got = env.quiet(&u.cq_r, QUIET)?;
    let mut v = Vec::new();
    for wc in got {
        ensure_eq!(
            wc.status,
            WcStatus::Success,
            "a member's receive (QP {:#x})",
            wc.qp_num
        );
        ensure_eq!(wc.src_qp, u.s[0].qp_num(), "src_qp of a member's receive");
        ensure!(
            wc.wc_flags.contains(WcFlags::GRH),
            "a member's receive lacks IBV_WC_GRH: {wc:?}"
        );
        ensure_eq!(wc.byte_len as usize, GRH + 64, "byte_len of a member's receive");
        v.push((wc.qp_num, wc.wr_id));
    }
    v.sort_unstable();
    Ok(v)
}

fn attach_checks<B: Backend>(env: &Env<B>) -> CaseResult {
    let u = UdSetup::new(env, 1)?;
    let (mgid, mlid) = group(env)?;
    let errno = |r: verbs_api::Result<()>| r.err().map(|e| e.errno());
    let own = env.ctx.query_gid(1, env.cfg.gid_index as u32)?;
    let e = errno(u.r.attach_mcast(&own, mlid));
    env.observe("attach of a unicast GID", format_args!("{e:?}"));
    ensure_eq!(
        e,
        Some(libc::EINVAL),
        "attach_mcast of the port's own (unicast) GID"
    );
    let p = env.pair(&env.opts())?;
    let e = errno(p.a.attach_mcast(&mgid, mlid));
    env.observe("attach of an RC QP", format_args!("{e:?}"));
    ensure_eq!(e, Some(libc::EINVAL), "attach_mcast of an RC QP");
    let e = errno(u.r.detach_mcast(&mgid, mlid));
    env.observe("detach of a group not joined", format_args!("{e:?}"));
    ensure_eq!(
        e,
        Some(libc::EINVAL),
        "detach_mcast of a group the QP did not join"
    );
    u.r.attach_mcast(&mgid, mlid)?;
    u.r.detach_mcast(&mgid, mlid)?;
    Ok(Outcome::Pass)
}

fn deliver<B: Backend>(env: &Env<B>) -> CaseResult {
    let u = UdSetup::new(env, 1)?;
    let g = group(env)?;
    let Members { qps: m, ah, _join } = members(env, &u, &[QKEY, QKEY], g)?;
    post_each(&u, &m)?;
    // The setup's own receiver, not attached, has a receive posted too.
    u.post(9, 4096, 64)?;
    u.src.write(0, &crate::env::pattern(64, 3))?;
    send(env, &u, &ah, 1)?;
    let got = arrived(env, &u)?;
    let mut want = vec![(m[0].qp_num(), 0), (m[1].qp_num(), 1)];
    want.sort_unstable();
    ensure_eq!(got, want, "the members' receives (QP, wr_id)");
    for i in 0..2 {
        let buf = crate::env::read_back(&u.dst, i * 256, GRH + 64)?;
        ensure!(
            buf[GRH..] == crate::env::pattern(64, 3)[..],
            "member {i}: the payload differs"
        );
        // IBA's GRH ends with the DGID; RoCE v2 over IPv4 puts an IPv4 header in the last
        // 20 bytes, its destination address the group's.
        let mgid = g.0 .0;
        let dst = if g.0.to_ipv4_mapped().is_some() {
            buf[36..40] == mgid[12..]
        } else {
            buf[24..40] == mgid
        };
        ensure!(
            dst,
            "member {i}: the GRH's destination is not the group: {:02x?}",
            &buf[..GRH]
        );
    }
    Ok(Outcome::Pass)
}

fn qkey<B: Backend>(env: &Env<B>) -> CaseResult {
    let u = UdSetup::new(env, 1)?;
    let g = group(env)?;
    let Members { qps: m, ah, _join } = members(env, &u, &[QKEY, QKEY ^ 0x0f0f], g)?;
    post_each(&u, &m)?;
    send(env, &u, &ah, 1)?;
    let got = arrived(env, &u)?;
    ensure_eq!(
        got,
        vec![(m[0].qp_num(), 0)],
        "the receives (the member with another Q_Key has none)"
    );
    Ok(Outcome::Pass)
}

fn detach<B: Backend>(env: &Env<B>) -> CaseResult {
    let u = UdSetup::new(env, 1)?;
    let g = group(env)?;
    let Members { qps: m, ah, _join } = members(env, &u, &[QKEY, QKEY], g)?;
    post_each(&u, &m)?;
    m[1].detach_mcast(&g.0, g.1)?;
    send(env, &u, &ah, 1)?;
    let got = arrived(env, &u)?;
    ensure_eq!(
        got,
        vec![(m[0].qp_num(), 0)],
        "the receives after one member detached"
    );
    Ok(Outcome::Pass)
}
