//! The fast path through the verbs, two QPs of one device in one process (a same-host
//! connection over rings, the copies `process_vm_writev` into this process): what the
//! responder's rules give a placed WRITE, and refusals that end as without the path.

use std::time::Duration;

use verbs_api::{
    connect_rc, local_endpoint, poll_n, AccessFlags, Backend, CompletionQueue, Context, MemoryRegion,
    ProtectionDomain, QpCap, QpInitAttr, QueuePair, RcParams, RecvWr, SendWr, Sge, WcOpcode, WcStatus,
    WorkCompletion,
};

use crate::same_host::Transport;
use crate::{SimBackend, SimConfig};

const LEN: usize = 64 << 10;
const WAIT: Duration = Duration::from_secs(10);

/// One device with a PD and a CQ, and two RC QPs of it connected to each other.
pub(super) struct Pair {
    pub ctx: crate::SimContext,
    pub pd: crate::SimPd,
    pub cq: crate::SimCq,
    pub a: crate::SimQp,
    pub b: crate::SimQp,
}

fn pair(transport: Transport) -> Pair {
    pair_with(transport, &RcParams::default())
}

/// [`pair`], with `b` connected with `pb`'s attributes.
fn pair_with(transport: Transport, pb: &RcParams) -> Pair {
    let config = SimConfig {
        transport,
        ..SimConfig::default()
    };
    pair_in(config, pb)
}

