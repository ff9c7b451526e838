//! The communication manager between two devices (IBA 12, the kernel's IB CM as rdma_cm
//! drives it): REQ, MRA, REP, RTU, REJ for a reliable connection; DREQ and DREP to end
//! it, then a time wait; SIDR_REQ and SIDR_REP for UD. Each side keeps the other's
//! device, communication ID, QP number and starting PSN, and the resources each offers,
//! as the IB CM does, and gives rdma_cm's events (`cma_ib_handler`, `cma_req_handler`,
//! `cma_sidr_rep_handler`) with their statuses and private data.
//!
//! Messages travel on the links between devices (reliable, checked), so they are resent
//! only when a link broke meanwhile: a request waits [`REQ_WAIT`] for an answer (a
//! receipt, MRA, extends that to [`MRA_WAIT`] while the peer's consumer decides), a reply
//! [`REP_WAIT`] for its RTU, a disconnect request [`DREQ_WAIT`] for its reply. A peer
//! whose device can no longer be reached (its process exited: its link closed and a new
//! one is refused) ends every handshake and connection with it at once: a handshake
//! fails as on its timeout, a connection is disconnected, as the kernel disconnects the
//! connections of a process that exits.
//!
//! What a peer may do is bounded: a request creates an id only for a listener with room
//! in its backlog (rdma_cm's `backlog`; a request beyond it is dropped, and the peer's
//! retries may find room), and a message for a connection names it by both
//! communication IDs and comes from the device the connection is with.

use std::time::Duration;

use verbs_api::rdmacm::{reject, sidr, CmEventParam, CmEventType, ConnParam, UdParam};
use verbs_api::{AsyncEventType, Error, Mtu, QpType, Result};

use super::manager::{new_conn_id, Core, Dev, Id, Ids, Outbox, State};
use super::rendezvous::Found;
use super::route::{self, Peer};
use backend_sim_proto::cm_msg::{self, Body, CmMsg, Kind, Rep, Req, SidrRep, SidrReq};

mod incoming;

pub use incoming::{on_message, on_peer_gone, on_timer};

/// How often a message whose answer is awaited is sent again.
const RESEND: Duration = Duration::from_millis(500);
/// How long a request waits for a reply (or a receipt).
pub const REQ_WAIT: Duration = Duration::from_secs(4);
/// How long a request whose receipt came waits for the peer's consumer.
pub const MRA_WAIT: Duration = Duration::from_secs(60);
/// How long a reply waits for its RTU.
pub const REP_WAIT: Duration = Duration::from_secs(60);
/// How long a disconnect request waits for its reply.
pub const DREQ_WAIT: Duration = Duration::from_secs(4);
/// The time wait after a disconnect, before `TIMEWAIT_EXIT`: rxe's (the IB CM's
/// `cm_convert_to_ms` of the path's packet lifetime plus one).
pub const TIMEWAIT: Duration = Duration::from_millis(1 << (route::PACKET_LIFE_TIME as u64 + 1 - 8));

/// The IB CM's states of a connection (`enum ib_cm_state`, the MRA states folded in).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Active: REQ sent (`mra`: its receipt came).
    ReqSent {
        /// A receipt came.
        mra: bool,
    },
    /// Active: REP received, waiting for the consumer's establish.
    RepRcvd,
    /// Passive: REQ received, waiting for the consumer's accept or reject.
    ReqRcvd,
    /// Passive: REP sent.
    RepSent,
    /// Both: connected.
    Established,
    /// DREQ sent.
    DreqSent,
    /// DREQ received.
    DreqRcvd,
    /// Disconnected; waiting before TIMEWAIT_EXIT.
    Timewait,
    /// Active UD: SIDR_REQ sent.
    SidrReqSent,
    /// Passive UD: SIDR_REQ received.
    SidrReqRcvd,
    /// Over (rejected, timed out, resolved, or the time wait ended).
    Idle,
}

impl Phase {
    /// Whether the IB CM still has an id for it (rdma_cm's `cm_id.ib`).
    pub fn has_cm_id(self) -> bool {
        true
    }

