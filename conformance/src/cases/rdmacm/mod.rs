//! The connection manager (`man rdma_cm`, `man rdma_get_cm_event`, `man rdma_connect`,
//! `man rdma_accept`, `man rdma_reject`, `man rdma_disconnect`, `man rdma_init_qp_attr`;
//! rdma-core's rping, udaddy and pyverbs tests/test_rdmacm.py): the events, in their
//! order, and the statuses and private data of connecting, accepting, rejecting,
//! disconnecting from either side, a port nobody listens on, an address nobody has, UD,
//! and the QP transitions rdma_cm gives.
//!
//! Both ends run in this process on the backend's connection manager, at the IP of the
//! device's GID index 1 (RoCE v2's IPv4-mapped GID on rxe; the sim lists its address
//! there too), as rping's server and client on one host do. "An address nobody has" is
//! another address of that subnet: no neighbour answers for it, so the address query
//! ends when the timeout the caller passed does.
//!
//! Here the case list (in report order) and the helpers the cases share (a listener, a
//! resolved id, a connected pair, a SEND each way, an event expected); the cases by job:
//! `connect` (a connection's life and its events), `refuse` (connections that do not
//! come about), `ud` (UD and multicast), `attr` (the path record and the QP attributes
//! rdma_cm gives).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use verbs_api::rdmacm::{
    qp as cmqp, CmBackend, CmEvent, CmEventChannel, CmEventParam, CmEventType as E, CmId, CmIdOf, ConnParam,
    EventChannelOf, PortSpace,
};
use verbs_api::{
    poll_n, AccessFlags, Context, CqOf, MemoryRegion, MrOf, PdOf, ProtectionDomain, QpCap, QpInitAttr, QpOf,
    QpState, QpType, QueuePair, RecvWr, SendWr, WcStatus,
};

use super::case;
use crate::{ensure, ensure_eq, Env, Failure};

mod attr;
mod connect;
mod refuse;
mod ud;

use attr::{ib_path, init_qp_attr};
use connect::{async_events, connect, disconnect_client, disconnect_server};
use refuse::{no_address, no_listener, reject, reject_reason};
use ud::{multicast, ud, ud_qkey};