/// [`pair`] on a device of `config`, with `b` connected with `pb`'s attributes.
pub(super) fn pair_in(config: SimConfig, pb: &RcParams) -> Pair {
    let ctx = SimBackend::new(config).open("sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let cap = QpCap::new(16, 4);
    let a = pd.create_qp(&QpInitAttr::rc(&cq, &cq, cap)).unwrap();
    let b = pd.create_qp(&QpInitAttr::rc(&cq, &cq, cap)).unwrap();
    let p = RcParams::default();
    let ea = local_endpoint(&ctx, &a, &p, 1).unwrap();
    let eb = local_endpoint(&ctx, &b, &p, 2).unwrap();
    connect_rc(&a, &p, 1, &eb).unwrap();
    connect_rc(&b, pb, 2, &ea).unwrap();
    Pair { ctx, pd, cq, a, b }
}

impl Pair {
    fn placed(&self) -> u64 {
        self.ctx.dev.onesided.as_ref().map_or(0, |o| o.placed())
    }

    /// Posts `wr` on `a` and returns every completion up to `a`'s, in order.
    fn run(&self, wr: &SendWr<'_>) -> Vec<WorkCompletion> {
        self.a.post_send(std::slice::from_ref(wr)).unwrap();
        let mut got = Vec::new();
        while !got.iter().any(|w: &WorkCompletion| w.qp_num == self.a.qp.qpn) {
            got.extend(poll_n(&self.cq, 1, WAIT).unwrap());
        }
        got
    }
}

/// A fast-path WRITE_WITH_IMM consumes exactly one receive, which completes with the
/// immediate and the length; the data is in place when it does; the next receive stays
/// posted. Then a plain WRITE goes the same way.
#[test]
fn a_placed_write_with_imm_consumes_one_receive_and_carries_the_immediate() {
    let p = pair(Transport::Auto);
    let src = p.pd.reg_mr(LEN, AccessFlags::LOCAL_WRITE).unwrap();
    let dst =
        p.pd.reg_mr(LEN, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
    let pattern: Vec<u8> = (0..LEN).map(|i| (i * 7 + i / 251) as u8).collect();
    src.write(0, &pattern).unwrap();
    let recv_sge = [Sge::new(dst.addr(), 0, dst.lkey())];
    p.b.post_recv(&[RecvWr::new(21, &recv_sge), RecvWr::new(22, &recv_sge)])
        .unwrap();
    let sge = [Sge::new(src.addr(), LEN as u32, src.lkey())];
    let before = p.placed();
    let wr = SendWr::write_with_imm(1, &sge, (dst.addr(), dst.rkey()), 0xfeed).signaled();
    p.a.post_send(&[wr]).unwrap();
    let got = poll_n(&p.cq, 2, WAIT).unwrap();
    let seen: Vec<_> = got
        .iter()
        .map(|w| (w.qp_num, w.wr_id, w.status, w.opcode, w.imm_data, w.byte_len))
        .collect();
    let (qa, qb) = (p.a.qp.qpn, p.b.qp.qpn);
    let len = LEN as u32;
    for want in [
        (qa, 1, WcStatus::Success, WcOpcode::RdmaWrite, 0, len),
        (qb, 21, WcStatus::Success, WcOpcode::RecvRdmaWithImm, 0xfeed, len),
    ] {
        assert!(seen.contains(&want), "{want:?} not in {seen:?}");
    }
    assert_eq!(p.placed(), before + 1, "the WRITE did not take the fast path");
    let mut landed = vec![0u8; LEN];
    dst.read(0, &mut landed).unwrap();
    assert!(landed == pattern, "the placed bytes differ");
    std::thread::sleep(Duration::from_millis(50));
    let mut more = [WorkCompletion::default(); 4];
    assert_eq!(
        p.cq.poll(&mut more).unwrap(),
        0,
        "a second receive completed: {more:?}"
    );
    assert_eq!(
        p.b.qp.inner.lock().qp.rq_posted(),
        1,
        "receive 22 must still be posted"
    );
}

/// What a WRITE the responder refuses ends with: its status and `vendor_err`.
fn refused(p: &Pair, what: &str) -> (WcStatus, u32) {
    let src = p.pd.reg_mr(LEN, AccessFlags::LOCAL_WRITE).unwrap();
    let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let dst =
        p.pd.reg_mr(
            LEN,
            if what == "no right" {
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ
            } else {
                rw
            },
        )
        .unwrap();
    let (rkey, len) = match what {
        "bad rkey" => (dst.rkey() ^ 0x100, LEN),
        "too long" => (dst.rkey(), LEN + 4096),
        _ => (dst.rkey(), LEN),
    };
    let big = p.pd.reg_mr(LEN + 4096, AccessFlags::LOCAL_WRITE).unwrap();
    let sge = match what {
        "too long" => [Sge::new(big.addr(), len as u32, big.lkey())],
        _ => [Sge::new(src.addr(), len as u32, src.lkey())],
    };
    let wr = SendWr::write(9, &sge, (dst.addr(), rkey)).signaled();
    let got = p.run(&wr);
    let w = got.iter().find(|w| w.wr_id == 9).unwrap();
    (w.status, w.vendor_err)
}

/// A WRITE the fast path's check refuses (an rkey of no region, a range past the
/// region, a region without REMOTE_WRITE) goes over the connection and ends with the
/// status and reason it ends with where there is no fast path (TCP).
#[test]
fn a_refused_check_ends_as_without_the_fast_path() {
    for what in ["bad rkey", "too long", "no right"] {
        let on = pair(Transport::Auto);
        let before = on.placed();
        let with = refused(&on, what);
        assert_eq!(on.placed(), before, "{what}: placed");
        let off = pair(Transport::Tcp);
        assert!(off.ctx.dev.onesided.is_none());
        let without = refused(&off, what);
        assert_eq!(with, without, "{what}");
        assert_eq!(with.0, WcStatus::RemAccessErr, "{what}");
    }
}

/// A READ to a QP that accepts no READs (`max_dest_rd_atomic` 0: no responder
/// resources) is not executed by the fast path: it ends with NAK-invalid request's
/// status and reason, as where there is no fast path (TCP).
#[test]
fn a_read_of_a_qp_without_responder_resources_ends_as_without_the_fast_path() {
    let none = RcParams {
        max_dest_rd_atomic: 0,
        ..RcParams::default()
    };
    let end = |transport| {
        let p = pair_with(transport, &none);
        let dst = p.pd.reg_mr(LEN, AccessFlags::LOCAL_WRITE).unwrap();
        let src =
            p.pd.reg_mr(LEN, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
                .unwrap();
        let sge = [Sge::new(dst.addr(), LEN as u32, dst.lkey())];
        let before = p.placed();
        let got = p.run(&SendWr::read(5, &sge, (src.addr(), src.rkey())).signaled());
        let w = got.iter().find(|w| w.wr_id == 5).unwrap();
        (w.status, w.vendor_err, p.placed() - before)
    };
    let with = end(Transport::Auto);
    let without = end(Transport::Tcp);
    assert_eq!(with, without);
    assert_eq!(with.0, WcStatus::RemInvReqErr);
}
