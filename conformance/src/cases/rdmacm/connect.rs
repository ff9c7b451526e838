//! A connection's life (`man rdma_connect`, `man rdma_accept`, `man rdma_disconnect`,
//! `man rdma_get_cm_event`): established with its events and private data, disconnected
//! from either side, and the same events through the async event channel.

use std::time::Duration;

use verbs_api::rdmacm::aio::AsyncCmEvents;
use verbs_api::rdmacm::{
    qp as cmqp, CmBackend, CmEvent, CmEventChannel, CmEventType as E, CmId, CmIdOf, ConnParam,
    EventChannelOf, PortSpace,
};
use verbs_api::QpType;

use super::{connected, expect, listener, send_recv, side};
use crate::{ensure, ensure_eq, CaseResult, Env, Failure, Outcome};

pub(super) fn connect<B: CmBackend>(env: &Env<B>) -> CaseResult {
    let c = connected(env)?;
    send_recv(env, &c.client, &c.server, b"ping", None)?;
    send_recv(env, &c.server, &c.client, b"pong", None)?;
    Ok(Outcome::Pass)
}

/// No event on `ch` for a moment (one that should not come, or not yet).
fn quiet<B: CmBackend>(env: &Env<B>, ch: &EventChannelOf<B>, what: &str) -> Result<(), Failure> {
    if let Some(ev) = ch.get_event(Some(Duration::from_millis(200)))? {
        env.observe(what, ev.event);
        return Err(Failure(format!("{what}: unexpected {ev}")));
    }
    Ok(())
}

pub(super) fn disconnect_client<B: CmBackend>(env: &Env<B>) -> CaseResult {
    let c = connected(env)?;
    cmqp::disconnect(&c.cid, &c.client.qp)?;
    expect(env, &c.sch, E::Disconnected, "server: disconnected")?;
    quiet(env, &c.cch, "client: before the server disconnects")?;
    cmqp::disconnect(&c.sid, &c.server.qp)?;
    expect(env, &c.cch, E::Disconnected, "client: disconnected")?;
    expect(env, &c.cch, E::TimewaitExit, "client: timewait exit")?;
    expect(env, &c.sch, E::TimewaitExit, "server: timewait exit")?;
    Ok(Outcome::Pass)
}

pub(super) fn disconnect_server<B: CmBackend>(env: &Env<B>) -> CaseResult {
    let c = connected(env)?;
    cmqp::disconnect(&c.sid, &c.server.qp)?;
    expect(env, &c.cch, E::Disconnected, "client: disconnected")?;
    cmqp::disconnect(&c.cid, &c.client.qp)?;
    expect(env, &c.sch, E::Disconnected, "server: disconnected")?;
    Ok(Outcome::Pass)
}

/// The next event of `events` within `bound`, which must be `want`; recorded as `what`.
async fn next_async<B: CmBackend>(
    env: &Env<'_, B>,
    events: &AsyncCmEvents<'_, EventChannelOf<B>>,
    want: E,
    what: &str,
) -> Result<CmEvent<CmIdOf<B>>, Failure> {
    let ev = tokio::time::timeout(env.cfg.timeout, events.next())
        .await
        .map_err(|_| Failure(format!("{what}: the waiter was not woken for {want}")))??;
    env.observe(what, format!("{} {}", ev.event, ev.status));
    ensure!(ev.event == want, "{what}: expected {want}, got {ev}");
    Ok(ev)
}

pub(super) fn async_events<B: CmBackend>(env: &Env<B>) -> CaseResult {
    let rt = crate::cases::aio::runtime()?;
    let _g = rt.enter();
    let (lch, _lid, addr) = listener(env, PortSpace::Tcp)?;
    let cch = env.backend.create_event_channel()?;
    let cid = cch.create_id(9, PortSpace::Tcp, QpType::Rc)?;
    rt.block_on(async {
        let sev = AsyncCmEvents::new(&lch)?;
        let cev = AsyncCmEvents::new(&cch)?;
        let waiter = sev.next();
        tokio::pin!(waiter);
        ensure!(
            tokio::time::timeout(Duration::from_millis(50), waiter.as_mut())
                .await
                .is_err(),
            "an event on a listener nobody connected to"
        );
        cid.resolve_addr(None, addr, Duration::from_secs(2))?;
        next_async(env, &cev, E::AddrResolved, "client: address").await?;
        cid.resolve_route(Duration::from_secs(2))?;
        next_async(env, &cev, E::RouteResolved, "client: route").await?;
        let client = side::<B>(&cid, QpType::Rc)?;
        cmqp::connect(&cid, &client.qp, &ConnParam::rc(b"async"))?;
        // The waiter that slept since before the request wakes for it.
        let req = tokio::time::timeout(env.cfg.timeout, waiter)
            .await
            .map_err(|_| Failure("the listener's waiter was not woken for the request".into()))??;
        env.observe("server: request", format!("{} {}", req.event, req.status));
        ensure_eq!(req.event, E::ConnectRequest, "the listener's first event");
        let sid = req
            .new_id
            .ok_or_else(|| Failure("a request without a new id".into()))?;
        let server = side::<B>(&sid, QpType::Rc)?;
        cmqp::accept(&sid, &server.qp, &ConnParam::rc(b""))?;
        next_async(env, &cev, E::ConnectResponse, "client: response").await?;
        cmqp::complete_connect(&cid, &client.qp)?;
        next_async(env, &sev, E::Established, "server: established").await?;
        send_recv(env, &client, &server, b"async", None)?;
        Ok(Outcome::Pass)
    })
}