pub fn list<B: CmBackend>() -> Vec<crate::Case<B>> {
    vec![
        case!(
            "rdmacm.connect",
            "connect and accept: ADDR_RESOLVED, ROUTE_RESOLVED, CONNECT_REQUEST with the client's private data, CONNECT_RESPONSE with the server's and its QPN, ESTABLISHED; data flows",
            "man rdma_connect, man rdma_accept, man rdma_get_cm_event; rdma-core rping",
            connect
        ),
        case!(
            "rdmacm.disconnect-client",
            "the client disconnects: the server gets DISCONNECTED, the client its own once the server disconnects, then TIMEWAIT_EXIT on both",
            "man rdma_disconnect; man rdma_get_cm_event (RDMA_CM_EVENT_TIMEWAIT_EXIT)",
            disconnect_client
        ),
        case!(
            "rdmacm.disconnect-server",
            "the server disconnects: the client gets DISCONNECTED, the server its own once the client disconnects",
            "man rdma_disconnect",
            disconnect_server
        ),
        case!(
            "rdmacm.reject",
            "a rejected request: REJECTED with status 28 (consumer defined) and the server's private data, the whole 148-byte area",
            "man rdma_reject; IBA 12.6.7.2 (REJ reason 28)",
            reject
        ),
        case!(
            "rdmacm.reject-reason",
            "rdma_reject's reasons: one other than the consumer's (28) and ECE's (35) is EINVAL and the request stays the server's; rdma_reject_ece's 35 reaches the client as REJECTED's status",
            "man rdma_reject, man rdma_reject_ece; the kernel's ucma_reject; IBA 12.6.7.2 (REJ reason 35)",
            reject_reason
        ),
        case!(
            "rdmacm.ib-path",
            "rdma_set_option(RDMA_OPTION_IB_PATH) gives the route instead of rdma_resolve_route: EINVAL before the address resolves, ROUTE_RESOLVED after",
            "man rdma_set_option (RDMA_OPTION_IB_PATH); the kernel's ucma_set_ib_path, rdma_set_ib_path",
            ib_path
        ),
        case!(
            "rdmacm.no-listener",
            "a request to a port nobody listens on: REJECTED with status 8 (invalid service ID)",
            "man rdma_connect; IBA 12.6.7.2 (REJ reason 8)",
            no_listener
        ),
        case!(
            "rdmacm.no-address",
            "resolving an address nobody has: ADDR_ERROR with -ETIMEDOUT, once the timeout passed to rdma_resolve_addr is over",
            "man rdma_resolve_addr (timeout_ms)",
            no_address
        ),
        case!(
            "rdmacm.ud",
            "RDMA_PS_UDP: CONNECT_REQUEST with the client's private data, ESTABLISHED with the server's QPN and RDMA_UDP_QKEY; a datagram sent with them arrives",
            "man rdma_connect (UD), man rdma_get_cm_event (param.ud); rdma-core udaddy",
            ud,
            requires [Ud]
        ),
        case!(
            "rdmacm.ud-qkey",
            "a UD accept offering a Q_Key other than RDMA_UDP_QKEY is EINVAL (librdmacm carries none; an IP port space's service answers with RDMA_UDP_QKEY) and the request stays the server's; the accept without one gives ESTABLISHED with RDMA_UDP_QKEY",
            "man rdma_accept (UD), rdma_cma.h (struct rdma_conn_param has no Q_Key); the kernel's ucma_copy_conn_param",
            ud_qkey,
            requires [Ud]
        ),
        case!(
            "rdmacm.multicast",
            "rdma_join_multicast_ex of a UD id bound to the device's IP: MULTICAST_JOIN with the join's context, QP 0xFFFFFF, RDMA_UDP_QKEY and the group's address vector (RoCE: the IPv4-mapped group address as MGID, no MLID; InfiniBand: a multicast MGID and LID); the QP attaches to it; rdma_leave_multicast",
            "man rdma_join_multicast, man rdma_join_multicast_ex, man rdma_leave_multicast; the kernel's cma_iboe_join_multicast, cma_set_mgid; rdma-core mckey",
            multicast,
            requires [Ud]
        ),
        case!(
            "rdmacm.async",
            "the event channel on tokio: a waiter sleeps on the channel's descriptor and wakes for the next event; a connection made with every wait async",
            "man rdma_create_event_channel (channel->fd, poll(2)); man rdma_get_cm_event",
            async_events
        ),
        case!(
            "rdmacm.init-qp-attr",
            "rdma_init_qp_attr: INIT before a connection (state, P_Key index, port, no remote access); RTR and RTS of a request (the client's QPN, retries); remote access once connected; SQD refused",
            "man rdma_init_qp_attr; the kernel's rdma_cm (cma_ib_init_qp_attr, ib_cm_init_qp_attr)",
            init_qp_attr
        ),
    ]
}

/// The device's IP: the IPv4 address of its GID index 1.
fn device_ip<B: CmBackend>(env: &Env<B>) -> Result<Ipv4Addr, Failure> {
    let gid = env.ctx.query_gid(1, 1)?;
    gid.to_ipv4_mapped()
        .filter(|a| !a.is_unspecified())
        .ok_or_else(|| Failure(format!("GID index 1 ({gid:?}) is not an IPv4-mapped address")))
}

