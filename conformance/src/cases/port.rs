//! Port state and its events (`man ibv_query_port`, `man ibv_get_async_event`: IBA 11.6.3
//! unaffiliated events `IBV_EVENT_PORT_ERR`, `IBV_EVENT_PORT_ACTIVE`): a port that goes
//! down says so in an event and in its state, and what is sent through it meanwhile
//! fares as on a fabric that lost the link (IBA 9.7.6: an RC request without an answer
//! is resent `retry_cnt` times, then `IBV_WC_RETRY_EXC_ERR`; a request resent after the
//! port is back loses nothing; a UD datagram is lost and its WR completes). rxe fails
//! what it would send through a netdev that is down instead (rxe_net.c `rxe_prepare()`
//! finds no route: rxe_req.c completes the WQE with `IBV_WC_LOC_QP_OP_ERR` and moves the
//! QP to ERR). The runner moves the port ([`Env::set_port`]): the sim's fault injection,
//! or `ip link set dev NETDEV down|up` on a RoCE device (root), else the case is skipped.
//! A port's address changes too (`IBV_EVENT_LID_CHANGE`, `IBV_EVENT_GID_CHANGE`): the
//! runner gives the sim's InfiniBand port a new LID, or adds an address to a RoCE port
//! ([`Env::change_address`]: the sim's fault injection, `ip addr add` on a netdev); an
//! InfiniBand device's LID is its subnet manager's, and the case is skipped there.

use std::time::{Duration, Instant};

use verbs_api::{
    AccessFlags as A, AsyncElement, AsyncEventType, Backend, Context, MemoryRegion, PortState, QueuePair,
    RecvWr, SendWr, WcStatus,
};

use super::case;
use super::ud::{UdSetup, GRH, QKEY, QUIET};
use crate::env::AddrChange;
use crate::{ensure, ensure_eq, CaseResult, Env, Failure, Outcome, Profile};

pub fn list<B: Backend>() -> Vec<crate::Case<B>> {
    vec![
        case!(
            "port.events",
            "a port taken down raises PORT_ERR and reads IBV_PORT_DOWN; brought back, PORT_ACTIVE and IBV_PORT_ACTIVE",
            "man ibv_get_async_event (IBV_EVENT_PORT_ERR, IBV_EVENT_PORT_ACTIVE); man ibv_query_port (state, phys_state); IBA 11.6.3.3",
            events
        ),
        case!(
            "port.rc-while-down",
            "an RC WRITE through a port that stays down is retried retry_cnt times and completes RETRY_EXC_ERR, the QP in ERR",
            "IBA 9.7.6.1.3 (local ACK timeout, retry_cnt), C9-140; man ibv_poll_cq (IBV_WC_RETRY_EXC_ERR)",
            rc_while_down
        ),
        case!(
            "port.rc-back-in-time",
            "an RC SEND posted while the port is down completes SUCCESS, delivered once, when the port comes back within the retry budget",
            "IBA 9.7.6.1.3 (a request resent after a timeout); 9.7.5.1.2 (duplicates not executed twice)",
            rc_back_in_time
        ),
        case!(
            "port.addr-change",
            "a port's address changes: an InfiniBand port's new LID raises LID_CHANGE and ibv_query_port reads it; an address added to a RoCE port's netdev raises GID_CHANGE and ibv_query_gid lists its GID, removed again GID_CHANGE and the GID is gone",
            "man ibv_get_async_event (IBV_EVENT_LID_CHANGE, IBV_EVENT_GID_CHANGE); man ibv_query_port (lid); man ibv_query_gid; IBA 11.6.3.3",
            addr_change
        ),
        case!(
            "port.ud-while-down",
            "a UD datagram sent through a port that is down completes SUCCESS and is lost; once the port is back one arrives",
            "IBA 9.8.3 (UD: no acknowledgement, a lost datagram is not reported); man ibv_post_send",
            ud_while_down,
            requires [Ud]
        ),
    ]
}

/// Why rxe fails a send through a port that is down.
const RXE_NO_ROUTE: &str = "rxe sends through its netdev's routes: with the netdev down rxe_prepare() \
     (rxe_net.c) finds none, and rxe_req.c completes the WQE with LOC_QP_OP_ERR and moves the QP to ERR";

/// How long a port change may take to show (a netdev's carrier on a real device).
const SETTLE: Duration = Duration::from_secs(10);

/// The port taken down for a case, brought back when it ends, whatever its outcome:
/// the next case needs it.
struct Down<'a, 'e, B: Backend> {
    env: &'e Env<'a, B>,
    up: bool,
}

impl<'a, 'e, B: Backend> Down<'a, 'e, B> {
    /// Takes the port down; `Err` is the case's outcome (skipped where this runner cannot).
    fn new(env: &'e Env<'a, B>) -> Result<Self, CaseResult> {
        env.set_port(false).map_err(|e| e.outcome())?;
        Ok(Down { env, up: false })
    }