    /// States whose INIT attributes the IB CM gives.
    pub fn allows_init(self) -> bool {
        matches!(
            self,
            Phase::ReqSent { .. } | Phase::RepRcvd | Phase::ReqRcvd | Phase::RepSent | Phase::Established
        )
    }

    /// States whose RTR and RTS attributes the IB CM gives.
    pub fn allows_rtr(self) -> bool {
        matches!(
            self,
            Phase::RepRcvd | Phase::ReqRcvd | Phase::RepSent | Phase::Established
        )
    }

    /// Whether the connection still involves its peer.
    pub fn is_live(self) -> bool {
        !matches!(self, Phase::Idle | Phase::Timewait)
    }
}

/// A connection (the IB CM's id).
#[derive(Clone, Debug)]
pub struct Conn {
    /// Where it is.
    pub phase: Phase,
    /// This side's communication ID.
    pub local_comm: u32,
    /// The peer's (0 until known).
    pub remote_comm: u32,
    /// The peer's device.
    pub peer: Peer,
    /// This side's QP.
    pub local_qpn: u32,
    /// The peer's QP.
    pub remote_qpn: u32,
    /// The PSN the peer starts sending at (this side's send PSN is its receive PSN).
    pub remote_psn: u32,
    /// READs and atomics this side serves (its QP's `max_dest_rd_atomic`).
    pub responder_resources: u8,
    /// READs and atomics this side keeps outstanding (`max_rd_atomic`).
    pub initiator_depth: u8,
    /// Transport retries.
    pub retry_count: u8,
    /// RNR retries.
    pub rnr_retry_count: u8,
    /// Flow control.
    pub flow_control: u8,
    /// This side's QP uses an SRQ.
    pub srq: bool,
    /// The path MTU.
    pub path_mtu: Mtu,
    /// The message whose answer is awaited (resent until then).
    pub last: Option<CmMsg>,
    /// The answer's deadline, in resends left.
    pub tries: u32,
}

fn resends(wait: Duration) -> u32 {
    (wait.as_millis() / RESEND.as_millis()).max(1) as u32
}

fn einval(call: &'static str, why: impl Into<String>) -> Error {
    Error::cm(call, libc::EINVAL, why)
}

/// Private data `pd` as the receiver of a `kind` sees it: the whole area, zero-padded.
fn padded(pd: &[u8], kind: Kind) -> Vec<u8> {
    let mut v = pd.to_vec();
    v.resize(cm_msg::private_data_size(kind), 0);
    v
}

/// Sends `body` on `id`'s connection (and keeps it for resending if `awaits`).
fn send(out: &mut Outbox, id: &mut Id, body: Body, awaits: Option<Duration>) {
    let Some(c) = id.conn.as_mut() else {
        return;
    };
    let msg = CmMsg {
        local_comm_id: c.local_comm,
        remote_comm_id: c.remote_comm,
        body,
    };
    let dev = id
        .dev
        .as_ref()
        .expect("a connection is on a device")
        .shared()
        .clone();
    out.sends.push((dev.clone(), c.peer.addr, msg.clone()));
    if let Some(w) = awaits {
        c.last = Some(msg);
        c.tries = resends(w);
        arm(out, id, RESEND);
    } else {
        c.last = None;
    }
}

/// Arms `id`'s timer (a newer arm or a state change makes an older one a no-op).
fn arm(out: &mut Outbox, id: &mut Id, after: Duration) {
    id.gen += 1;
    if let Some(d) = &id.dev {
        out.timers.push((d.shared().clone(), id.handle, id.gen, after));
    }
}

/// Stops what `id`'s timer was for.
fn disarm(id: &mut Id) {
    id.gen += 1;
    if let Some(c) = id.conn.as_mut() {
        c.last = None;
    }
}

/// A reply with no connection to go with, to a peer's message (`remote` its comm ID).
fn answer(out: &mut Outbox, dev: &Dev, peer: &Peer, local: u32, remote: u32, body: Body) {
    out.sends.push((
        dev.shared().clone(),
        peer.addr,
        CmMsg {
            local_comm_id: local,
            remote_comm_id: remote,
            body,
        },
    ));
}

