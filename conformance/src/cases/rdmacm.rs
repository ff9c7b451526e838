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

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use verbs_api::rdmacm::aio::AsyncCmEvents;
use verbs_api::rdmacm::{
    self, qp as cmqp, CmBackend, CmEvent, CmEventChannel, CmEventParam, CmEventType as E, CmId, CmIdOf,
    CmOption, ConnParam, EventChannelOf, PathRecord, PortSpace,
};
use verbs_api::{
    poll_n, AccessFlags, Context, CqOf, Gid, MemoryRegion, MrOf, Mtu, PdOf, ProtectionDomain,
    QpAttrMask as M, QpCap, QpInitAttr, QpOf, QpState, QpType, QueuePair, RecvWr, SendWr, WcStatus,
};

use super::case;
use crate::{ensure, ensure_eq, CaseResult, Env, Failure, Outcome};

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

fn connect<B: CmBackend>(env: &Env<B>) -> CaseResult {
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

fn disconnect_client<B: CmBackend>(env: &Env<B>) -> CaseResult {
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

fn disconnect_server<B: CmBackend>(env: &Env<B>) -> CaseResult {
    let c = connected(env)?;
    cmqp::disconnect(&c.sid, &c.server.qp)?;
    expect(env, &c.cch, E::Disconnected, "client: disconnected")?;
    cmqp::disconnect(&c.cid, &c.client.qp)?;
    expect(env, &c.sch, E::Disconnected, "server: disconnected")?;
    Ok(Outcome::Pass)
}

/// A client's request that reached a listener: the server's id for it, and the client.
struct Requested<B: CmBackend> {
    _lch: EventChannelOf<B>,
    _lid: CmIdOf<B>,
    cch: EventChannelOf<B>,
    _cid: CmIdOf<B>,
    _client: Side<B>,
    sid: CmIdOf<B>,
}

fn requested<B: CmBackend>(env: &Env<B>) -> Result<Requested<B>, Failure> {
    let (lch, lid, addr) = listener(env, PortSpace::Tcp)?;
    let (cch, cid) = resolved(env, PortSpace::Tcp, addr)?;
    let client = side::<B>(&cid, QpType::Rc)?;
    cmqp::connect(&cid, &client.qp, &ConnParam::rc(b"may I?"))?;
    let req = expect(env, &lch, E::ConnectRequest, "server: request")?;
    let sid = req
        .new_id
        .ok_or_else(|| Failure("a request without a new id".into()))?;
    Ok(Requested {
        _lch: lch,
        _lid: lid,
        cch,
        _cid: cid,
        _client: client,
        sid,
    })
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

fn reject<B: CmBackend>(env: &Env<B>) -> CaseResult {
    let r = requested(env)?;
    r.sid.reject(b"no, sorry", 0)?;
    let rej = expect(env, &r.cch, E::Rejected, "client: rejected")?;
    ensure_eq!(rej.status, rdmacm::reject::CONSUMER_DEFINED, "the reject reason");
    private_data("reject", rej.param.private_data(), b"no, sorry", 148)?;
    Ok(Outcome::Pass)
}

fn reject_reason<B: CmBackend>(env: &Env<B>) -> CaseResult {
    let r = requested(env)?;
    let invalid = rdmacm::reject::INVALID_SERVICE_ID as u8;
    refused(
        &format!("rdma_reject with reason {invalid}"),
        r.sid.reject(b"", invalid),
    )?;
    let ece = rdmacm::reject::VENDOR_OPTION_NOT_SUPPORTED;
    r.sid.reject(b"no ECE", ece as u8)?;
    let rej = expect(env, &r.cch, E::Rejected, "client: rejected")?;
    ensure_eq!(rej.status, ece, "the reject reason");
    private_data("reject", rej.param.private_data(), b"no ECE", 148)?;
    Ok(Outcome::Pass)
}

fn ib_path<B: CmBackend>(env: &Env<B>) -> CaseResult {
    let (_lch, _lid, addr) = listener(env, PortSpace::Tcp)?;
    let ch = env.backend.create_event_channel()?;
    let id = ch.create_id(9, PortSpace::Tcp, QpType::Rc)?;
    let path = |sgid, dgid| {
        CmOption::IbPath(vec![PathRecord {
            sgid,
            dgid,
            pkey: 0xffff,
            hop_limit: 64,
            mtu: Mtu::Mtu1024,
            ..PathRecord::default()
        }])
    };
    refused(
        "RDMA_OPTION_IB_PATH before the address resolves",
        id.set_option(&path(Gid::default(), Gid::default())),
    )?;
    id.resolve_addr(None, addr, Duration::from_secs(2))?;
    expect(env, &ch, E::AddrResolved, "client: address")?;
    let (sgid, dgid) = id.query_gid()?;
    id.set_option(&path(sgid, dgid))?;
    expect(env, &ch, E::RouteResolved, "client: route given")?;
    Ok(Outcome::Pass)
}

fn no_listener<B: CmBackend>(env: &Env<B>) -> CaseResult {
    // A port nobody listens on: one a listener held and gave back.
    let addr = listener(env, PortSpace::Tcp)?.2;
    let (cch, cid) = resolved(env, PortSpace::Tcp, addr)?;
    let client = side::<B>(&cid, QpType::Rc)?;
    cmqp::connect(&cid, &client.qp, &ConnParam::rc(b""))?;
    let rej = expect(env, &cch, E::Rejected, "client: rejected")?;
    ensure_eq!(
        rej.status,
        rdmacm::reject::INVALID_SERVICE_ID,
        "the reject reason"
    );
    Ok(Outcome::Pass)
}

/// This host's address on its network: the device's, unless that is a loopback address
/// (the sim's default), then the source address of the host's route out.
fn host_ip<B: CmBackend>(env: &Env<B>) -> Result<Ipv4Addr, Failure> {
    let ip = device_ip(env)?;
    if !ip.is_loopback() {
        return Ok(ip);
    }
    let out = || -> std::io::Result<IpAddr> {
        let s = std::net::UdpSocket::bind("0.0.0.0:0")?;
        s.connect("198.51.100.1:9")?;
        Ok(s.local_addr()?.ip())
    };
    match out() {
        Ok(IpAddr::V4(a)) if !a.is_loopback() => Ok(a),
        other => Err(Failure(format!(
            "the device's IP is {ip} and the host has no route out ({other:?}): no subnet to pick an address nobody has from"
        ))),
    }
}

fn no_address<B: CmBackend>(env: &Env<B>) -> CaseResult {
    let mine = host_ip(env)?.octets();
    // Another host of that subnet, far from the usual gateway and DNS addresses.
    let nobody = Ipv4Addr::new(mine[0], mine[1], mine[2], if mine[3] == 250 { 251 } else { 250 });
    let ch = env.backend.create_event_channel()?;
    let id = ch.create_id(0, PortSpace::Tcp, QpType::Rc)?;
    // Longer than the neighbour's resolution takes to fail (3 probes a second apart on
    // Linux): rdma_cm asks again until its own timeout, and reports that.
    let t = Duration::from_secs(4);
    let start = Instant::now();
    id.resolve_addr(None, SocketAddr::new(IpAddr::V4(nobody), 7174), t)?;
    let ev = expect(env, &ch, E::AddrError, "address error")?;
    let took = start.elapsed();
    ensure_eq!(ev.status, -libc::ETIMEDOUT, "the address error's status");
    ensure!(
        took >= t,
        "the address error came after {took:?}, before the {t:?} passed"
    );
    Ok(Outcome::Pass)
}

fn ud<B: CmBackend>(env: &Env<B>) -> CaseResult {
    let (lch, _lid, addr) = listener(env, PortSpace::Udp)?;
    let (cch, cid) = resolved(env, PortSpace::Udp, addr)?;
    let client = side::<B>(&cid, QpType::Ud)?;
    ensure_eq!(client.qp.state()?, QpState::Rts, "a UD QP after rdma_create_qp");
    cid.connect(&ConnParam {
        private_data: b"ud?".to_vec(),
        ..Default::default()
    })?;
    let req = expect(env, &lch, E::ConnectRequest, "server: request")?;
    private_data("request", req.param.private_data(), b"ud?", 180)?;
    let sid = req
        .new_id
        .ok_or_else(|| Failure("a request without a new id".into()))?;
    let server = side::<B>(&sid, QpType::Ud)?;
    cmqp::accept(&sid, &server.qp, &ConnParam::default())?;
    let est = expect(env, &cch, E::Established, "client: established")?;
    let CmEventParam::Ud(u) = &est.param else {
        return Err(Failure(format!("ESTABLISHED of a UD id with {:?}", est.param)));
    };
    ensure_eq!(u.qp_num, server.qp.qp_num(), "the service's QPN");
    ensure_eq!(u.qkey, rdmacm::UDP_QKEY, "the service's Q_Key");
    ensure_eq!(u.private_data.len(), 136, "ESTABLISHED's private data length");
    let ah = client._pd.create_ah(&u.ah_attr)?;
    send_recv(env, &client, &server, b"datagram", Some((&ah, u.qp_num, u.qkey)))?;
    Ok(Outcome::Pass)
}

fn ud_qkey<B: CmBackend>(env: &Env<B>) -> CaseResult {
    let (lch, _lid, addr) = listener(env, PortSpace::Udp)?;
    let (cch, cid) = resolved(env, PortSpace::Udp, addr)?;
    let _client = side::<B>(&cid, QpType::Ud)?;
    cid.connect(&ConnParam::default())?;
    let req = expect(env, &lch, E::ConnectRequest, "server: request")?;
    let sid = req
        .new_id
        .ok_or_else(|| Failure("a request without a new id".into()))?;
    let server = side::<B>(&sid, QpType::Ud)?;
    let foreign = ConnParam {
        qkey: 0x1111_1111,
        ..ConnParam::default()
    };
    refused(
        &format!("a UD accept with Q_Key {:#x}", foreign.qkey),
        cmqp::accept(&sid, &server.qp, &foreign),
    )?;
    cmqp::accept(&sid, &server.qp, &ConnParam::default())?;
    let est = expect(env, &cch, E::Established, "client: established")?;
    let CmEventParam::Ud(u) = &est.param else {
        return Err(Failure(format!("ESTABLISHED of a UD id with {:?}", est.param)));
    };
    ensure_eq!(u.qkey, rdmacm::UDP_QKEY, "the service's Q_Key");
    Ok(Outcome::Pass)
}

fn multicast<B: CmBackend>(env: &Env<B>) -> CaseResult {
    let ip = device_ip(env)?;
    let ch = env.backend.create_event_channel()?;
    let id = ch.create_id(5, PortSpace::Udp, QpType::Ud)?;
    id.bind_addr(SocketAddr::new(ip.into(), 0))?;
    // A group of this run alone (239/8: administratively scoped).
    let pid = std::process::id();
    let group = Ipv4Addr::new(239, 77, (pid >> 8) as u8, pid as u8);
    let addr = SocketAddr::new(group.into(), 0);
    id.join_multicast(addr, 4242, false)?;
    let ev = expect(env, &ch, E::MulticastJoin, "join")?;
    ensure_eq!(ev.mcast, Some(4242), "the join's context");
    ensure_eq!(ev.id.context, 5, "the id's context");
    let CmEventParam::Ud(u) = &ev.param else {
        return Err(Failure(format!("MULTICAST_JOIN with {:?}", ev.param)));
    };
    ensure_eq!(u.qp_num, verbs_api::MULTICAST_QPN, "the group's QPN");
    ensure_eq!(u.qkey, rdmacm::UDP_QKEY, "the group's Q_Key");
    ensure!(u.ah_attr.is_global, "the group's address vector has no GRH");
    let mgid = u.ah_attr.grh.dgid;
    ensure!(
        mgid.is_multicast(),
        "the group's MGID {mgid:?} is no multicast GID"
    );
    if env.ctx.query_port(1)?.link_layer == verbs_api::LinkLayer::Ethernet {
        ensure_eq!(
            mgid.to_ipv4_mapped(),
            Some(group),
            "RoCE: the MGID is the group's address"
        );
        ensure_eq!(u.ah_attr.dlid, 0, "RoCE: the MLID");
    } else {
        ensure!(
            u.ah_attr.dlid >= verbs_api::MULTICAST_LID_BASE,
            "InfiniBand: the MLID {:#x} is no multicast LID",
            u.ah_attr.dlid
        );
    }
    // The MLID itself depends on the group, which is this run's (its pid): the report
    // says only which kind it is, so that two runs' reports agree.
    let dlid = match u.ah_attr.dlid {
        0 => "0",
        _ => "a multicast LID",
    };
    env.observe(
        "join: qp_num, qkey, dlid",
        format!("{:#x} {:#x} {dlid}", u.qp_num, u.qkey),
    );
    env.observe(
        "join: hop limit, sgid index",
        format!("{} {}", u.ah_attr.grh.hop_limit, u.ah_attr.grh.sgid_index),
    );
    // The QP attaches to the group as librdmacm attaches an id's own QP.
    let qp_side = side::<B>(&id, QpType::Ud)?;
    qp_side.qp.attach_mcast(&mgid, u.ah_attr.dlid)?;
    qp_side.qp.detach_mcast(&mgid, u.ah_attr.dlid)?;
    id.leave_multicast(addr)?;
    ensure!(
        ch.get_event(Some(Duration::from_millis(100)))?.is_none(),
        "an event after the leave"
    );
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

fn async_events<B: CmBackend>(env: &Env<B>) -> CaseResult {
    let rt = super::aio::runtime()?;
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

fn init_qp_attr<B: CmBackend>(env: &Env<B>) -> CaseResult {
    let (lch, _lid, addr) = listener(env, PortSpace::Tcp)?;
    let (_cch, cid) = resolved(env, PortSpace::Tcp, addr)?;
    let (a, m) = cid.init_qp_attr(QpState::Init)?;
    env.observe("INIT mask", format!("{m:?}"));
    ensure_eq!(
        m,
        M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
        "INIT's mask"
    );
    ensure_eq!(
        a.qp_access_flags,
        AccessFlags::empty(),
        "INIT's access before a connection"
    );
    let client = side::<B>(&cid, QpType::Rc)?;
    cmqp::connect(&cid, &client.qp, &ConnParam::rc(b""))?;
    let req = expect(env, &lch, E::ConnectRequest, "server: request")?;
    let sid = req
        .new_id
        .ok_or_else(|| Failure("a request without a new id".into()))?;
    let (a, m) = sid.init_qp_attr(QpState::Rtr)?;
    env.observe("RTR mask", format!("{m:?}"));
    ensure!(
        m.contains(
            M::STATE
                | M::AV
                | M::PATH_MTU
                | M::DEST_QPN
                | M::RQ_PSN
                | M::MAX_DEST_RD_ATOMIC
                | M::MIN_RNR_TIMER
        ),
        "RTR's mask: {m:?}"
    );
    ensure_eq!(a.dest_qp_num, client.qp.qp_num(), "RTR's destination QP");
    ensure!(a.ah_attr.is_global, "RTR's address vector has a GRH");
    let (a, m) = sid.init_qp_attr(QpState::Rts)?;
    env.observe("RTS mask", format!("{m:?}"));
    ensure!(
        m.contains(M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC),
        "RTS's mask: {m:?}"
    );
    ensure_eq!(
        (a.retry_cnt, a.rnr_retry),
        (7, 7),
        "RTS's retries (the request's)"
    );
    let (a, _) = sid.init_qp_attr(QpState::Init)?;
    ensure!(
        a.qp_access_flags
            .contains(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ),
        "INIT's access of a request with responder resources: {:?}",
        a.qp_access_flags
    );
    let e = sid.init_qp_attr(QpState::Sqd).err();
    env.observe(
        "SQD",
        e.as_ref()
            .map_or("accepted".into(), |e| crate::env::errno_name(e.errno())),
    );
    ensure!(e.is_some(), "rdma_init_qp_attr gives no SQD attributes");
    Ok(Outcome::Pass)
}
