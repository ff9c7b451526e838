//! Shared receive queues (`man ibv_create_srq`, `man ibv_modify_srq`, `man ibv_query_srq`,
//! `man ibv_post_srq_recv`; rdma-core tests/test_srq.py): sizes, posting, FIFO delivery
//! across QPs, RNR on an empty SRQ, the limit event, and what a QP leaving the SRQ raises.
//!
//! The traffic cases connect RC senders A to RC receivers B that take their receives from
//! one SRQ; each side has its own CQ (all B's share one).

use std::time::Duration;

use verbs_api::{
    local_endpoint, AccessFlags as A, AsyncElement, AsyncEventType, Backend, Context, MemoryRegion,
    ProtectionDomain, QpAttr, QpAttrMask, QpInitAttr, QpState, QueuePair, RecvWr, SendWr, SharedReceiveQueue,
    SrqAttr, SrqAttrMask, WcOpcode, WcStatus,
};

use super::case;
use crate::env::{connect, pattern, read_back};
use crate::{ensure, ensure_eq, CaseResult, Env, Failure, Outcome, PairOpts, Profile};

pub fn list<B: Backend>() -> Vec<crate::Case<B>> {
    vec![
        case!(
            "srq.create-query",
            "create_srq grants at least the receives and SGEs asked for, with no limit armed",
            "man ibv_create_srq, man ibv_query_srq; rdma-core tests/test_srq.py",
            srq_create_query,
            requires [Srq]
        ),
        case!(
            "srq.create-too-large",
            "create_srq above max_srq_wr or max_srq_sge fails with EINVAL",
            "man ibv_create_srq (max_wr, max_sge); man ibv_query_device (max_srq_wr, max_srq_sge)",
            srq_create_too_large,
            requires [Srq]
        ),
        case!(
            "srq.post-full",
            "post_srq_recv past the SRQ's capacity fails with ENOMEM at the first WR that does not fit",
            "man ibv_post_srq_recv (ENOMEM, bad_recv_wr)",
            srq_post_full,
            requires [Srq]
        ),
        case!(
            "srq.post-recv-on-qp",
            "post_recv on a QP created with an SRQ fails with EINVAL",
            "man ibv_post_recv (a QP with an SRQ: use ibv_post_srq_recv)",
            srq_post_recv_on_qp,
            requires [Srq]
        ),
        case!(
            "srq.rc-deliver",
            "a SEND to an RC QP on an SRQ lands in the SRQ's receive; the completion names that QP",
            "man ibv_create_srq; man ibv_poll_cq (qp_num)",
            srq_rc_deliver,
            requires [Srq]
        ),
        case!(
            "srq.fifo",
            "two QPs on one SRQ take its receives first in first out, whichever QP a message arrives on",
            "man ibv_post_srq_recv; man ibv_create_srq (one receive queue shared by QPs)",
            srq_fifo,
            requires [Srq]
        ),
        case!(
            "srq.rnr",
            "a SEND to an RC QP whose SRQ is empty is answered RNR and retried, and lands once a receive is posted",
            "IBA 9.7.5.2.8 (RNR NAK); man ibv_create_srq",
            srq_rnr,
            requires [Srq]
        ),
        case!(
            "srq.limit",
            "an armed srq_limit raises SRQ_LIMIT_REACHED once, when the count drops below it, and reads 0 after",
            "man ibv_modify_srq (IBV_SRQ_LIMIT), man ibv_query_srq, man ibv_get_async_event; rdma-core tests/test_srq.py test_modify_srq_limit",
            srq_limit,
            requires [Srq]
        ),
        case!(
            "srq.limit-armed-below",
            "arming a limit above the current count raises nothing until a receive is consumed",
            "man ibv_modify_srq (the event fires when the number of WQEs drops below the limit)",
            srq_limit_armed_below,
            requires [Srq]
        ),
        case!(
            "srq.limit-at-create",
            "a srq_limit given to create_srq arms nothing: query reads 0 and no event comes",
            "man ibv_create_srq (srq_limit is irrelevant for ibv_create_srq); man ibv_modify_srq (arming)",
            srq_limit_at_create,
            requires [Srq]
        ),
        case!(
            "srq.limit-too-large",
            "a srq_limit above the SRQ's capacity fails with EINVAL and modifies nothing",
            "man ibv_modify_srq (invalid attributes: none is modified)",
            srq_limit_too_large,
            requires [Srq]
        ),
        case!(
            "srq.resize",
            "modify_srq with IBV_SRQ_MAX_WR grows the SRQ to at least the size asked for",
            "man ibv_modify_srq (IBV_DEVICE_SRQ_RESIZE); rdma-core tests/test_srq.py test_resize_srq",
            srq_resize,
            requires [Srq, SrqResize]
        ),
        case!(
            "srq.last-wqe",
            "a QP on an SRQ moved to ERR raises LAST_WQE_REACHED; the SRQ's receives stay for its other QPs",
            "man ibv_get_async_event (IBV_EVENT_QP_LAST_WQE_REACHED); IBA vol. 1, affiliated asynchronous event Last WQE Reached",
            srq_last_wqe,
            requires [Srq]
        ),
    ]
}

