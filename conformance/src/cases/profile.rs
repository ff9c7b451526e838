//! The resource and timing choices where HCAs differ and no IBA status decides: each case
//! observes what the device does (the report records it) and expects what its profile
//! says (see docs/profiles.md): `rxe` rxe's choice, `portable` and `mlx5` a ConnectX's.

use std::time::Duration;

use verbs_api::{
    AccessFlags as A, Backend, CompletionChannel, CompletionQueue, Context, Endpoint, MemoryRegion,
    ProtectionDomain, QpAttr, QpAttrMask as M, QpCap, QpInitAttr, QpState, QpType, QueuePair, SendWr,
    SharedReceiveQueue, SrqAttr, SrqAttrMask, WcStatus, WorkCompletion,
};

use super::case;
use crate::{ensure, ensure_eq, Case, CaseResult, Env, Failure, Outcome, Pair, Profile};

pub fn list<B: Backend>() -> Vec<Case<B>> {
    vec![
        case!(
            "profile.sq-slot-release",
            "a send queue whose WRs all completed, their completion not yet polled: the next post is ENOMEM until it is (mlx5), or taken (rxe)",
            "rdma-core providers/mlx5/cq.c (SQ tail moved in ibv_poll_cq); rxe_comp.c (SQ advanced at completion)",
            sq_slot_release
        ),
        case!(
            "profile.cq-clean-on-reset",
            "RESET and destroy remove the QP's unpolled completions from its CQ (mlx5), or leave them (rxe)",
            "rdma-core providers/mlx5/verbs.c mlx5_cq_clean() (RESET), __mlx5_cq_clean() (destroy); rxe_qp.c",
            cq_clean_on_reset
        ),
        case!(
            "profile.retry-cnt-7",
            "retry_cnt 7 towards a QP that never answers: RETRY_EXC_ERR after seven retries (IBA), or retried for ever (rxe)",
            "IBA 9.7.5.2.8; rxe_comp.c COMPST_ERROR_RETRY",
            retry_cnt_7
        ),
        case!(
            "profile.queue-sizes",
            "CQs, send and receive queues and SRQs asked for n hold 2^k - 1 >= n (rxe: every queue; mlx5: CQs), or n (portable)",
            "man ibv_create_cq, man ibv_create_qp (at least what was asked); rxe_queue.c rxe_queue_init(); rdma-core providers/mlx5/verbs.c create_cq()",
            queue_sizes,
            requires [Srq, SrqResize]
        ),
    ]
}

/// QP B of a connected pair, with a completion channel on its CQ, posts WRITEs into a
/// region of A's PD: what the three cases need.
struct Writer<B: Backend> {
    p: Pair<B>,
    src: B::Mr,
    dst: B::Mr,
    sge: [verbs_api::Sge; 1],
}

impl<B: Backend> Writer<B> {
    fn new(env: &Env<B>, depth: u32) -> Result<Self, Failure> {
        let mut o = env.opts();
        o.cap.max_send_wr = depth;
        o.channel = true;
        let p = env.pair(&o)?;
        let src = env.mr(&p.pd, 64, A::LOCAL_WRITE)?;
        let dst = env.mr(&p.pd, 64, A::LOCAL_WRITE | A::REMOTE_WRITE)?;
        let sge = [src.sge(0, 8)?];
        Ok(Writer { p, src, dst, sge })
    }

    fn write(&self, id: u64, signaled: bool) -> SendWr<'_> {
        let wr = SendWr::write(id, &self.sge, self.dst.remote().at(0));
        if signaled {
            wr.signaled()
        } else {
            wr
        }
    }

    /// Posts `n` WRITEs, only the last signaled, and waits for its completion to be in
    /// the CQ without polling it (through the channel): every one has completed.
    fn complete_unpolled(&self, env: &Env<B>, n: u32) -> Result<(), Failure> {
        self.p.cq_b.req_notify(false)?;
        let wrs: Vec<_> = (0..n as u64).map(|i| self.write(i, i + 1 == n as u64)).collect();
        self.p.b.post_send(&wrs)?;
        let ch = self.p.ch_b.as_ref().expect("a channel");
        ensure!(
            ch.get_cq_event(Some(env.cfg.timeout))?.is_some(),
            "no completion event within {:?}",
            env.cfg.timeout
        );
        self.p.cq_b.ack_events(1);
        Ok(())
    }
}