    /// Brings the port back now and waits until it is active.
    fn up(&mut self) -> Result<(), Failure> {
        self.up = true;
        self.env.set_port(true).map_err(|e| match e.outcome() {
            Err(f) => f,
            Ok(_) => Failure("the port went down, but cannot be brought back".into()),
        })?;
        self.env.wait_port(PortState::Active, SETTLE)
    }
}

impl<B: Backend> Drop for Down<'_, '_, B> {
    fn drop(&mut self) {
        if !self.up {
            let _ = self.env.set_port(true);
            let _ = self.env.wait_port(PortState::Active, SETTLE);
        }
    }
}

/// Takes events until one of type `want` on port 1 (others, such as the GID changes a
/// netdev going down brings, are passed over), recording it as `what`.
fn port_event<B: Backend>(env: &Env<B>, what: &str, want: AsyncEventType) -> Result<(), Failure> {
    let until = Instant::now() + SETTLE;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match env.take_event(what, left)? {
            Some((t, AsyncElement::Port(1))) if t == want => return Ok(()),
            Some(_) if !left.is_zero() => continue,
            other => {
                return Err(Failure(format!(
                    "{what}: expected {want:?} on port 1 within {SETTLE:?}, got {other:?}"
                )))
            }
        }
    }
}

fn events<B: Backend>(env: &Env<B>) -> CaseResult {
    let before = env.ctx.query_port(1)?;
    ensure_eq!(before.state, PortState::Active, "port 1 before the case");
    let mut down = match Down::new(env) {
        Ok(d) => d,
        Err(outcome) => return outcome,
    };
    port_event(env, "event when down", AsyncEventType::PortErr)?;
    env.wait_port(PortState::Down, SETTLE)?;
    let attr = env.ctx.query_port(1)?;
    env.observe("state when down", format_args!("{:?}", attr.state));
    env.observe("phys_state when down", attr.phys_state);
    ensure!(
        attr.phys_state != before.phys_state,
        "phys_state reads {} down as up: the physical link changed",
        attr.phys_state
    );
    down.up()?;
    port_event(env, "event when back", AsyncEventType::PortActive)?;
    let attr = env.ctx.query_port(1)?;
    env.observe("phys_state when back", attr.phys_state);
    ensure_eq!(attr.phys_state, before.phys_state, "phys_state when back");
    Ok(Outcome::Pass)
}

fn rc_while_down<B: Backend>(env: &Env<B>) -> CaseResult {
    let mut o = env.opts();
    // 16.8 ms per timeout, three retries: well within the case's bound.
    o.a.timeout = 12;
    o.a.retry_cnt = 3;
    let p = env.pair(&o)?;
    let src = env.mr(&p.pd, 64, A::LOCAL_WRITE)?;
    let dst = env.mr(&p.pd, 64, A::LOCAL_WRITE | A::REMOTE_WRITE)?;
    let mut down = match Down::new(env) {
        Ok(d) => d,
        Err(outcome) => return outcome,
    };
    env.wait_port(PortState::Down, SETTLE)?;
    p.a.post_send(&[SendWr::write(1, &[src.sge(0, 64)?], dst.remote().at(0)).signaled()])?;
    let wc = env.wait1(&p.cq_a)?;
    ensure_eq!(wc.wr_id, 1, "wr_id");
    env.expect_status(
        "WRITE through a port that is down",
        &wc,
        WcStatus::RetryExcErr,
        &[(Profile::Rxe, WcStatus::LocQpOpErr, RXE_NO_ROUTE)],
    )?;
    down.up()?;
    ensure_eq!(p.a.state()?, verbs_api::QpState::Err, "QP state after the error");
    Ok(Outcome::Pass)
}

fn rc_back_in_time<B: Backend>(env: &Env<B>) -> CaseResult {
    let mut o = env.opts();
    // 67 ms per timeout, seven retries: about half a second of budget, the port is down
    // for a fifth of it.
    o.a.timeout = 14;
    o.a.retry_cnt = 7;
    let p = env.pair(&o)?;
    let src = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    let dst = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    let data = crate::env::pattern(4096, 7);
    src.write(0, &data)?;
    p.b.post_recv(&[RecvWr::new(2, &[dst.sge(0, 4096)?])])?;
    let mut down = match Down::new(env) {
        Ok(d) => d,
        Err(outcome) => return outcome,
    };
    env.wait_port(PortState::Down, SETTLE)?;
    p.a.post_send(&[SendWr::send(1, &[src.sge(0, 4096)?]).signaled()])?;
    std::thread::sleep(Duration::from_millis(100));
    if env.profile == Profile::Rxe {
        // rxe fails the SEND at once: nothing to resend when the port is back.
        let wc = env.wait1(&p.cq_a)?;
        env.expect_status(
            "SEND posted while the port is down",
            &wc,
            WcStatus::Success,
            &[(Profile::Rxe, WcStatus::LocQpOpErr, RXE_NO_ROUTE)],
        )?;
        down.up()?;
        return Ok(Outcome::Pass);
    }
    down.up()?;
    let wc = env.wait1(&p.cq_a)?;
    env.expect_status("SEND posted while the port is down", &wc, WcStatus::Success, &[])?;
    let r = env.wait1(&p.cq_b)?;
    ensure_eq!(
        (r.wr_id, r.status, r.byte_len),
        (2, WcStatus::Success, 4096),
        "the receive"
    );
    ensure!(
        crate::env::read_back(&dst, 0, 4096)? == data,
        "the payload differs"
    );
    env.expect_empty(&p.cq_b, "receive CQ after the one SEND")?;
    Ok(Outcome::Pass)
}

