//! The world's virtual-time budget and its profiles: a requester that retries for ever
//! (rxe's `retry_cnt` 7 towards a peer that answers nothing) ends its program's wait at
//! the budget, with an error naming the QP and why, identically on every run of a seed;
//! under the portable profile the same program ends in `IBV_WC_RETRY_EXC_ERR`; and mlx5's
//! driver-level behaviour (send queue slots freed when their completion is polled, a
//! QP's completions removed from its CQ by RESET) holds on the deterministic backend.

mod common;

use std::time::Duration;

use backend_sim_det::Det;
use backend_sim_proto::switches::Switches;
use verbs_api::{
    connect_rc, local_endpoint, poll_n, Backend, CompletionQueue, Error, MemoryRegion, QpAttr, QpAttrMask,
    QpState, QueuePair, RcParams, SendWr, WcStatus, WorkCompletion,
};

use common::{side, Side};

/// Longer than any wait below may take on a loaded machine: the waits end in virtual time.
const WALL: Duration = Duration::from_secs(120);

/// Two sides on `det`, connected with `retry_cnt` 7 and IBA timeout 10 (about 4 ms).
fn pair(det: &Det) -> (Side<Det>, Side<Det>) {
    let (a, b) = (side(det, "client").unwrap(), side(det, "server").unwrap());
    let params = RcParams {
        timeout: 10,
        retry_cnt: 7,
        ..RcParams::default()
    };
    let ea = local_endpoint(&a.ctx, &a.qp, &params, 100).unwrap();
    let eb = local_endpoint(&b.ctx, &b.qp, &params, 9000).unwrap();
    connect_rc(&a.qp, &params, ea.psn, &eb).unwrap();
    connect_rc(&b.qp, &params, eb.psn, &ea).unwrap();
    (a, b)
}

/// The client WRITEs to a server whose QP is in ERR (it answers nothing, as behind a lost
/// fatal NAK) and waits for the completion: what the wait returns, and the world.
fn write_to_a_dead_peer(det: &Det) -> (verbs_api::Result<Vec<WorkCompletion>>, u32) {
    let (a, b) = pair(det);
    let err = QpAttr {
        qp_state: QpState::Err,
        ..Default::default()
    };
    b.qp.modify(&err, QpAttrMask::STATE).unwrap();
    let remote = b.mr.remote();
    a.qp.post_send(&[SendWr::write(1, &[a.mr.sge(0, 8).unwrap()], remote.at(0)).signaled()])
        .unwrap();
    (poll_n(&a.cq, 1, WALL), a.qp.qp_num())
}

#[test]
fn a_requester_retrying_for_ever_ends_the_wait_at_the_budget_naming_it() {
    let budget = Duration::from_secs(2);
    let run = || {
        let det = Det::builder()
            .seed(3)
            .budget(budget)
            .hosts(["client", "server"])
            .build();
        let (r, qpn) = write_to_a_dead_peer(&det);
        let text = match r {
            Err(e @ Error::Timeout { .. }) => e.to_string(),
            other => panic!("expected the budget's timeout, got {other:?}"),
        };
        (text, qpn, det.trace(), det.now(), det.stats().timeouts)
    };
    let (text, qpn, trace, now, timeouts) = run();
    assert!(text.contains(&format!("QP {qpn:#x}")), "{text}");
    assert!(text.contains("retry_cnt 7 retries for ever on rxe"), "{text}");
    // The world stopped at the budget (counted from the post), not after it.
    assert!(now <= budget + Duration::from_millis(1), "{now:?}");
    // Far more timeouts than a finite retry_cnt 7 allows: rxe's 7 is infinite.
    assert!(timeouts > 8, "{timeouts}");
    // The same seed gives the same run, error included.
    assert_eq!(run(), (text, qpn, trace, now, timeouts));
}

#[test]
fn under_the_portable_profile_retry_cnt_7_is_seven_retries() {
    let det = Det::builder()
        .seed(3)
        .profile(Switches::PORTABLE)
        .hosts(["client", "server"])
        .build();
    let (r, _) = write_to_a_dead_peer(&det);
    let wcs = r.unwrap();
    assert_eq!(wcs[0].status, WcStatus::RetryExcErr);
    assert_eq!(det.stats().timeouts, 8, "the first try and seven retries");
}

/// A world of `sw` with a client whose send queue holds two WRs, both completed (and
/// not polled) once the world settles.
fn two_writes_completed(sw: Switches) -> (Det, Side<Det>, Side<Det>) {
    let det = Det::builder().profile(sw).hosts(["client", "server"]).build();
    let (a, b) = pair(&det);
    let remote = b.mr.remote();
    let sge = [a.mr.sge(0, 8).unwrap()];
    let w = |id| SendWr::write(id, &sge, remote.at(0)).signaled();
    for id in 0..2 {
        a.qp.post_send(&[w(id)]).unwrap();
    }
    assert!(det.settle(Duration::from_secs(1)).unwrap());
    (det, a, b)
}

#[test]
fn mlx5_frees_a_send_slot_when_its_completion_is_polled() {
    let cap = |s: &Side<Det>| s.qp.query().unwrap().cap.max_send_wr as u64;
    for (sw, frees_at_poll) in [(Switches::MLX5, true), (Switches::RXE, false)] {
        let (_det, a, b) = two_writes_completed(sw);
        let remote = b.mr.remote();
        let sge = [a.mr.sge(0, 8).unwrap()];
        // Fill the queue's remaining slots: under rxe the two completed WRs gave theirs
        // back at completion, under mlx5 only a poll gives them back.
        let free = cap(&a) - if frees_at_poll { 2 } else { 0 };
        for id in 0..free {
            a.qp.post_send(&[SendWr::write(10 + id, &sge, remote.at(0))])
                .unwrap();
        }
        let over = a.qp.post_send(&[SendWr::write(99, &sge, remote.at(0))]);
        if frees_at_poll {
            let e = over.unwrap_err();
            assert!(matches!(e.error, Error::QueueFull { .. }), "{e}");
            let mut wc = [WorkCompletion::default(); 2];
            assert_eq!(a.cq.poll(&mut wc).unwrap(), 2);
            a.qp.post_send(&[SendWr::write(99, &sge, remote.at(0))]).unwrap();
        } else {
            assert!(over.is_err(), "the queue holds max_send_wr WRs");
        }
    }
}

#[test]
fn mlx5_removes_a_reset_qps_completions_from_its_cq() {
    for (sw, removed) in [(Switches::MLX5, true), (Switches::RXE, false)] {
        let (_det, a, _b) = two_writes_completed(sw);
        let reset = QpAttr {
            qp_state: QpState::Reset,
            ..Default::default()
        };
        a.qp.modify(&reset, QpAttrMask::STATE).unwrap();
        let mut wc = [WorkCompletion::default(); 4];
        let n = a.cq.poll(&mut wc).unwrap();
        assert_eq!(n, if removed { 0 } else { 2 }, "{sw:?}");
    }
}

#[test]
fn the_default_budget_is_the_documented_one() {
    // A world built without `budget` ends a dead wait at DEFAULT_BUDGET.
    let det = Det::builder().seed(1).hosts(["client", "server"]).build();
    let (r, _) = write_to_a_dead_peer(&det);
    assert!(matches!(r, Err(Error::Timeout { after, .. }) if after == backend_sim_det::DEFAULT_BUDGET));
    let _ = Backend::name(&det);
}