fn conn_event(p: &ConnParam) -> CmEventParam {
    CmEventParam::Conn(p.clone())
}

// ------------------------------------------------------------------- the calls

/// `rdma_connect`: a REQ (RC) or SIDR_REQ (UD) to the device the address resolved to,
/// after a lookup if it found none then.
pub fn connect(st: &mut Ids, handle: u32, param: &ConnParam, out: &mut Outbox) -> Result<()> {
    const CALL: &str = "rdma_connect";
    let fresh = st.fresh_comm();
    let id = st.ids.get_mut(&handle).expect("checked");
    id.need(CALL, &[State::RouteResolved])?;
    let ud = id.qp_type == QpType::Ud;
    let max = if ud { Kind::SidrReq } else { Kind::Req }.max_private();
    if param.private_data.len() > max {
        return Err(einval(
            CALL,
            format!(
                "{} bytes of private data, at most {max}",
                param.private_data.len()
            ),
        ));
    }
    let dev = id.dev(CALL)?.clone();
    let path = id.path.expect("a route-resolved id has a path");
    id.state = State::Connect;
    id.conn = Some(Conn {
        phase: if ud {
            Phase::SidrReqSent
        } else {
            Phase::ReqSent { mra: false }
        },
        local_comm: fresh,
        remote_comm: 0,
        peer: id.peer.unwrap_or(Peer {
            addr: id.dst.expect("resolved"),
            gid: path.dgid.0,
            lid: path.dlid,
        }),
        local_qpn: param.qp_num & 0xff_ffff,
        remote_qpn: 0,
        remote_psn: 0,
        responder_resources: param.responder_resources,
        initiator_depth: param.initiator_depth,
        retry_count: param.retry_count.min(7),
        rnr_retry_count: param.rnr_retry_count.min(7),
        flow_control: param.flow_control,
        srq: param.srq,
        path_mtu: path.mtu,
        last: None,
        tries: 0,
    });
    st.by_comm.insert(fresh, handle);
    let id = st.ids.get_mut(&handle).expect("checked");
    // Kept for the request: sent now if the device is known, after a lookup if not.
    id.conn.as_mut().expect("just set").last = Some(request(id, param));
    if id.peer.is_some() {
        send_request(out, id);
    } else {
        id.gen += 1;
        let dst = id.dst.expect("resolved");
        Core::lookup_for_connect(out, &dev, handle, id.gen, dst, id.ps);
    }
    Ok(())
}

/// The REQ or SIDR_REQ of a connect.
fn request(id: &Id, p: &ConnParam) -> CmMsg {
    let c = id.conn.as_ref().expect("connecting");
    let src = id.src.expect("a resolved id has a source");
    let dst = id.dst.expect("and a destination");
    let service_id = ((id.ps as u64) << 16) | u64::from(dst.port());
    let body = if id.qp_type == QpType::Ud {
        Body::SidrReq(SidrReq {
            service_id,
            src_port: src.port(),
            src_ip: route::ip16(src.ip()),
            dst_ip: route::ip16(dst.ip()),
            private_data: p.private_data.clone(),
        })
    } else {
        Body::Req(Req {
            service_id,
            qpn: c.local_qpn,
            qp_type: id.qp_type as u8,
            starting_psn: id.seq_num,
            responder_resources: c.responder_resources,
            initiator_depth: c.initiator_depth,
            flow_control: c.flow_control,
            retry_count: c.retry_count,
            rnr_retry_count: p.rnr_retry_count.min(7),
            srq: u8::from(c.srq),
            path_mtu: c.path_mtu as u8,
            src_port: src.port(),
            src_ip: route::ip16(src.ip()),
            dst_ip: route::ip16(dst.ip()),
            private_data: p.private_data.clone(),
        })
    };
    CmMsg {
        local_comm_id: c.local_comm,
        remote_comm_id: 0,
        body,
    }
}

/// Sends the request kept in the connection, and waits for its answer.
fn send_request(out: &mut Outbox, id: &mut Id) {
    if send_last(out, id) {
        id.conn.as_mut().expect("sent on it").tries = resends(REQ_WAIT);
    }
}