/// How long "nothing happens" is watched for.
const QUIET: Duration = Duration::from_millis(300);

/// Senders `a[i]` connected to receivers `b[i]`, which take their receives from `srq`.
pub(crate) struct SrqSetup<B: Backend> {
    pub(crate) pd: B::Pd,
    pub(crate) srq: B::Srq,
    pub(crate) cq_a: B::Cq,
    pub(crate) cq_b: B::Cq,
    pub(crate) a: Vec<B::Qp>,
    pub(crate) b: Vec<B::Qp>,
    /// Send buffers (8 KiB).
    pub(crate) src: B::Mr,
    /// Receive buffers (8 KiB).
    pub(crate) dst: B::Mr,
}

impl<B: Backend> SrqSetup<B> {
    /// `n` connected pairs on an SRQ of `attr` with the options `o` (the senders' RC
    /// parameters in `o.a`, the receivers' in `o.b`).
    pub(crate) fn new(env: &Env<B>, n: usize, attr: SrqAttr, o: &PairOpts) -> Result<Self, Failure> {
        let pd = env.ctx.alloc_pd()?;
        let srq = pd.create_srq(&attr)?;
        let cq_a = env.ctx.create_cq(o.cqe, None)?;
        let cq_b = env.ctx.create_cq(o.cqe, None)?;
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for i in 0..n {
            let qa = pd.create_qp(&QpInitAttr::new(o.qp_type, &cq_a, &cq_a, o.cap))?;
            let qb = pd.create_qp(&QpInitAttr::new(o.qp_type, &cq_b, &cq_b, o.cap).with_srq(&srq))?;
            let ea = local_endpoint(&env.ctx, &qa, &o.a, 0x100 + i as u32)?;
            let eb = local_endpoint(&env.ctx, &qb, &o.b, 0x200 + i as u32)?;
            connect(&qa, &o.a, ea.psn, &eb)?;
            connect(&qb, &o.b, eb.psn, &ea)?;
            a.push(qa);
            b.push(qb);
        }
        let src = pd.reg_mr(8192, A::LOCAL_WRITE)?;
        let dst = pd.reg_mr(8192, A::LOCAL_WRITE)?;
        Ok(SrqSetup {
            pd,
            srq,
            cq_a,
            cq_b,
            a,
            b,
            src,
            dst,
        })
    }

    /// Posts receive `wr_id` to the SRQ: 64 bytes at `64 * slot` of `dst`.
    pub(crate) fn post(&self, wr_id: u64, slot: usize) -> Result<(), Failure> {
        self.srq
            .post_recv(&[RecvWr::new(wr_id, &[self.dst.sge(64 * slot, 64)?])])?;
        Ok(())
    }

    /// Sends 8 bytes of `byte` from `a[i]` and waits for its completion.
    pub(crate) fn send(&self, env: &Env<B>, i: usize, wr_id: u64, byte: u8) -> Result<(), Failure> {
        self.src.write(64 * i, &[byte; 8])?;
        self.a[i].post_send(&[SendWr::send(wr_id, &[self.src.sge(64 * i, 8)?]).signaled()])?;
        let wc = env.wait1(&self.cq_a)?;
        ensure!(
            wc.wr_id == wr_id && wc.status == WcStatus::Success,
            "SEND {wr_id} from A{i}: {wc:?}"
        );
        Ok(())
    }