fn ud_while_down<B: Backend>(env: &Env<B>) -> CaseResult {
    let u = UdSetup::new(env, 1)?;
    u.post(1, 0, 64)?;
    let mut down = match Down::new(env) {
        Ok(d) => d,
        Err(outcome) => return outcome,
    };
    env.wait_port(PortState::Down, SETTLE)?;
    let send = |wr_id| -> Result<_, Failure> {
        u.s[0].post_send(&[SendWr::send(wr_id, &[u.src.sge(0, 64)?]).signaled().ud(
            &u.ah,
            u.r.qp_num(),
            QKEY,
        )])?;
        env.wait1(&u.cq_s)
    };
    let wc = send(1)?;
    env.expect_status(
        "UD send through a port that is down",
        &wc,
        WcStatus::Success,
        &[(Profile::Rxe, WcStatus::LocQpOpErr, RXE_NO_ROUTE)],
    )?;
    if wc.status != WcStatus::Success {
        down.up()?;
        return Ok(Outcome::Pass);
    }
    let got = env.quiet(&u.cq_r, QUIET)?;
    ensure!(
        got.is_empty(),
        "a datagram arrived through a port that is down: {got:?}"
    );
    down.up()?;
    let wc = send(2)?;
    ensure_eq!(wc.status, WcStatus::Success, "UD send once the port is back");
    let r = env.wait1(&u.cq_r)?;
    ensure_eq!(
        (r.wr_id, r.status, r.byte_len as usize),
        (1, WcStatus::Success, GRH + 64),
        "the receive"
    );
    Ok(Outcome::Pass)
}

/// Whether port 1's GID table lists `gid` (an entry a provider cannot read counts as
/// empty).
fn lists_gid<B: Backend>(env: &Env<B>, gid: &verbs_api::Gid) -> Result<bool, Failure> {
    let len = env.ctx.query_port(1)?.gid_tbl_len;
    Ok((0..len).any(|i| env.ctx.query_gid(1, i).is_ok_and(|g| g == *gid)))
}

/// Waits up to [`SETTLE`] until port 1's GID table lists `gid` (`listed`) or not: the
/// kernel updates it after the netdev's address changed.
fn wait_gid<B: Backend>(env: &Env<B>, gid: &verbs_api::Gid, listed: bool) -> Result<(), Failure> {
    let until = Instant::now() + SETTLE;
    while lists_gid(env, gid)? != listed {
        if Instant::now() >= until {
            return Err(Failure(format!(
                "{}: the GID table {} {gid:?} {SETTLE:?} after the change",
                if listed { "added" } else { "removed" },
                if listed { "does not list" } else { "still lists" },
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Passes over the events that follow a change (a kernel raises `GID_CHANGE` once per
/// entry: RoCE v1 and v2 each have one) until none comes for a while.
fn drain_events<B: Backend>(env: &Env<B>) {
    while let Ok(Some(_)) = env
        .ctx
        .get_async_event(Some(Duration::from_millis(300)))
        .map(|e| e.map(|e| env.ctx.ack_async_event(e)))
    {}
}

fn addr_change<B: Backend>(env: &Env<B>) -> CaseResult {
    let before = env.ctx.query_port(1)?;
    let change = match env.change_address() {
        Ok(c) => c,
        Err(e) => return e.outcome(),
    };
    match change {
        AddrChange::Lid(lid) => {
            port_event(env, "event on a new LID", AsyncEventType::LidChange)?;
            let now = env.ctx.query_port(1)?.lid;
            ensure!(
                now != before.lid,
                "ibv_query_port still reads LID {:#x}",
                before.lid
            );
            ensure_eq!(now, lid, "the LID ibv_query_port reads");
            Ok(Outcome::Pass)
        }
        AddrChange::Gid { gid, .. } => {
            let listed = port_event(env, "event on an added address", AsyncEventType::GidChange)
                .and_then(|()| wait_gid(env, &gid, true));
            drain_events(env);
            // The address goes whatever the outcome: the next case needs the port as it was.
            let restored = env.restore_address(&change);
            listed?;
            restored.map_err(|e| match e.outcome() {
                Err(f) => f,
                Ok(_) => Failure("the address was added, but cannot be removed".into()),
            })?;
            port_event(env, "event on a removed address", AsyncEventType::GidChange)?;
            wait_gid(env, &gid, false)?;
            drain_events(env);
            Ok(Outcome::Pass)
        }
    }
}