/// Sends the connection's last message (again) from the id's device to the peer's and
/// arms the resend timer; false if it has none.
pub(super) fn send_last(out: &mut Outbox, id: &mut Id) -> bool {
    let Some((msg, peer)) = id
        .conn
        .as_ref()
        .and_then(|c| Some((c.last.clone()?, c.peer.addr)))
    else {
        return false;
    };
    let dev = id
        .dev
        .as_ref()
        .expect("a connection is on a device")
        .shared()
        .clone();
    out.sends.push((dev, peer, msg));
    arm(out, id, RESEND);
    true
}

/// A connect's lookup ended: the request goes to the device found, or the connect ends
/// as rdma_cm's would when the peer's CM answers that no one listens (rejected with
/// `IB_CM_REJ_INVALID_SERVICE_ID`; for UD unreachable, `IB_SIDR_UNSUPPORTED`) or nothing
/// answers (unreachable).
pub fn after_lookup(st: &mut Ids, handle: u32, found: Found, out: &mut Outbox) {
    let Some(id) = st.ids.get_mut(&handle) else {
        return;
    };
    if id.state != State::Connect {
        return;
    }
    match found {
        Found::Device(p) => {
            id.peer = Some(p);
            if let Some(c) = id.conn.as_mut() {
                c.peer = p;
            }
            if let Some(path) = id.path.as_mut() {
                path.dgid = verbs_api::Gid(p.gid);
                path.dlid = p.lid;
            }
            send_request(out, id);
        }
        Found::NoListener => {
            let reason = match id.qp_type {
                QpType::Ud => sidr::UNSUPPORTED,
                _ => reject::INVALID_SERVICE_ID,
            };
            fail_handshake(id, Some(reason))
        }
        Found::Unreachable(_) => fail_handshake(id, None),
    }
}

/// The handshake of `id` failed: rejected for `reason` (as by a REJ without private
/// data), or with no answer (`None`): unreachable.
fn fail_handshake(id: &mut Id, reason: Option<i32>) {
    disarm(id);
    let ud = id.qp_type == QpType::Ud;
    if let Some(c) = id.conn.as_mut() {
        c.phase = Phase::Idle;
    }
    match (reason, ud) {
        (Some(r), false) => id.event(
            CmEventType::Rejected,
            r,
            CmEventParam::Conn(ConnParam {
                private_data: padded(&[], Kind::Rej),
                ..Default::default()
            }),
        ),
        (Some(r), true) => id.event(
            CmEventType::Unreachable,
            r,
            CmEventParam::Ud(UdParam {
                private_data: padded(&[], Kind::SidrRep),
                ..Default::default()
            }),
        ),
        (None, _) => id.event(CmEventType::Unreachable, -libc::ETIMEDOUT, CmEventParam::None),
    }
}