    /// Sends from `a[i]` and waits for the receive completion on the SRQ side.
    pub(crate) fn send_recv(
        &self,
        env: &Env<B>,
        i: usize,
        wr_id: u64,
        byte: u8,
    ) -> Result<verbs_api::WorkCompletion, Failure> {
        self.send(env, i, wr_id, byte)?;
        let wc = env.wait1(&self.cq_b)?;
        ensure!(
            wc.status == WcStatus::Success && wc.opcode == WcOpcode::Recv,
            "receive of SEND {wr_id}: {wc:?}"
        );
        ensure_eq!(
            wc.qp_num,
            self.b[i].qp_num(),
            "qp_num of the receive of SEND {wr_id}"
        );
        Ok(wc)
    }
}

fn srq_create_query<B: Backend>(env: &Env<B>) -> CaseResult {
    let pd = env.ctx.alloc_pd()?;
    let srq = pd.create_srq(&SrqAttr::new(10, 2))?;
    let q = srq.query()?;
    ensure!(
        q.max_wr >= 10 && q.max_sge >= 2,
        "granted {q:?}, asked for max_wr 10, max_sge 2"
    );
    ensure_eq!(q.srq_limit, 0, "srq_limit of a new SRQ");
    let other = pd.create_srq(&SrqAttr::new(1, 1))?;
    ensure!(
        other.handle() != srq.handle(),
        "two SRQs share the handle {}",
        srq.handle()
    );
    Ok(Outcome::Pass)
}

fn srq_create_too_large<B: Backend>(env: &Env<B>) -> CaseResult {
    let dev = env.ctx.query_device()?;
    let pd = env.ctx.alloc_pd()?;
    let mut tried = 0;
    for (what, attr) in [
        ("max_wr", SrqAttr::new(dev.max_srq_wr.saturating_add(1), 1)),
        ("max_sge", SrqAttr::new(1, dev.max_srq_sge.saturating_add(1))),
    ] {
        if attr.max_wr == u32::MAX || attr.max_sge == u32::MAX {
            continue; // no value above the limit
        }
        tried += 1;
        match pd.create_srq(&attr) {
            Ok(_) => {
                return Err(Failure(format!(
                    "{what} above the device's limit accepted: {attr:?}"
                )))
            }
            Err(e) => ensure_eq!(e.errno(), libc::EINVAL, "{what} above the limit ({e})"),
        }
    }
    ensure!(
        tried > 0,
        "the device's SRQ limits are u32::MAX: nothing lies above them"
    );
    Ok(Outcome::Pass)
}

fn srq_post_full<B: Backend>(env: &Env<B>) -> CaseResult {
    let pd = env.ctx.alloc_pd()?;
    let srq = pd.create_srq(&SrqAttr::new(16, 1))?;
    let cap = srq.query()?.max_wr as u64;
    let mr = pd.reg_mr(64, A::LOCAL_WRITE)?;
    let sge = [mr.sge(0, 8)?];
    for i in 0..cap - 1 {
        srq.post_recv(&[RecvWr::new(i, &sge)])?;
    }
    let wrs = [
        RecvWr::new(1000, &sge),
        RecvWr::new(1001, &sge),
        RecvWr::new(1002, &sge),
    ];
    match srq.post_recv(&wrs) {
        Ok(()) => Err(Failure(format!(
            "{} receives posted into an SRQ of {cap}",
            cap + 2
        ))),
        Err(e) => {
            ensure_eq!(e.errno(), libc::ENOMEM, "errno ({e})");
            ensure_eq!(e.index, 1, "index of the first WR that did not fit");
            ensure_eq!(e.wr_id, 1001, "wr_id of the first WR that did not fit");
            Ok(Outcome::Pass)
        }
    }
}

fn srq_post_recv_on_qp<B: Backend>(env: &Env<B>) -> CaseResult {
    let s = SrqSetup::new(env, 1, SrqAttr::new(16, 1), &env.opts())?;
    match s.b[0].post_recv(&[RecvWr::new(1, &[s.dst.sge(0, 64)?])]) {
        Ok(()) => Err(Failure("post_recv on a QP with an SRQ succeeded".into())),
        Err(e) => {
            ensure_eq!(e.errno(), libc::EINVAL, "errno ({e})");
            ensure_eq!(e.index, 0, "index");
            Ok(Outcome::Pass)
        }
    }
}