fn poll_all<B: Backend>(cq: &B::Cq) -> Result<Vec<WorkCompletion>, Failure> {
    let mut wc = [WorkCompletion::default(); 16];
    let n = cq.poll(&mut wc)?;
    Ok(wc[..n].to_vec())
}

fn sq_slot_release<B: Backend>(env: &Env<B>) -> CaseResult {
    let w = Writer::new(env, 4)?;
    // The queue as granted (a provider may round it up): fill all of it.
    let depth = w.p.b.query()?.cap.max_send_wr.max(4);
    w.complete_unpolled(env, depth)?;
    let more = w.p.b.post_send(&[w.write(100, true)]);
    env.observe_post("post, the queue's WRs complete and unpolled", &more);
    match more {
        Ok(()) if env.profile == Profile::Rxe => {
            let wcs = env.wait(&w.p.cq_b, 2)?;
            ensure_eq!(
                wcs.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
                vec![depth as u64 - 1, 100],
                "completions"
            );
        }
        Err(e) if env.profile != Profile::Rxe && e.errno() == libc::ENOMEM => {
            ensure_eq!(
                poll_all::<B>(&w.p.cq_b)?.len(),
                1,
                "the signaled WRITE's completion"
            );
            let again = w.p.b.post_send(&[w.write(101, true)]);
            env.observe_post("post after polling", &again);
            again?;
            ensure_eq!(env.wait1(&w.p.cq_b)?.wr_id, 101, "the WRITE posted after polling");
        }
        other => {
            return Err(Failure(format!(
                "post with the queue's {depth} WRs complete and their completion unpolled: {other:?} \
                 ({} profile)",
                env.profile
            )))
        }
    }
    Ok(Outcome::Pass)
}

fn cq_clean_on_reset<B: Backend>(env: &Env<B>) -> CaseResult {
    let keeps = env.profile == Profile::Rxe;
    for destroy in [false, true] {
        let w = Writer::new(env, 4)?;
        w.complete_unpolled(env, 2)?;
        let Writer { p, src, dst, .. } = w;
        let what = if destroy { "destroy" } else { "RESET" };
        let Pair { b, cq_b, .. } = p;
        if destroy {
            drop(b);
        } else {
            let reset = QpAttr {
                qp_state: QpState::Reset,
                ..Default::default()
            };
            b.modify(&reset, M::STATE)?;
            ensure_eq!(b.state()?, QpState::Reset, "after RESET");
        }
        let left = poll_all::<B>(&cq_b)?;
        env.observe(format!("CQEs left after {what}"), left.len());
        if keeps {
            ensure!(
                left.len() == 1 && left[0].wr_id == 1 && left[0].status == WcStatus::Success,
                "rxe leaves the completion after {what}: {left:?}"
            );
        } else {
            ensure!(
                left.is_empty(),
                "completions left in the CQ after {what}: {left:?}"
            );
        }
        drop((src, dst));
    }
    Ok(Outcome::Pass)
}