/// `rdma_accept`: the passive side's REP (RC) or SIDR_REP (UD); with `None` on the
/// active side, `rdma_establish`'s RTU.
pub fn accept(st: &mut Ids, handle: u32, param: Option<&ConnParam>, out: &mut Outbox) -> Result<()> {
    const CALL: &str = "rdma_accept";
    let id = st.ids.get_mut(&handle).expect("checked");
    id.need(CALL, &[State::Connect])?;
    let phase = id.conn.as_ref().map(|c| c.phase);
    match (phase, param) {
        (Some(Phase::ReqRcvd), Some(p)) => {
            if p.private_data.len() > Kind::Rep.max_private() {
                return Err(einval(CALL, "more private data than a REP carries (196 bytes)"));
            }
            id.unclaimed = false;
            let c = id.conn.as_mut().expect("checked");
            c.local_qpn = p.qp_num & 0xff_ffff;
            c.srq = p.srq;
            c.responder_resources = p.responder_resources;
            c.initiator_depth = p.initiator_depth;
            c.flow_control = p.flow_control;
            c.phase = Phase::RepSent;
            let rep = Body::Rep(Rep {
                qpn: c.local_qpn,
                starting_psn: id.seq_num,
                responder_resources: p.responder_resources,
                initiator_depth: p.initiator_depth,
                flow_control: p.flow_control,
                rnr_retry_count: p.rnr_retry_count.min(7),
                srq: u8::from(p.srq),
                private_data: p.private_data.clone(),
            });
            send(out, id, rep, Some(REP_WAIT));
            Ok(())
        }
        (Some(Phase::SidrReqRcvd), p) => {
            let p = p.cloned().unwrap_or_default();
            if p.private_data.len() > Kind::SidrRep.max_private() {
                return Err(einval(
                    CALL,
                    "more private data than a SIDR_REP carries (136 bytes)",
                ));
            }
            let qkey = p.ud_qkey()?;
            id.unclaimed = false;
            let c = id.conn.as_mut().expect("checked");
            c.local_qpn = p.qp_num & 0xff_ffff;
            c.phase = Phase::Idle;
            let rep = Body::SidrRep(SidrRep {
                status: sidr::SUCCESS as u8,
                qpn: c.local_qpn,
                qkey,
                private_data: p.private_data,
            });
            send(out, id, rep, None);
            Ok(())
        }
        (Some(Phase::RepRcvd), None) => {
            let c = id.conn.as_mut().expect("checked");
            c.phase = Phase::Established;
            send(out, id, Body::Rtu, None);
            Ok(())
        }
        (Some(Phase::ReqRcvd), None) => {
            // rdma_accept without parameters on a request: the kernel's RTU fails, and
            // its error path rejects the request.
            reject_now(id, &[], reject::CONSUMER_DEFINED as u16, out);
            Err(einval(CALL, "a connection request is accepted with parameters"))
        }
        (ph, _) => Err(einval(
            CALL,
            format!("nothing to accept (the connection is {ph:?})"),
        )),
    }
}

fn reject_now(id: &mut Id, pd: &[u8], reason: u16, out: &mut Outbox) {
    let of = match id.conn.as_ref().map(|c| c.phase) {
        Some(Phase::RepSent) => Kind::Rep,
        _ => Kind::Req,
    };
    if let Some(c) = id.conn.as_mut() {
        c.phase = Phase::Idle;
    }
    disarm(id);
    send(
        out,
        id,
        Body::Rej {
            reason,
            of,
            private_data: pd.to_vec(),
        },
        None,
    );
}

/// `rdma_reject`: a REJ with `reason` (checked: [`reject::checked`]) and private data;
/// for UD a SIDR_REP `IB_SIDR_REJECT`.
pub fn reject(st: &mut Ids, handle: u32, pd: &[u8], reason: u8, out: &mut Outbox) -> Result<()> {
    const CALL: &str = "rdma_reject";
    let id = st.ids.get_mut(&handle).expect("checked");
    let Some(phase) = id.conn.as_ref().map(|c| c.phase) else {
        return Err(einval(CALL, "the id has no connection request"));
    };
    match phase {
        Phase::SidrReqRcvd => {
            if pd.len() > Kind::SidrRep.max_private() {
                return Err(einval(
                    CALL,
                    "more private data than a SIDR_REP carries (136 bytes)",
                ));
            }
            id.conn.as_mut().expect("checked").phase = Phase::Idle;
            let rep = Body::SidrRep(SidrRep {
                status: sidr::REJECT as u8,
                qpn: 0,
                qkey: 0,
                private_data: pd.to_vec(),
            });
            send(out, id, rep, None);
            Ok(())
        }
        Phase::ReqRcvd | Phase::RepRcvd | Phase::RepSent | Phase::ReqSent { .. } => {
            if pd.len() > Kind::Rej.max_private() {
                return Err(einval(CALL, "more private data than a REJ carries (148 bytes)"));
            }
            reject_now(id, pd, u16::from(reason), out);
            Ok(())
        }
        other => Err(einval(
            CALL,
            format!("nothing to reject (the connection is {other:?})"),
        )),
    }
}