fn srq_rc_deliver<B: Backend>(env: &Env<B>) -> CaseResult {
    let s = SrqSetup::new(env, 1, SrqAttr::new(16, 1), &env.opts())?;
    let data = pattern(48, 21);
    s.src.write(0, &data)?;
    s.srq.post_recv(&[RecvWr::new(7, &[s.dst.sge(1024, 64)?])])?;
    s.a[0].post_send(&[SendWr::send(1, &[s.src.sge(0, 48)?]).signaled()])?;
    let ws = env.wait1(&s.cq_a)?;
    ensure!(ws.is_ok(), "SEND: {:?}", ws.status);
    let wr = env.wait1(&s.cq_b)?;
    ensure!(wr.is_ok(), "receive: {:?}", wr.status);
    ensure_eq!(wr.wr_id, 7, "wr_id");
    ensure_eq!(wr.opcode, WcOpcode::Recv, "opcode");
    ensure_eq!(wr.byte_len, 48, "byte_len");
    ensure_eq!(
        wr.qp_num,
        s.b[0].qp_num(),
        "qp_num (the QP the message arrived on)"
    );
    ensure_eq!(read_back(&s.dst, 1024, 48)?, data, "payload");
    Ok(Outcome::Pass)
}

fn srq_fifo<B: Backend>(env: &Env<B>) -> CaseResult {
    let s = SrqSetup::new(env, 2, SrqAttr::new(16, 1), &env.opts())?;
    for slot in 0..4 {
        s.post(100 + slot as u64, slot)?;
    }
    // Alternate the QPs; each receive must take the oldest WQE left.
    for (k, qp) in [0usize, 1, 1, 0].into_iter().enumerate() {
        let byte = 0xa0 + k as u8;
        let wc = s.send_recv(env, qp, k as u64, byte)?;
        ensure_eq!(
            wc.wr_id,
            100 + k as u64,
            "message {k} (on QP B{qp}) took the receive"
        );
        ensure_eq!(
            read_back(&s.dst, 64 * k, 8)?,
            vec![byte; 8],
            "payload of message {k}"
        );
    }
    Ok(Outcome::Pass)
}

fn srq_rnr<B: Backend>(env: &Env<B>) -> CaseResult {
    let mut o = env.opts();
    o.a.rnr_retry = 7;
    o.b.min_rnr_timer = 14; // 1.28 ms
    let s = SrqSetup::new(env, 1, SrqAttr::new(16, 1), &o)?;
    s.src.write(0, b"after RNR")?;
    s.a[0].post_send(&[SendWr::send(1, &[s.src.sge(0, 9)?]).signaled()])?;
    let early = env.quiet(&s.cq_a, QUIET)?;
    ensure!(
        early.is_empty(),
        "the SEND completed with the SRQ empty: {early:?}"
    );
    ensure!(
        env.quiet(&s.cq_b, Duration::ZERO)?.is_empty(),
        "a receive completed with the SRQ empty"
    );
    ensure_eq!(s.a[0].state()?, QpState::Rts, "sender state while RNR retries");
    s.post(5, 0)?;
    let ws = env.wait1(&s.cq_a)?;
    ensure!(ws.is_ok(), "SEND after the receive was posted: {:?}", ws.status);
    let wr = env.wait1(&s.cq_b)?;
    ensure!(wr.is_ok() && wr.wr_id == 5, "receive: {wr:?}");
    ensure_eq!(read_back(&s.dst, 0, 9)?, b"after RNR".to_vec(), "payload");
    // With no retries left, an empty SRQ fails the SEND as an empty receive queue would.
    let mut o = env.opts();
    o.a.rnr_retry = 0;
    let s = SrqSetup::new(env, 1, SrqAttr::new(16, 1), &o)?;
    s.a[0].post_send(&[SendWr::send(2, &[s.src.sge(0, 8)?]).signaled()])?;
    let wc = env.wait1(&s.cq_a)?;
    env.expect_status(
        "SEND to an empty SRQ, rnr_retry 0",
        &wc,
        WcStatus::RnrRetryExcErr,
        &[],
    )?;
    Ok(Outcome::Pass)
}

/// Waits up to `within` for an event; `None` if none came.
fn next_event<B: Backend>(env: &Env<B>, within: Duration) -> Result<Option<verbs_api::AsyncEvent>, Failure> {
    Ok(env.ctx.get_async_event(Some(within))?)
}