fn retry_cnt_7<B: Backend>(env: &Env<B>) -> CaseResult {
    let mut o = env.opts();
    // ~4 ms per try (4.096 us x 2^10): seven retries take a few tens of ms.
    o.a.timeout = 10;
    o.a.retry_cnt = 7;
    o.a.rnr_retry = 0;
    let p = env.pair_unconnected(&o)?;
    // A destination QP that does not exist: nothing ever answers.
    let nobody = Endpoint {
        qpn: p.ep_b.qpn ^ 0x80_0000,
        ..p.ep_b
    };
    crate::env::connect(&p.a, &o.a, p.ep_a.psn, &nobody)?;
    let src = env.mr(&p.pd, 64, A::LOCAL_WRITE)?;
    p.a.post_send(&[SendWr::write(1, &[src.sge(0, 8)?], (0x1000, 1)).signaled()])?;
    if env.profile == Profile::Rxe {
        // Seven retries of ~4 ms would be over long before this.
        let within = Duration::from_secs(2).min(env.cfg.timeout);
        let got = env.quiet(&p.cq_a, within)?;
        env.observe(
            "retry_cnt 7, no answer",
            got.first()
                .map_or("no completion".to_string(), |w| format!("{:?}", w.status)),
        );
        ensure!(got.is_empty(), "rxe retries retry_cnt 7 for ever, but: {got:?}");
        // Stop the retries: ERR flushes the WRITE.
        let err = QpAttr {
            qp_state: QpState::Err,
            ..Default::default()
        };
        p.a.modify(&err, M::STATE)?;
        ensure_eq!(env.wait1(&p.cq_a)?.status, WcStatus::WrFlushErr, "after ERR");
    } else {
        let wc = env.wait1(&p.cq_a)?;
        env.observe("retry_cnt 7, no answer", format_args!("{:?}", wc.status));
        ensure_eq!(wc.status, WcStatus::RetryExcErr, "the WRITE after seven retries");
    }
    Ok(Outcome::Pass)
}

/// 2^k - 1 >= n: a ring of a power of two slots, one kept empty.
fn ring(n: u32) -> u32 {
    (n + 1).next_power_of_two() - 1
}

fn queue_sizes<B: Backend>(env: &Env<B>) -> CaseResult {
    let (rounds_cqs, rounds_all) = match env.profile {
        Profile::Rxe => (true, true),
        Profile::Mlx5 => (true, false),
        Profile::Portable => (false, false),
    };
    let expect = |rounds: bool, n: u32| if rounds { ring(n) } else { n };
    for asked in [1, 4, 100] {
        let cq = env.ctx.create_cq(asked, None)?;
        env.observe(format!("cqe of a CQ asked for {asked}"), cq.capacity());
        ensure_eq!(
            cq.capacity(),
            expect(rounds_cqs, asked),
            "cqe of a CQ asked for {asked}"
        );
        cq.resize(asked * 2 + 1)?;
        env.observe(format!("cqe after a resize to {}", asked * 2 + 1), cq.capacity());
        ensure_eq!(
            cq.capacity(),
            expect(rounds_cqs, asked * 2 + 1),
            "cqe after a resize to {}",
            asked * 2 + 1
        );
    }
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(16, None)?;
    let asked = QpCap {
        max_send_wr: 16,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, asked))?;
    let cap = qp.query()?.cap;
    env.observe(
        "ibv_query_qp cap of a QP asked for 16 sends and 4 receives",
        format_args!("{}/{}", cap.max_send_wr, cap.max_recv_wr),
    );
    ensure_eq!(
        (cap.max_send_wr, cap.max_recv_wr),
        (expect(rounds_all, 16), expect(rounds_all, 4)),
        "send and receive queue sizes"
    );
    let srq = pd.create_srq(&SrqAttr::new(100, 1))?;
    let held = srq.query()?.max_wr;
    env.observe("ibv_query_srq max_wr of an SRQ asked for 100", held);
    ensure_eq!(held, expect(rounds_all, 100), "SRQ size");
    srq.modify(&SrqAttr::new(201, 1), SrqAttrMask::MAX_WR)?;
    let held = srq.query()?.max_wr;
    env.observe("ibv_query_srq max_wr after a resize to 201", held);
    ensure_eq!(held, expect(rounds_all, 201), "SRQ size after the resize");
    Ok(Outcome::Pass)
}