/// Takes the next event within the run's bound and checks it is `want`; records it as
/// `what`.
fn expect<B: CmBackend>(
    env: &Env<B>,
    ch: &EventChannelOf<B>,
    want: E,
    what: &str,
) -> Result<CmEvent<CmIdOf<B>>, Failure> {
    match ch.get_event(Some(env.cfg.timeout))? {
        Some(ev) => {
            env.observe(what, format!("{} {}", ev.event, ev.status));
            ensure!(ev.event == want, "{what}: expected {want}, got {ev}");
            Ok(ev)
        }
        None => Err(Failure(format!("{what}: no {want} within {:?}", env.cfg.timeout))),
    }
}

/// A listener at the device's IP, port chosen: (channel, id, address).
fn listener<B: CmBackend>(
    env: &Env<B>,
    ps: PortSpace,
) -> Result<(EventChannelOf<B>, CmIdOf<B>, SocketAddr), Failure> {
    let ch = env.backend.create_event_channel()?;
    let id = ch.create_id(7, ps, ps.qp_type())?;
    id.bind_addr(SocketAddr::new(IpAddr::V4(device_ip(env)?), 0))?;
    id.listen(4)?;
    let addr = id
        .query_addr()?
        .src
        .ok_or_else(|| Failure("a bound id without an address".into()))?;
    ensure!(addr.port() != 0, "binding to port 0 chose no port");
    Ok((ch, id, addr))
}

/// A client resolved (address and route) to `dst`.
fn resolved<B: CmBackend>(
    env: &Env<B>,
    ps: PortSpace,
    dst: SocketAddr,
) -> Result<(EventChannelOf<B>, CmIdOf<B>), Failure> {
    let ch = env.backend.create_event_channel()?;
    let id = ch.create_id(9, ps, ps.qp_type())?;
    id.resolve_addr(None, dst, Duration::from_secs(2))?;
    let ev = expect(env, &ch, E::AddrResolved, "client: address")?;
    ensure_eq!(
        (ev.id.handle, ev.id.context),
        (id.handle(), 9),
        "the event names the id"
    );
    ensure!(
        id.verbs().is_some(),
        "a resolved address binds the id to a device"
    );
    id.resolve_route(Duration::from_secs(2))?;
    expect(env, &ch, E::RouteResolved, "client: route")?;
    env.observe("paths", id.query_path()?.len());
    Ok((ch, id))
}

/// A QP of `qp_type` on `id`'s device, moved to INIT as `rdma_create_qp` does.
struct Side<B: CmBackend> {
    _pd: PdOf<B>,
    cq: CqOf<B>,
    qp: QpOf<B>,
    mr: MrOf<B>,
}

fn side<B: CmBackend>(id: &CmIdOf<B>, qp_type: QpType) -> Result<Side<B>, Failure> {
    let ctx = id
        .verbs()
        .ok_or_else(|| Failure("the id is bound to no device".into()))?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(16, None)?;
    let qp = pd.create_qp(&QpInitAttr::new(qp_type, &cq, &cq, QpCap::new(8, 8)))?;
    cmqp::init(id, &qp)?;
    let mr = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE)?;
    Ok(Side { _pd: pd, cq, qp, mr })
}

/// `pd` starts with `text` and is zero after it, `len` bytes in all.
fn private_data(what: &str, pd: &[u8], text: &[u8], len: usize) -> Result<(), Failure> {
    ensure_eq!(pd.len(), len, "{what}: private data length");
    ensure_eq!(&pd[..text.len()], text, "{what}: private data");
    ensure!(
        pd[text.len()..].iter().all(|&b| b == 0),
        "{what}: private data is zero-padded"
    );
    Ok(())
}

/// A connected RC pair, every event of the handshake checked.
struct Connected<B: CmBackend> {
    sch: EventChannelOf<B>,
    sid: CmIdOf<B>,
    cch: EventChannelOf<B>,
    cid: CmIdOf<B>,
    server: Side<B>,
    client: Side<B>,
    _lid: CmIdOf<B>,
}