/// Fails if an event arrives within [`QUIET`] (it is acknowledged first).
fn expect_no_event<B: Backend>(env: &Env<B>, when: &str) -> Result<(), Failure> {
    if let Some(ev) = next_event(env, QUIET)? {
        let text = ev.to_string();
        env.ctx.ack_async_event(ev);
        return Err(Failure(format!("{when}: unexpected event {text}")));
    }
    Ok(())
}

/// Waits for the SRQ limit event of `srq`, acknowledges it and checks it.
fn expect_limit_event<B: Backend>(env: &Env<B>, srq: &B::Srq, when: &str) -> Result<(), Failure> {
    let ev = next_event(env, env.cfg.timeout)?.ok_or_else(|| {
        Failure(format!(
            "{when}: no SRQ_LIMIT_REACHED within {:?}",
            env.cfg.timeout
        ))
    })?;
    let got = (ev.event_type, ev.element);
    env.ctx.ack_async_event(ev);
    ensure_eq!(
        got,
        (AsyncEventType::SrqLimitReached, AsyncElement::Srq(srq.handle())),
        "{when}: the event"
    );
    Ok(())
}

fn srq_limit<B: Backend>(env: &Env<B>) -> CaseResult {
    let s = SrqSetup::new(env, 1, SrqAttr::new(16, 1), &env.opts())?;
    for slot in 0..10 {
        s.post(slot as u64, slot)?;
    }
    s.srq
        .modify(&SrqAttr::default().with_limit(7), SrqAttrMask::LIMIT)?;
    ensure_eq!(s.srq.query()?.srq_limit, 7, "srq_limit after arming");
    // 10 -> 9 -> 8 -> 7: not below the limit yet.
    for k in 0..3 {
        s.send_recv(env, 0, k, k as u8)?;
    }
    expect_no_event(env, "7 receives left, limit 7")?;
    s.send_recv(env, 0, 3, 3)?;
    expect_limit_event(env, &s.srq, "6 receives left, limit 7")?;
    ensure_eq!(
        s.srq.query()?.srq_limit,
        0,
        "srq_limit after the event (disarmed)"
    );
    s.send_recv(env, 0, 4, 4)?;
    expect_no_event(env, "5 receives left after the event")?;
    Ok(Outcome::Pass)
}

fn srq_limit_at_create<B: Backend>(env: &Env<B>) -> CaseResult {
    let s = SrqSetup::new(env, 1, SrqAttr::new(16, 1).with_limit(5), &env.opts())?;
    let limit = s.srq.query()?.srq_limit;
    env.observe("srq_limit after create_srq with 5", limit);
    for slot in 0..6 {
        s.post(slot as u64, slot)?;
    }
    // 6 -> 5 -> 4: below 5 if the limit was armed.
    s.send_recv(env, 0, 0, 1)?;
    s.send_recv(env, 0, 1, 2)?;
    match env.take_event("event with 4 receives left", QUIET)? {
        None => {
            ensure_eq!(limit, 0, "srq_limit after create_srq with 5");
            Ok(Outcome::Pass)
        }
        Some(got) => {
            ensure!(
                env.profile == Profile::Rxe
                    && got == (AsyncEventType::SrqLimitReached, AsyncElement::Srq(s.srq.handle()))
                    && limit == 5,
                "srq_limit given at creation: query read {limit}, then {got:?} (expected 0 and no event)"
            );
            env.deviation(
                "the srq_limit given to create_srq was armed (query read 5, SRQ_LIMIT_REACHED came \
                 with 4 receives left): rxe_srq.c rxe_srq_from_init() sets srq->limit from the \
                 creation attributes",
            );
            Ok(Outcome::Pass)
        }
    }
}

fn srq_limit_armed_below<B: Backend>(env: &Env<B>) -> CaseResult {
    let s = SrqSetup::new(env, 1, SrqAttr::new(16, 1), &env.opts())?;
    for slot in 0..3 {
        s.post(slot as u64, slot)?;
    }
    s.srq
        .modify(&SrqAttr::default().with_limit(5), SrqAttrMask::LIMIT)?;
    expect_no_event(env, "armed at 5 with 3 receives, none consumed")?;
    ensure_eq!(s.srq.query()?.srq_limit, 5, "srq_limit while armed");
    s.send_recv(env, 0, 0, 1)?;
    expect_limit_event(env, &s.srq, "a receive consumed with the limit above the count")?;
    ensure_eq!(s.srq.query()?.srq_limit, 0, "srq_limit after the event");
    Ok(Outcome::Pass)
}

