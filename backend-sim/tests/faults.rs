//! Fault injection: with each fault the outcome is what an HCA does (retries per
//! timeout/retry_cnt or rnr_retry, then the error, QP to ERR, the rest flushed), duplicates
//! are not executed twice, other connections are unaffected, and every signaled WR gets
//! exactly one completion.
use std::time::{Duration, Instant};

use backend_sim::faults::BreakPoint;
use backend_sim::{SimBackend, SimCq, SimQp};
use verbs_api::*;

mod common;

use common::PairSpec;

const T: Duration = Duration::from_secs(10);

/// A on sim0 (requester), B on sim1 (responder).
fn pair(timeout: u8, retry_cnt: u8, rnr_retry: u8) -> common::Pair {
    let spec = PairSpec {
        b: RcParams {
            min_rnr_timer: 1,
            ..RcParams::default()
        },
        cq_len: 256,
        psns: (10, 20),
        ..PairSpec::new(&RcParams::default(), QpCap::new(64, 64))
    };
    let p = common::Pair::build(spec, |_, _| {});
    // One WRITE through before any fault is armed, with the default budget: the
    // connection is up (its setup, a connect and the peer's check of the hello, is not
    // what a test injects into), and the test's budget, set after it, counts the fault
    // alone.
    let src = p.pd0.reg_mr(8, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = p
        .pd1
        .reg_mr(8, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    p.a.post_send(&[SendWr::write(u64::MAX, &[src.sge_all()], dst.remote().at(0)).signaled()])
        .unwrap();
    let w = poll_n(&p.cq0, 1, T).unwrap();
    assert!(w[0].is_ok(), "the pair's first WRITE: {w:?}");
    common::set_budget(&p.a, timeout, retry_cnt, rnr_retry);
    p
}

fn nothing_more(cq: &SimCq) {
    let extra = poll_quiet(cq, Duration::from_millis(100)).unwrap();
    assert!(extra.is_empty(), "extra completions: {extra:?}");
}

fn send_survives(point: BreakPoint, len: usize) {
    let p = pair(14, 7, 7);
    let src = p.pd0.reg_mr(len, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = p.pd1.reg_mr(len, AccessFlags::LOCAL_WRITE).unwrap();
    let data: Vec<u8> = (0..len as u32).map(|i| (i % 251) as u8).collect();
    src.write(0, &data).unwrap();
    // Warm the connection up, then break it on the next request.
    p.b.post_recv(&[RecvWr::new(1, &[dst.sge(0, 8).unwrap()])])
        .unwrap();
    p.a.post_send(&[SendWr::send(1, &[src.sge(0, 8).unwrap()]).signaled()])
        .unwrap();
    poll_n(&p.cq0, 1, T).unwrap();
    poll_n(&p.cq1, 1, T).unwrap();
    p.c0.faults().break_connection(p.a.qp_num(), point).unwrap();
    p.b.post_recv(&[RecvWr::new(2, &[dst.sge_all()])]).unwrap();
    p.a.post_send(&[SendWr::send(2, &[src.sge_all()]).signaled()])
        .unwrap();
    let s = poll_n(&p.cq0, 1, T).unwrap();
    let r = poll_n(&p.cq1, 1, T).unwrap();
    assert_eq!((s[0].wr_id, s[0].status), (2, WcStatus::Success), "{point:?}");
    assert_eq!(
        (r[0].wr_id, r[0].status, r[0].byte_len as usize),
        (2, WcStatus::Success, len),
        "{point:?}"
    );
    assert!(dst.to_vec() == data, "{point:?}: payload differs");
    assert_eq!(p.c0.faults().stats().breaks, 1);
    nothing_more(&p.cq0);
    nothing_more(&p.cq1);
}

#[test]
fn connection_breaks_before_a_send() {
    send_survives(BreakPoint::BeforeRequest, 4096);
}

#[test]
fn connection_breaks_in_the_middle_of_a_send() {
    send_survives(BreakPoint::MidRequest, 256 * 1024);
}

#[test]
fn connection_breaks_after_a_send() {
    send_survives(BreakPoint::AfterRequest, 4096);
}

/// A WR that waits behind its connection (not written yet) when the connection breaks,
/// on the QP that does not set connections up (the larger (GID, LID, QPN)), whose peer
/// will not set it up again (its QP is in ERR): nothing will carry the WR, and it must
/// still end as for lost packets (RETRY_EXC_ERR after the ACK timer's retries), not wait
/// for ever, exactly as a WR posted after the break does.
#[test]
fn a_wr_caught_by_a_break_before_it_left_times_out_on_the_passive_side() {
    let p = pair(10, 1, 7);
    let a_connects = (p.ea.gid, p.ea.lid, p.ea.qpn) < (p.eb.gid, p.eb.lid, p.eb.qpn);
    // The requester is the passive one (B's ACK timer has the defaults: 8 x ~67 ms).
    let (req, req_ctx, req_pd, req_cq, resp, resp_pd) = match a_connects {
        true => (&p.b, &p.c1, &p.pd1, &p.cq1, &p.a, &p.pd0),
        false => (&p.a, &p.c0, &p.pd0, &p.cq0, &p.b, &p.pd1),
    };
    let src = req_pd.reg_mr(8, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = resp_pd
        .reg_mr(8, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let err = QpAttr {
        qp_state: QpState::Err,
        ..Default::default()
    };
    resp.modify(&err, QpAttrMask::STATE).unwrap();
    req_ctx
        .faults()
        .break_connection(req.qp_num(), BreakPoint::BeforeRequest)
        .unwrap();
    req.post_send(&[SendWr::write(7, &[src.sge_all()], dst.remote().at(0)).signaled()])
        .unwrap();
    let w = poll_n(req_cq, 1, T).expect("the WRITE completes");
    assert_eq!((w[0].wr_id, w[0].status), (7, WcStatus::RetryExcErr), "{w:?}");
    assert_eq!(req_ctx.faults().stats().breaks, 1);
    assert_eq!(req.state().unwrap(), QpState::Err);
}

#[test]
fn atomic_resent_after_a_break_runs_once() {
    let p = pair(14, 7, 7);
    let word = p
        .pd1
        .reg_mr(8, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC)
        .unwrap();
    let res = p.pd0.reg_mr(8, AccessFlags::LOCAL_WRITE).unwrap();
    word.write_u64(0, 100).unwrap();
    for i in 0..3u64 {
        p.c0.faults()
            .break_connection(p.a.qp_num(), BreakPoint::AfterRequest)
            .unwrap();
        p.a.post_send(&[SendWr::fetch_and_add(i, &[res.sge_all()], word.remote().at(0), 1).signaled()])
            .unwrap();
        let w = poll_n(&p.cq0, 1, T).unwrap();
        assert_eq!((w[0].wr_id, w[0].status), (i, WcStatus::Success));
        assert_eq!(res.read_u64(0).unwrap(), 100 + i, "old value of add {i}");
    }
    assert_eq!(word.read_u64(0).unwrap(), 103, "each add ran exactly once");
    assert_eq!(p.c0.faults().stats().breaks, 3);
}

#[test]
fn write_with_imm_resent_after_a_break_consumes_one_receive() {
    let p = pair(14, 7, 7);
    let dst = p
        .pd1
        .reg_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let src = p.pd0.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    src.write(0, b"imm!").unwrap();
    p.b.post_recv(&[RecvWr::new(1, &[]), RecvWr::new(2, &[])])
        .unwrap();
    p.c0.faults()
        .break_connection(p.a.qp_num(), BreakPoint::AfterRequest)
        .unwrap();
    p.a.post_send(&[SendWr::write_with_imm(9, &[src.sge(0, 4).unwrap()], dst.remote().at(0), 77).signaled()])
        .unwrap();
    assert!(poll_n(&p.cq0, 1, T).unwrap()[0].is_ok());
    let r = poll_n(&p.cq1, 1, T).unwrap();
    assert_eq!((r[0].wr_id, r[0].imm()), (1, Some(77)));
    nothing_more(&p.cq1);
}

#[test]
fn stalled_responder_exhausts_retries_and_leaves_other_qps_alone() {
    let p = pair(10, 2, 7); // 4.2 ms x (1 + 2 retries)
    let q = pair(10, 2, 7);
    let dst = p
        .pd1
        .reg_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let src = p.pd0.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    p.c1.faults()
        .stall_responder(p.b.qp_num(), Duration::from_secs(2))
        .unwrap();
    let t0 = Instant::now();
    p.a.post_send(&[
        SendWr::write(1, &[src.sge(0, 8).unwrap()], dst.remote().at(0)).signaled(),
        SendWr::write(2, &[src.sge(0, 8).unwrap()], dst.remote().at(8)).signaled(),
    ])
    .unwrap();
    // Meanwhile another pair works normally.
    let qd = q
        .pd1
        .reg_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let qs = q.pd0.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    q.a.post_send(&[SendWr::write(5, &[qs.sge(0, 8).unwrap()], qd.remote().at(0)).signaled()])
        .unwrap();
    assert!(poll_n(&q.cq0, 1, T).unwrap()[0].is_ok());
    let w = poll_n(&p.cq0, 2, T).unwrap();
    assert_eq!((w[0].wr_id, w[0].status), (1, WcStatus::RetryExcErr));
    assert_eq!((w[1].wr_id, w[1].status), (2, WcStatus::WrFlushErr));
    // The connection was up all along: no errno in `vendor_err`.
    assert_eq!(w[0].vendor_err, 0);
    let took = t0.elapsed();
    assert!(
        took >= local_ack(10) * 3,
        "gave up after {took:?}, before 3 ACK timeouts"
    );
    assert!(
        took < Duration::from_secs(2),
        "waited for the stall to end ({took:?})"
    );
    assert_eq!(p.a.state().unwrap(), QpState::Err);
    nothing_more(&p.cq0);
}

fn local_ack(code: u8) -> Duration {
    verbs_api::timers::local_ack_timeout(code).unwrap()
}

/// A stall shorter than the ACK timeout (here 20 ms against 1.07 s) ends on time: the
/// WRITE completes when the stall ends, not when it is resent.
#[test]
fn short_stall_is_ridden_out() {
    let p = pair(18, 7, 7); // 1.07 s timeout
    let dst = p
        .pd1
        .reg_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let src = p.pd0.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    src.write(0, b"12345678").unwrap();
    p.c1.faults()
        .stall_responder(p.b.qp_num(), Duration::from_millis(20))
        .unwrap();
    let t0 = Instant::now();
    p.a.post_send(&[SendWr::write(1, &[src.sge(0, 8).unwrap()], dst.remote().at(0)).signaled()])
        .unwrap();
    let w = poll_n(&p.cq0, 1, T).unwrap();
    let took = t0.elapsed();
    assert!(w[0].is_ok(), "{w:?}");
    assert!(took < local_ack(18) / 2, "took {took:?}: waited for a resend");
    let mut b = [0u8; 8];
    dst.read(0, &mut b).unwrap();
    assert_eq!(&b, b"12345678");
}

#[test]
fn delayed_responses_beyond_the_timeout_complete_once() {
    let p = pair(10, 7, 7); // 4.2 ms timeout, responses 15 ms late: resends happen
    let word = p
        .pd1
        .reg_mr(8, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC)
        .unwrap();
    let res = p.pd0.reg_mr(8, AccessFlags::LOCAL_WRITE).unwrap();
    p.c1.faults()
        .delay_responses(p.b.qp_num(), Duration::from_millis(15))
        .unwrap();
    p.a.post_send(&[SendWr::fetch_and_add(1, &[res.sge_all()], word.remote().at(0), 5).signaled()])
        .unwrap();
    let w = poll_n(&p.cq0, 1, T).unwrap();
    assert!(w[0].is_ok(), "{w:?}");
    assert_eq!(word.read_u64(0).unwrap(), 5, "the add ran once despite resends");
    assert!(p.c1.faults().stats().delayed >= 1);
    nothing_more(&p.cq0);
}

#[test]
fn forced_rnr_follows_rnr_retry() {
    let p = pair(14, 7, 2);
    let dst = p.pd1.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let src = p.pd0.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    p.b.post_recv(&[RecvWr::new(1, &[dst.sge_all()]), RecvWr::new(2, &[dst.sge_all()])])
        .unwrap();
    // Two forced refusals: rnr_retry 2 rides them out.
    p.c1.faults().force_rnr(p.b.qp_num(), 2).unwrap();
    p.a.post_send(&[SendWr::send(1, &[src.sge(0, 8).unwrap()]).signaled()])
        .unwrap();
    assert!(poll_n(&p.cq0, 1, T).unwrap()[0].is_ok());
    assert_eq!(poll_n(&p.cq1, 1, T).unwrap()[0].wr_id, 1);
    // Three: one more than rnr_retry allows.
    p.c1.faults().force_rnr(p.b.qp_num(), 3).unwrap();
    p.a.post_send(&[SendWr::send(2, &[src.sge(0, 8).unwrap()]).signaled()])
        .unwrap();
    let w = poll_n(&p.cq0, 1, T).unwrap();
    assert_eq!((w[0].wr_id, w[0].status), (2, WcStatus::RnrRetryExcErr));
    assert_eq!(p.a.state().unwrap(), QpState::Err);
}

#[test]
fn dropped_connections_are_set_up_again() {
    let p = pair(14, 7, 7);
    let dst = p
        .pd1
        .reg_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let src = p.pd0.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    for i in 0..5u64 {
        p.a.post_send(&[SendWr::write(i, &[src.sge(0, 8).unwrap()], dst.remote().at(0)).signaled()])
            .unwrap();
        assert!(poll_n(&p.cq0, 1, T).unwrap()[0].is_ok(), "write {i}");
        p.c0.faults().drop_connections(p.a.qp_num()).unwrap();
        p.c1.faults().drop_connections(p.b.qp_num()).unwrap();
    }
    assert!(p.c0.faults().stats().breaks >= 5);
}

/// Connections of both sides dropped again and again while SENDs, WRITEs and
/// FETCH_AND_ADDs stream in windows of 16: every reconnect is set up (and its hello
/// checked) anew, nothing is lost, duplicated or reordered.
#[test]
fn repeated_resets_under_traffic_lose_nothing() {
    let p = pair(10, 7, 7);
    // At least OPS operations (whole windows of 16), and on until the connections were
    // dropped at least 10 times: on a loaded machine the dropping thread's 3 ms naps
    // stretch, and the traffic must still meet the faults it is about. MAX_OPS bounds it.
    const OPS: u64 = 3008;
    const MAX_OPS: u64 = 16 * OPS;
    let src = p.pd0.reg_mr(16 * 8, AccessFlags::LOCAL_WRITE).unwrap();
    let old = p.pd0.reg_mr(16 * 8, AccessFlags::LOCAL_WRITE).unwrap();
    let rx = p.pd1.reg_mr(64 * 8, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = p.pd1.reg_mr(MAX_OPS as usize * 8 + 8, AccessFlags::ALL).unwrap();
    let breaks = || p.c0.faults().stats().breaks + p.c1.faults().stats().breaks;
    let mut done = 0u64;
    for k in 0..64u64 {
        p.b.post_recv(&[RecvWr::new(k, &[rx.sge(k as usize * 8, 8).unwrap()])])
            .unwrap();
    }
    let stop = std::sync::atomic::AtomicBool::new(false);
    // Stops the dropping thread however the traffic ends (a failed assertion too).
    struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let mut received = Vec::new();
    std::thread::scope(|sc| {
        let _stop = StopOnDrop(&stop);
        sc.spawn(|| {
            let mut n = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(3));
                match n % 2 {
                    0 => p.c0.faults().drop_connections(p.a.qp_num()).unwrap(),
                    _ => p.c1.faults().drop_connections(p.b.qp_num()).unwrap(),
                }
                n += 1;
            }
        });
        let mut wcs = [WorkCompletion::default(); 64];
        let t0 = Instant::now();
        for base in (0..MAX_OPS).step_by(16) {
            if base >= OPS && breaks() >= 10 {
                break;
            }
            done = base + 16;
            let mut wrs = Vec::new();
            let sges: Vec<_> = (0..16).map(|j| [src.sge(j * 8, 8).unwrap()]).collect();
            let olds: Vec<_> = (0..16).map(|j| [old.sge(j * 8, 8).unwrap()]).collect();
            for j in 0..16u64 {
                let i = base + j;
                src.write_u64(j as usize * 8, i).unwrap();
                wrs.push(
                    match i % 3 {
                        0 => SendWr::send(i, &sges[j as usize]),
                        1 => SendWr::write(i, &sges[j as usize], dst.remote().at(8 + i * 8)),
                        _ => SendWr::fetch_and_add(i, &olds[j as usize], dst.remote().at(0), 1),
                    }
                    .signaled(),
                );
            }
            p.a.post_send(&wrs).unwrap();
            let mut got = 0;
            while got < 16 {
                let n = p.cq0.poll(&mut wcs).unwrap();
                for (k, wc) in wcs[..n].iter().enumerate() {
                    assert_eq!(
                        (wc.wr_id, wc.status),
                        (base + (got + k) as u64, WcStatus::Success),
                        "{wc:?}"
                    );
                }
                got += n;
                let m = p.cq1.poll(&mut wcs).unwrap();
                for wc in &wcs[..m] {
                    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                    received.push(rx.read_u64(wc.wr_id as usize * 8).unwrap());
                    p.b.post_recv(&[RecvWr::new(
                        wc.wr_id,
                        &[rx.sge(wc.wr_id as usize * 8, 8).unwrap()],
                    )])
                    .unwrap();
                }
                assert!(t0.elapsed() < 3 * T, "stalled at op {base}");
            }
        }
    });
    let sends: Vec<u64> = (0..done).filter(|i| i % 3 == 0).collect();
    let t0 = Instant::now();
    while received.len() < sends.len() && t0.elapsed() < T {
        for wc in poll_quiet(&p.cq1, Duration::from_millis(50)).unwrap() {
            received.push(rx.read_u64(wc.wr_id as usize * 8).unwrap());
        }
    }
    assert_eq!(received, sends, "SENDs lost, duplicated or reordered");
    for i in (0..done).filter(|i| i % 3 == 1) {
        assert_eq!(dst.read_u64(8 + i as usize * 8).unwrap(), i, "WRITE {i}");
    }
    let faas = (0..done).filter(|i| i % 3 == 2).count() as u64;
    assert_eq!(
        dst.read_u64(0).unwrap(),
        faas,
        "every FETCH_AND_ADD ran exactly once"
    );
    assert!(breaks() >= 10, "{} breaks in {done} operations", breaks());
}

/// A WRITE from a QP on a fresh device connected to a peer at `lid` (on this host) that
/// never answers: its completion (after 2 ACK timeouts of ~4 ms) and the QP.
fn write_to_absent_peer(lid: u16) -> (WorkCompletion, SimQp) {
    write_to_absent_peer_after(lid, Duration::ZERO)
}

/// [`write_to_absent_peer`], the device's setup thread stalled for `stall` from just
/// before the QP goes to RTR (as on a loaded machine).
fn write_to_absent_peer_after(lid: u16, stall: Duration) -> (WorkCompletion, SimQp) {
    let ctx = SimBackend::default().open("sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(8, None).unwrap();
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq, QpCap::new(4, 4))).unwrap();
    let p = RcParams {
        timeout: 10,
        retry_cnt: 1,
        ..RcParams::default()
    };
    let peer = Endpoint {
        gid: ctx.query_gid(1, 0).unwrap(),
        lid,
        qpn: 7,
        psn: 0,
    };
    if !stall.is_zero() {
        ctx.faults().stall_setup_thread(stall).unwrap();
    }
    connect_rc(&qp, &p, 0, &peer).unwrap();
    let src = pd.reg_mr(8, AccessFlags::LOCAL_WRITE).unwrap();
    qp.post_send(&[SendWr::write(1, &[src.sge(0, 8).unwrap()], RemoteAddr::new(0x1000, 1)).signaled()])
        .unwrap();
    let w = poll_n(&cq, 1, T).unwrap();
    (w[0], qp)
}

/// A peer nobody listens for: the connection attempts fail, the ACK timer runs out as for
/// lost packets, and the RETRY_EXC_ERR completion names why in `vendor_err`
/// (ECONNREFUSED), where a peer that stopped answering leaves it 0 (above).
#[test]
fn an_unreachable_peer_ends_in_retry_exc_err_naming_the_refusal() {
    // Port 65535 (outside Linux's ephemeral range, so nothing listens there) as the
    // peer's LID: the larger (GID, LID) makes this QP the side that connects.
    let (wc, qp) = write_to_absent_peer(u16::MAX);
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::RetryExcErr));
    assert_eq!(wc.vendor_err, libc::ECONNREFUSED as u32, "{wc:?}");
    assert_eq!(qp.state().unwrap(), QpState::Err);
}

/// The connection attempt counts as under way from RTR on, not from when the setup
/// thread first gets to run it: a setup thread held up longer than the `retry_cnt` ACK
/// timeouts (as on a loaded machine) still makes its attempt, and the WR's completion
/// names the refusal, not ENOTCONN (no attempt failed yet).
#[test]
fn an_unreachable_peer_is_named_when_the_setup_thread_starts_late() {
    // 200 ms: far more than the two ACK timeouts of ~4 ms, well within the grace an
    // attempt under way has (`LINK_SETUP_GRACE`).
    let (wc, qp) = write_to_absent_peer_after(u16::MAX, Duration::from_millis(200));
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::RetryExcErr));
    assert_eq!(wc.vendor_err, libc::ECONNREFUSED as u32, "{wc:?}");
    assert_eq!(qp.state().unwrap(), QpState::Err);
}

