//! Connection setup, over and over: QP pairs that are connected again and again (RESET,
//! then INIT → RTR → RTS) while both ends post at once, with setups delayed by fault
//! injection and connections broken right after setup, always end with one working
//! connection per pair, and every WR completes successfully. A QP whose connection is gone
//! while it has work (on either side of the pair: only one side sets connections up)
//! gets one again.
use std::time::Duration;

use backend_sim::faults::BreakPoint;
use backend_sim::{SimBackend, SimContext, SimCq, SimMr, SimPd, SimQp};
use verbs_api::*;

/// How long one round's completions may take before the test calls them lost.
const T: Duration = Duration::from_secs(10);
/// WRITEs each QP posts per round: the requester has many outstanding when its
/// connection comes up (or breaks), as perftest's does.
const WRS: usize = 16;
/// Bytes per WRITE.
const LEN: usize = 4096;
/// QPs per device (perftest's `-q 2`).
const QPS: usize = 2;
/// How long a setup waits once its hello is answered, by turns (fault injection): both,
/// one or neither end of a connection late, by less or more than a setup takes.
const DELAYS: [Duration; 5] = [
    Duration::ZERO,
    Duration::from_micros(100),
    Duration::ZERO,
    Duration::from_micros(700),
    Duration::from_millis(3),
];

/// The pairs' attributes: a local ACK timeout of 268 ms (code 16), so that `retry_cnt`
/// runs out in about two seconds without a connection, not in the half second of the
/// default, which a machine busy with other work can stall a thread for.
fn params() -> RcParams {
    RcParams {
        timeout: 16,
        ..RcParams::default()
    }
}

/// One device with [`QPS`] RC QPs on one CQ, and the memory they write from and to.
struct Side {
    ctx: SimContext,
    _pd: SimPd,
    cq: SimCq,
    qps: Vec<SimQp>,
    src: SimMr,
    dst: SimMr,
}

impl Side {
    fn new(sim: &SimBackend, name: &str) -> Side {
        let ctx = sim.open(name).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq((QPS * WRS * 2) as u32, None).unwrap();
        let cap = QpCap::new(WRS as u32, 1);
        let qps = (0..QPS)
            .map(|_| pd.create_qp(&QpInitAttr::rc(&cq, &cq, cap)).unwrap())
            .collect();
        let src = pd.reg_mr(QPS * WRS * LEN, AccessFlags::LOCAL_WRITE).unwrap();
        let dst = pd
            .reg_mr(
                QPS * WRS * LEN,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            )
            .unwrap();
        Side {
            ctx,
            _pd: pd,
            cq,
            qps,
            src,
            dst,
        }
    }

    /// Each QP's endpoint with the PSN of `round`.
    fn endpoints(&self, round: usize, p: &RcParams) -> Vec<Endpoint> {
        let psn = |j: usize| (round as u32).wrapping_mul(0x9e37) ^ (j as u32 * 0x1111);
        self.qps
            .iter()
            .enumerate()
            .map(|(j, qp)| local_endpoint(&self.ctx, qp, p, psn(j)).unwrap())
            .collect()
    }

    /// Every QP to RESET.
    fn reset(&self) {
        let attr = QpAttr {
            qp_state: QpState::Reset,
            ..Default::default()
        };
        for qp in &self.qps {
            qp.modify(&attr, QpAttrMask::STATE).unwrap();
        }
    }

    /// Each QP's setups delayed by its turn of [`DELAYS`] in `round` (`salt` tells the
    /// two sides apart).
    fn delay_setups(&self, round: usize, salt: usize) {
        for (j, qp) in self.qps.iter().enumerate() {
            let d = DELAYS[(round + 3 * j + salt) % DELAYS.len()];
            self.ctx.faults().delay_setup(qp.qp_num(), d).unwrap();
        }
    }

    /// [`WRS`] signaled WRITEs on every QP, into the peer's `dst`.
    fn post_writes(&self, peer: &SimMr) {
        for (j, qp) in self.qps.iter().enumerate() {
            let sges: Vec<Sge> = (0..WRS)
                .map(|k| self.src.sge((j * WRS + k) * LEN, LEN).unwrap())
                .collect();
            let wrs: Vec<SendWr> = (0..WRS)
                .map(|k| {
                    let at = ((j * WRS + k) * LEN) as u64;
                    SendWr::write((j * WRS + k) as u64, &sges[k..k + 1], peer.remote().at(at)).signaled()
                })
                .collect();
            qp.post_send(&wrs).unwrap();
        }
    }

    /// Every WRITE of the round completed successfully (`tight`: polled in a loop, or
    /// now and then, which leaves the device's progress thread to its epoll set).
    fn completes(&self, tight: bool, what: &str) {
        let n = QPS * WRS;
        let w = if tight {
            poll_n(&self.cq, n, T).unwrap_or_else(|e| panic!("{what}: {e}"))
        } else {
            let deadline = std::time::Instant::now() + T;
            let mut got = Vec::new();
            while got.len() < n {
                assert!(
                    std::time::Instant::now() < deadline,
                    "{what}: {} of {n} completions arrived ({:?})",
                    got.len(),
                    got.iter().map(|w: &WorkCompletion| w.status).collect::<Vec<_>>()
                );
                std::thread::sleep(Duration::from_micros(500));
                got.extend(poll_quiet(&self.cq, Duration::ZERO).unwrap());
            }
            got
        };
        assert_eq!(w.len(), n, "{what}");
        for c in &w {
            assert_eq!(c.status, WcStatus::Success, "{what}: {c:?}");
        }
    }
}