/// `rdma_disconnect`: a DREQ from a connection, the DREP to a DREQ received; otherwise
/// nothing (as the kernel's, whose DREQ and DREP both fail then).
pub fn disconnect(st: &mut Ids, handle: u32, out: &mut Outbox) -> Result<()> {
    const CALL: &str = "rdma_disconnect";
    let id = st.ids.get_mut(&handle).expect("checked");
    let Some(phase) = id.conn.as_ref().map(|c| c.phase) else {
        return Err(einval(CALL, "the id has no connection"));
    };
    match phase {
        Phase::Established => {
            id.conn.as_mut().expect("checked").phase = Phase::DreqSent;
            let qpn = id.conn.as_ref().map_or(0, |c| c.remote_qpn);
            send(
                out,
                id,
                Body::Dreq {
                    remote_qpn: qpn,
                    private_data: Vec::new(),
                },
                Some(DREQ_WAIT),
            );
        }
        Phase::DreqRcvd => {
            send(out, id, Body::Drep, None);
            enter_timewait(id, out);
        }
        _ => {}
    }
    Ok(())
}

/// `rdma_notify`: data arrived on the passive side's QP before the RTU
/// (`IBV_EVENT_COMM_EST`): the connection is established.
pub fn notify(st: &mut Ids, handle: u32, event: AsyncEventType) -> Result<()> {
    let id = st.ids.get_mut(&handle).expect("checked");
    if id.conn.is_none() {
        return Err(einval("rdma_notify", "the id has no connection"));
    }
    if event == AsyncEventType::CommEst {
        establish_passive(id);
    }
    Ok(())
}

fn establish_passive(id: &mut Id) {
    if id.conn.as_ref().is_some_and(|c| c.phase == Phase::RepSent) {
        disarm(id);
        id.conn.as_mut().expect("checked").phase = Phase::Established;
        id.event(
            CmEventType::Established,
            0,
            CmEventParam::Conn(ConnParam::default()),
        );
    }
}

fn enter_timewait(id: &mut Id, out: &mut Outbox) {
    disarm(id);
    if let Some(c) = id.conn.as_mut() {
        c.phase = Phase::Timewait;
    }
    arm(out, id, TIMEWAIT);
}

/// The connection ended (DREQ or DREP received, or the peer is gone): the consumer hears
/// once (rdma_cm's `RDMA_CM_CONNECT` → `RDMA_CM_DISCONNECT`).
fn disconnected(id: &mut Id, status: i32) {
    if id.state == State::Connect {
        id.state = State::Disconnect;
        id.event(
            CmEventType::Disconnected,
            status,
            CmEventParam::Conn(ConnParam::default()),
        );
    }
}

/// What destroying `id` tells its peer (the IB CM's `cm_destroy_id`).
pub fn on_destroy(st: &mut Ids, id: &Id, out: &mut Outbox) {
    let Some(c) = &id.conn else {
        return;
    };
    st.by_comm.remove(&c.local_comm);
    st.by_remote.remove(&(c.peer.addr, c.remote_comm));
    let Some(dev) = &id.dev else {
        return;
    };
    let body = match c.phase {
        Phase::ReqSent { .. } => Body::Rej {
            reason: reject::TIMEOUT as u16,
            of: Kind::Req,
            private_data: Vec::new(),
        },
        Phase::ReqRcvd | Phase::RepRcvd => Body::Rej {
            reason: reject::CONSUMER_DEFINED as u16,
            of: Kind::Req,
            private_data: Vec::new(),
        },
        Phase::RepSent => Body::Rej {
            reason: reject::CONSUMER_DEFINED as u16,
            of: Kind::Rep,
            private_data: Vec::new(),
        },
        Phase::Established => Body::Dreq {
            remote_qpn: c.remote_qpn,
            private_data: Vec::new(),
        },
        Phase::DreqRcvd => Body::Drep,
        Phase::SidrReqRcvd => Body::SidrRep(SidrRep {
            status: sidr::REJECT as u8,
            qpn: 0,
            qkey: 0,
            private_data: Vec::new(),
        }),
        Phase::DreqSent | Phase::Timewait | Phase::SidrReqSent | Phase::Idle => return,
    };
    answer(out, dev, &c.peer, c.local_comm, c.remote_comm, body);
}