/// A QP waiting for its peer to connect (the peer has the smaller (GID, LID, QPN), so it
/// sets the connection up), and the peer never does: RETRY_EXC_ERR with ENOTCONN.
#[test]
fn a_peer_that_never_connects_ends_in_retry_exc_err_not_connected() {
    let (wc, _qp) = write_to_absent_peer(1);
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::RetryExcErr));
    assert_eq!(wc.vendor_err, libc::ENOTCONN as u32, "{wc:?}");
}

/// A peer device of another build, whose frames this one does not speak: it refuses the
/// hello as such (`HelloReject::Version`), and the QP stops trying at once (one attempt,
/// not one every 10 ms) and fails its WRs with RETRY_EXC_ERR naming EPROTO.
#[test]
fn a_peer_of_another_protocol_version_is_tried_once_and_named() {
    use backend_sim_proto::wire::{Frame, HelloReject, MAX_HDR_LEN};
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    // The peer's LID (port) is above Linux's ephemeral range, so this QP, with the smaller
    // (GID, LID), is the side that connects: the highest free port below 65535 (the
    // absent peer above), as another run of this test may hold one.
    let (listener, port) = (61_001..u16::MAX)
        .rev()
        .find_map(|p| std::net::TcpListener::bind(("127.0.0.1", p)).ok().map(|l| (l, p)))
        .expect("a port above the ephemeral range is free for the fake peer");
    let attempts = Arc::new(AtomicUsize::new(0));
    let seen = attempts.clone();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { return };
            seen.fetch_add(1, Ordering::SeqCst);
            let mut hello = [0u8; MAX_HDR_LEN];
            let _ = s.read_exact(&mut hello);
            let mut b = [0u8; MAX_HDR_LEN];
            let n = Frame::HelloNak {
                reason: HelloReject::Version,
            }
            .encode(&mut b);
            let _ = s.write_all(&b[..n]);
        }
    });
    let (wc, qp) = write_to_absent_peer(port);
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::RetryExcErr));
    assert_eq!(wc.vendor_err, libc::EPROTO as u32, "{wc:?}");
    assert_eq!(qp.state().unwrap(), QpState::Err);
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
}