fn srq_limit_too_large<B: Backend>(env: &Env<B>) -> CaseResult {
    let pd = env.ctx.alloc_pd()?;
    let srq = pd.create_srq(&SrqAttr::new(16, 1))?;
    let before = srq.query()?;
    let Some(limit) = before.max_wr.checked_add(1) else {
        return Err(Failure(format!(
            "granted max_wr {} leaves no larger limit",
            before.max_wr
        )));
    };
    match srq.modify(&SrqAttr::default().with_limit(limit), SrqAttrMask::LIMIT) {
        Ok(()) => Err(Failure(format!(
            "srq_limit {limit} accepted on an SRQ of {}",
            before.max_wr
        ))),
        Err(e) => {
            ensure_eq!(e.errno(), libc::EINVAL, "errno ({e})");
            ensure_eq!(srq.query()?, before, "the SRQ after the refused modify");
            Ok(Outcome::Pass)
        }
    }
}

fn srq_resize<B: Backend>(env: &Env<B>) -> CaseResult {
    let caps = env.ctx.capabilities()?;
    let pd = env.ctx.alloc_pd()?;
    let srq = pd.create_srq(&SrqAttr::new(16, 1))?;
    let cur = srq.query()?.max_wr;
    let want = cur.saturating_mul(2).min(caps.max_srq_wr);
    ensure!(
        want > cur,
        "max_srq_wr {} leaves no room to grow from {cur}",
        caps.max_srq_wr
    );
    let mr = pd.reg_mr(64, A::LOCAL_WRITE)?;
    let sge = [mr.sge(0, 8)?];
    // Receives posted before the resize stay posted.
    for i in 0..4 {
        srq.post_recv(&[RecvWr::new(i, &sge)])?;
    }
    srq.modify(&SrqAttr::new(want, 1), SrqAttrMask::MAX_WR)?;
    let after = srq.query()?;
    ensure!(
        after.max_wr >= want,
        "max_wr {} after resizing to {want} (was {cur})",
        after.max_wr
    );
    // The new size is usable: it takes receives past the old capacity.
    for i in 4..=cur as u64 {
        srq.post_recv(&[RecvWr::new(i, &sge)])?;
    }
    Ok(Outcome::Pass)
}

/// rxe raises no LAST_WQE_REACHED.
const RXE_NO_LAST_WQE: &str = "no IBV_EVENT_QP_LAST_WQE_REACHED when a QP on an SRQ goes to ERR: rxe never \
raises it (no IB_EVENT_QP_LAST_WQE_REACHED anywhere in drivers/infiniband/sw/rxe/; rxe_qp.c \
rxe_qp_error() only moves the QP's state and schedules its tasks)";

fn srq_last_wqe<B: Backend>(env: &Env<B>) -> CaseResult {
    let s = SrqSetup::new(env, 2, SrqAttr::new(16, 1), &env.opts())?;
    for slot in 0..4 {
        s.post(slot as u64, slot)?;
    }
    let err = QpAttr {
        qp_state: QpState::Err,
        ..Default::default()
    };
    s.b[0].modify(&err, QpAttrMask::STATE)?;
    let wait = if env.profile == Profile::Rxe {
        Duration::from_secs(2).min(env.cfg.timeout)
    } else {
        env.cfg.timeout
    };
    match env.take_event("event after B0 went to ERR", wait)? {
        Some(got) => {
            ensure_eq!(
                got,
                (
                    AsyncEventType::QpLastWqeReached,
                    AsyncElement::Qp(s.b[0].qp_num())
                ),
                "the event after B0 went to ERR"
            );
        }
        None if env.profile == Profile::Rxe => env.deviation(RXE_NO_LAST_WQE),
        None => {
            return Err(Failure(format!(
                "no LAST_WQE_REACHED within {wait:?} after QP B0 on the SRQ went to ERR"
            )))
        }
    }
    // The SRQ's receives were not flushed with B0: B1 still takes the oldest.
    let wc = s.send_recv(env, 1, 1, 0x5a)?;
    ensure_eq!(wc.wr_id, 0, "the receive B1 took after B0 left");
    env.expect_empty(&s.cq_b, "B's CQ (no flush of the SRQ's receives)")?;
    Ok(Outcome::Pass)
}