/// Two devices with [`QPS`] QPs each, QP j of one paired with QP j of the other.
fn sides() -> (SimBackend, Side, Side) {
    let sim = SimBackend::default();
    let a = Side::new(&sim, "sim0");
    let b = Side::new(&sim, "sim1");
    (sim, a, b)
}

/// Connects both sides' QPs to each other for `round`, from RESET (a fresh connection
/// to set up), with their setups delayed by their turns of [`DELAYS`].
fn connect(a: &Side, b: &Side, round: usize, p: &RcParams) {
    a.reset();
    b.reset();
    a.delay_setups(round, 0);
    b.delay_setups(round, 2);
    let (ea, eb) = (a.endpoints(round, p), b.endpoints(round, p));
    for j in 0..QPS {
        connect_rc(&a.qps[j], p, ea[j].psn, &eb[j]).unwrap();
        connect_rc(&b.qps[j], p, eb[j].psn, &ea[j]).unwrap();
    }
}

/// Hundreds of setups of two QP pairs whose ends both post at once, right after RTS,
/// with each end's setup delayed by turns: every round ends with every WRITE of both
/// sides completed successfully. A setup that installed a connection the data path had
/// already closed (it serviced the connection before it was the QP's, found it stale and
/// closed it) left the QP resending into nothing until `retry_cnt` ran out, and its peer
/// waiting for a setup that never came.
#[test]
fn pairs_set_up_over_and_over_while_both_ends_post_always_connect() {
    let (_sim, a, b) = sides();
    let p = params();
    for round in 0..1000 {
        connect(&a, &b, round, &p);
        if round % 3 == 2 {
            // Again at once: the setups of the first connection are still under way,
            // and race those of the second.
            connect(&a, &b, round, &p);
        }
        a.post_writes(&b.dst);
        b.post_writes(&a.dst);
        let tight = round % 2 == 0;
        a.completes(tight, &format!("round {round}, sim0"));
        b.completes(!tight, &format!("round {round}, sim1"));
    }
}

/// A connection broken while both ends have WRITEs outstanding, right after it was set
/// up, by turns on either end of the pair (only one of which sets connections up) and at
/// each point of a request, with setups delayed: it is set up again every time, and
/// every WRITE completes successfully.
#[test]
fn a_connection_broken_with_work_outstanding_is_always_set_up_again() {
    let (_sim, a, b) = sides();
    let p = params();
    let points = [
        None,
        Some(BreakPoint::BeforeRequest),
        Some(BreakPoint::MidRequest),
        Some(BreakPoint::AfterRequest),
    ];
    for round in 0..300 {
        connect(&a, &b, round, &p);
        // Which end breaks, and how: dropped at once (`None`) or at a point of its
        // next request.
        let (end, other) = if round % 2 == 0 { (&a, &b) } else { (&b, &a) };
        let j = (round / 2) % QPS;
        let point = points[(round / 4) % points.len()];
        let faults = end.ctx.faults();
        let qpn = end.qps[j].qp_num();
        if let Some(point) = point {
            faults.break_connection(qpn, point).unwrap();
        }
        end.post_writes(&other.dst);
        other.post_writes(&end.dst);
        if point.is_none() {
            // As soon as there is a connection to drop.
            let (before, deadline) = (faults.stats().breaks, std::time::Instant::now() + T);
            while faults.stats().breaks == before {
                assert!(
                    std::time::Instant::now() < deadline,
                    "round {round}: never connected"
                );
                faults.drop_connections(qpn).unwrap();
                std::thread::yield_now();
            }
        }
        let what = format!("round {round}: QP {j} of sim{} broke ({point:?})", round % 2);
        end.completes(round % 3 == 0, &format!("{what}, its side"));
        other.completes(round % 3 != 0, &format!("{what}, the other side"));
        faults.clear(qpn).unwrap();
    }
}

/// A QP connected to itself sets up its connection and accepts it itself, each end
/// with its setup delayed: it connects every time, and its WRITEs complete. When the
/// two ends counted their setups in one count, the accepting end found the count moved
/// by the connecting end's setup of the same connection, took its own for a stale one
/// and closed it, and the QP set up and closed connections until `retry_cnt` ran out.
#[test]
fn a_qp_connected_to_itself_connects_with_its_setups_delayed() {
    let sim = SimBackend::default();
    let a = Side::new(&sim, "sim0");
    let p = params();
    for round in 0..100 {
        a.reset();
        a.delay_setups(round, 0);
        let me = a.endpoints(round, &p);
        for (qp, e) in a.qps.iter().zip(&me) {
            connect_rc(qp, &p, e.psn, e).unwrap();
        }
        a.post_writes(&a.dst);
        a.completes(round % 2 == 0, &format!("round {round}"));
    }
}
