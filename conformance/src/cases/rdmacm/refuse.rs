//! Connections that do not come about (`man rdma_reject`, `man rdma_resolve_addr`,
//! `man rdma_connect`): a request the server rejects (with its private data and a reason),
//! a port nobody listens on, an address nobody has.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use verbs_api::rdmacm::{
    self, qp as cmqp, CmBackend, CmEventChannel, CmEventType as E, CmId, CmIdOf, ConnParam, EventChannelOf,
    PortSpace,
};
use verbs_api::QpType;

use super::{device_ip, expect, listener, private_data, refused, resolved, side, Side};
use crate::{ensure, ensure_eq, CaseResult, Env, Failure, Outcome};

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

pub(super) fn reject<B: CmBackend>(env: &Env<B>) -> CaseResult {
    let r = requested(env)?;
    r.sid.reject(b"no, sorry", 0)?;
    let rej = expect(env, &r.cch, E::Rejected, "client: rejected")?;
    ensure_eq!(rej.status, rdmacm::reject::CONSUMER_DEFINED, "the reject reason");
    private_data("reject", rej.param.private_data(), b"no, sorry", 148)?;
    Ok(Outcome::Pass)
}

pub(super) fn reject_reason<B: CmBackend>(env: &Env<B>) -> CaseResult {
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

pub(super) fn no_listener<B: CmBackend>(env: &Env<B>) -> CaseResult {
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

pub(super) fn no_address<B: CmBackend>(env: &Env<B>) -> CaseResult {
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