fn connected<B: CmBackend>(env: &Env<B>) -> Result<Connected<B>, Failure> {
    let (lch, lid, addr) = listener(env, PortSpace::Tcp)?;
    let (cch, cid) = resolved(env, PortSpace::Tcp, addr)?;
    let client = side::<B>(&cid, QpType::Rc)?;
    cmqp::connect(&cid, &client.qp, &ConnParam::rc(b"hello from the client"))?;
    let req = expect(env, &lch, E::ConnectRequest, "server: request")?;
    ensure_eq!(
        req.listen_id.map(|l| l.handle),
        Some(lid.handle()),
        "the request names its listener"
    );
    private_data("request", req.param.private_data(), b"hello from the client", 56)?;
    let sid = req
        .new_id
        .ok_or_else(|| Failure("a request without a new id".into()))?;
    ensure_eq!(sid.context(), 7, "a request's id has its listener's context");
    ensure_eq!(
        sid.query_addr()?.dst,
        cid.query_addr()?.src,
        "the request comes from the client's address"
    );
    let server = side::<B>(&sid, QpType::Rc)?;
    cmqp::accept(&sid, &server.qp, &ConnParam::rc(b"welcome"))?;
    let rep = expect(env, &cch, E::ConnectResponse, "client: response")?;
    private_data("response", rep.param.private_data(), b"welcome", 196)?;
    match &rep.param {
        CmEventParam::Conn(c) => {
            ensure_eq!(c.qp_num, server.qp.qp_num(), "the response names the server's QP")
        }
        other => return Err(Failure(format!("a response with {other:?}"))),
    }
    cmqp::complete_connect(&cid, &client.qp)?;
    let est = expect(env, &lch, E::Established, "server: established")?;
    ensure_eq!(est.id.handle, sid.handle(), "ESTABLISHED names the request's id");
    ensure_eq!(client.qp.state()?, QpState::Rts, "the client's QP");
    ensure_eq!(server.qp.state()?, QpState::Rts, "the server's QP");
    Ok(Connected {
        // A request's id reports to its listener's channel.
        sch: lch,
        sid,
        cch,
        cid,
        server,
        client,
        _lid: lid,
    })
}

/// A SEND from `a` arrives at `b`, `grh` bytes after the start of the receive buffer.
fn send_recv<B: CmBackend>(
    env: &Env<B>,
    a: &Side<B>,
    b: &Side<B>,
    text: &[u8],
    ud: Option<(&verbs_api::AhOf<B>, u32, u32)>,
) -> Result<(), Failure> {
    let grh = if ud.is_some() { 40 } else { 0 };
    b.qp.post_recv(&[RecvWr::new(1, &[b.mr.sge(0, 128)?])])?;
    a.mr.write(0, text)?;
    let sge = [a.mr.sge(0, text.len())?];
    let mut wr = SendWr::send(2, &sge).signaled();
    if let Some((ah, qpn, qkey)) = ud {
        wr = wr.ud(ah, qpn, qkey);
    }
    a.qp.post_send(&[wr])?;
    let wc = poll_n(&a.cq, 1, env.cfg.timeout)?;
    ensure_eq!(wc[0].status, WcStatus::Success, "the send");
    let wc = poll_n(&b.cq, 1, env.cfg.timeout)?;
    ensure_eq!(wc[0].status, WcStatus::Success, "the receive");
    ensure_eq!(wc[0].byte_len as usize, grh + text.len(), "the receive's length");
    let mut got = vec![0u8; text.len()];
    b.mr.read(grh, &mut got)?;
    ensure_eq!(got, text, "the data");
    Ok(())
}

/// `r` is EINVAL, the refusal of `what`.
fn refused<T>(what: &str, r: verbs_api::Result<T>) -> Result<(), Failure> {
    match r {
        Err(e) => {
            ensure_eq!(e.errno(), libc::EINVAL, "{what}");
            Ok(())
        }
        Ok(_) => Err(Failure(format!("{what} was taken"))),
    }
}
