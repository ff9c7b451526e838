//! The connection manager's plain data (`rdma_cma.h`, `rdma_user_cm.h`): port spaces,
//! events and their parameters, reject reasons, addresses, path records and options.
//! The traits of [`crate::rdmacm`] take and give these; re-exported from there.

use std::fmt;
use std::net::SocketAddr;

use crate::device::{Gid, Mtu};
use crate::qp::AhAttr;

/// `enum rdma_port_space`: the port space an id's port belongs to (its connections'
/// service IDs are `(port space << 16) | port`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum PortSpace {
    /// `RDMA_PS_IPOIB`: UD, the Q_Key of the IPoIB broadcast group.
    Ipoib = 0x0002,
    /// `RDMA_PS_IB`: any QP type, addressed by `AF_IB` service IDs.
    Ib = 0x013F,
    /// `RDMA_PS_TCP`: reliable connections (RC).
    #[default]
    Tcp = 0x0106,
    /// `RDMA_PS_UDP`: unreliable datagrams (UD), with [`UDP_QKEY`].
    Udp = 0x0111,
}

impl PortSpace {
    /// From the raw `rdma_port_space` value.
    pub fn from_raw(v: u32) -> Option<PortSpace> {
        Some(match v {
            0x0002 => PortSpace::Ipoib,
            0x013F => PortSpace::Ib,
            0x0106 => PortSpace::Tcp,
            0x0111 => PortSpace::Udp,
            _ => return None,
        })
    }

    /// The QP type `rdma_create_id` gives an id of this port space.
    pub fn qp_type(self) -> crate::qp::QpType {
        match self {
            PortSpace::Udp | PortSpace::Ipoib => crate::qp::QpType::Ud,
            PortSpace::Tcp | PortSpace::Ib => crate::qp::QpType::Rc,
        }
    }
}

/// The Q_Key of the UD QPs of [`PortSpace::Udp`] (`RDMA_UDP_QKEY`).
pub const UDP_QKEY: u32 = 0x0123_4567;
/// The most private data an event carries (`RDMA_MAX_PRIVATE_DATA`).
pub const MAX_PRIVATE_DATA: usize = 256;
/// `RDMA_MAX_RESP_RES` / `RDMA_MAX_INIT_DEPTH`: "as many as the device allows".
pub const MAX_RD_ATOMIC: u8 = 0xff;

/// IBA's reject reasons an event's status carries with [`CmEventType::Rejected`]
/// (`IB_CM_REJ_*`, IBA 12.6.7.2).
pub mod reject {
    /// No QP available.
    pub const NO_QP: i32 = 1;
    /// The peer gave up waiting (it destroyed its id before the connection was set up).
    pub const TIMEOUT: i32 = 4;
    /// Unsupported request.
    pub const UNSUPPORTED: i32 = 5;
    /// No listener for the service (port) at the address.
    pub const INVALID_SERVICE_ID: i32 = 8;
    /// The QP types do not match.
    pub const INVALID_TRANSPORT_TYPE: i32 = 9;
    /// The peer's consumer rejected (`rdma_reject`), with its private data.
    pub const CONSUMER_DEFINED: i32 = 28;
    /// The peer does not support the ECE options offered (`rdma_reject_ece`).
    pub const VENDOR_OPTION_NOT_SUPPORTED: i32 = 35;

    /// The reason a reject with `reason` sends, as [`CmId::reject`](crate::rdmacm::CmId::reject)
    /// takes it: the kernel's `rdma_reject` (`ucma_reject`) sends the consumer's reason
    /// ([`CONSUMER_DEFINED`], which 0 means) or [`VENDOR_OPTION_NOT_SUPPORTED`]
    /// (`rdma_reject_ece`), and refuses any other with EINVAL.
    pub fn checked(reason: u8) -> crate::error::Result<u8> {
        match i32::from(reason) {
            0 | CONSUMER_DEFINED => Ok(CONSUMER_DEFINED as u8),
            VENDOR_OPTION_NOT_SUPPORTED => Ok(reason),
            _ => Err(crate::error::Error::cm(
                "rdma_reject",
                libc::EINVAL,
                format!(
                    "reject reason {reason}: rdma_cm sends the consumer's ({CONSUMER_DEFINED}) or \
                     ECE's ({VENDOR_OPTION_NOT_SUPPORTED}) only"
                ),
            )),
        }
    }
}

/// The statuses of a SIDR reply (`enum ib_cm_sidr_status`), which
/// [`CmEventType::Unreachable`] carries for a UD id whose request was refused.
pub mod sidr {
    /// Resolved.
    pub const SUCCESS: i32 = 0;
    /// No listener for the service.
    pub const UNSUPPORTED: i32 = 1;
    /// The consumer rejected.
    pub const REJECT: i32 = 2;
}

/// `enum rdma_cm_event_type`, with its numbering.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum CmEventType {
    /// `RDMA_CM_EVENT_ADDR_RESOLVED`: the address resolved; the id is bound to a device.
    AddrResolved = 0,
    /// `RDMA_CM_EVENT_ADDR_ERROR`: it did not (status: `-errno`).
    AddrError = 1,
    /// `RDMA_CM_EVENT_ROUTE_RESOLVED`.
    RouteResolved = 2,
    /// `RDMA_CM_EVENT_ROUTE_ERROR`.
    RouteError = 3,
    /// `RDMA_CM_EVENT_CONNECT_REQUEST`: a peer connects to a listener; the event holds a
    /// new id for the connection.
    ConnectRequest = 4,
    /// `RDMA_CM_EVENT_CONNECT_RESPONSE`: the peer accepted; move the QP to RTR and RTS
    /// and call [`CmId::establish`](crate::rdmacm::CmId::establish).
    ConnectResponse = 5,
    /// `RDMA_CM_EVENT_CONNECT_ERROR`.
    ConnectError = 6,
    /// `RDMA_CM_EVENT_UNREACHABLE`: the peer did not answer (status `-ETIMEDOUT`), or a
    /// UD request was refused (status: the SIDR status, [`sidr`]).
    Unreachable = 7,
    /// `RDMA_CM_EVENT_REJECTED`: status is the reject reason ([`reject`]).
    Rejected = 8,
    /// `RDMA_CM_EVENT_ESTABLISHED`.
    Established = 9,
    /// `RDMA_CM_EVENT_DISCONNECTED`.
    Disconnected = 10,
    /// `RDMA_CM_EVENT_DEVICE_REMOVAL`.
    DeviceRemoval = 11,
    /// `RDMA_CM_EVENT_MULTICAST_JOIN`.
    MulticastJoin = 12,
    /// `RDMA_CM_EVENT_MULTICAST_ERROR`.
    MulticastError = 13,
    /// `RDMA_CM_EVENT_ADDR_CHANGE`.
    AddrChange = 14,
    /// `RDMA_CM_EVENT_TIMEWAIT_EXIT`: the QP of a disconnected id may be reused.
    TimewaitExit = 15,
}

impl CmEventType {
    /// From the raw value.
    pub fn from_raw(v: u32) -> Option<CmEventType> {
        use CmEventType::*;
        Some(match v {
            0 => AddrResolved,
            1 => AddrError,
            2 => RouteResolved,
            3 => RouteError,
            4 => ConnectRequest,
            5 => ConnectResponse,
            6 => ConnectError,
            7 => Unreachable,
            8 => Rejected,
            9 => Established,
            10 => Disconnected,
            11 => DeviceRemoval,
            12 => MulticastJoin,
            13 => MulticastError,
            14 => AddrChange,
            15 => TimewaitExit,
            _ => return None,
        })
    }

    /// librdmacm's name (`rdma_event_str`).
    pub fn name(self) -> &'static str {
        use CmEventType::*;
        match self {
            AddrResolved => "RDMA_CM_EVENT_ADDR_RESOLVED",
            AddrError => "RDMA_CM_EVENT_ADDR_ERROR",
            RouteResolved => "RDMA_CM_EVENT_ROUTE_RESOLVED",
            RouteError => "RDMA_CM_EVENT_ROUTE_ERROR",
            ConnectRequest => "RDMA_CM_EVENT_CONNECT_REQUEST",
            ConnectResponse => "RDMA_CM_EVENT_CONNECT_RESPONSE",
            ConnectError => "RDMA_CM_EVENT_CONNECT_ERROR",
            Unreachable => "RDMA_CM_EVENT_UNREACHABLE",
            Rejected => "RDMA_CM_EVENT_REJECTED",
            Established => "RDMA_CM_EVENT_ESTABLISHED",
            Disconnected => "RDMA_CM_EVENT_DISCONNECTED",
            DeviceRemoval => "RDMA_CM_EVENT_DEVICE_REMOVAL",
            MulticastJoin => "RDMA_CM_EVENT_MULTICAST_JOIN",
            MulticastError => "RDMA_CM_EVENT_MULTICAST_ERROR",
            AddrChange => "RDMA_CM_EVENT_ADDR_CHANGE",
            TimewaitExit => "RDMA_CM_EVENT_TIMEWAIT_EXIT",
        }
    }
}

impl fmt::Display for CmEventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `struct rdma_conn_param`: what a connecting or accepting side offers (and what a
/// [`CmEventType::ConnectRequest`], `ConnectResponse`, `Established` or `Rejected`
/// event reports of the peer's).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConnParam {
    /// Private data for the peer (at most what the message carries: 56 bytes in a
    /// request, 196 in an accept, 148 in a reject).
    pub private_data: Vec<u8>,
    /// READs and atomics this side accepts from the peer ([`MAX_RD_ATOMIC`]: the
    /// device's most).
    pub responder_resources: u8,
    /// READs and atomics this side keeps outstanding.
    pub initiator_depth: u8,
    /// End-to-end flow control.
    pub flow_control: u8,
    /// Transport retries (at most 7).
    pub retry_count: u8,
    /// RNR retries (at most 7; 7 is "for ever").
    pub rnr_retry_count: u8,
    /// This side's QP uses an SRQ.
    pub srq: bool,
    /// This side's QP number (in an event: the peer's).
    pub qp_num: u32,
    /// A UD accept's Q_Key: 0 or [`UDP_QKEY`], the port space's (an IP port space's UD
    /// service answers with it whatever the caller offers: librdmacm passes no Q_Key, and
    /// the kernel takes one only for `AF_IB` addresses); another is refused
    /// ([`ConnParam::ud_qkey`]). In an event, the Q_Key the peer answered with.
    pub qkey: u32,
}

impl ConnParam {
    /// The Q_Key a UD accept with these parameters answers with ([`UDP_QKEY`]), or
    /// EINVAL for a [`ConnParam::qkey`] it cannot carry, so that a program does not
    /// rely on a Q_Key that no HCA's rdma_cm would send.
    pub fn ud_qkey(&self) -> crate::error::Result<u32> {
        match self.qkey {
            0 | UDP_QKEY => Ok(UDP_QKEY),
            other => Err(crate::error::Error::cm(
                "rdma_accept",
                libc::EINVAL,
                format!(
                    "Q_Key {other:#x}: a UD service of an IP port space answers with \
                     RDMA_UDP_QKEY ({UDP_QKEY:#x}); librdmacm carries no other"
                ),
            )),
        }
    }

    /// An RC connection's usual parameters, with `private_data`: one READ or atomic
    /// outstanding each way, 7 transport retries and RNR retries for ever (what rping
    /// offers).
    pub fn rc(private_data: &[u8]) -> Self {
        ConnParam {
            private_data: private_data.to_vec(),
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            ..ConnParam::default()
        }
    }
}

/// `struct rdma_ud_param`: a UD connection's peer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UdParam {
    /// The peer's private data.
    pub private_data: Vec<u8>,
    /// How to reach the peer (the address handle's attributes).
    pub ah_attr: AhAttr,
    /// The peer's QP number.
    pub qp_num: u32,
    /// Its Q_Key.
    pub qkey: u32,
}

/// An event's parameters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum CmEventParam {
    /// None (address and route events, most errors).
    #[default]
    None,
    /// A connected id's (`event->param.conn`).
    Conn(ConnParam),
    /// A UD id's (`event->param.ud`).
    Ud(UdParam),
}

impl CmEventParam {
    /// The private data the event carries (empty if none).
    pub fn private_data(&self) -> &[u8] {
        match self {
            CmEventParam::None => &[],
            CmEventParam::Conn(c) => &c.private_data,
            CmEventParam::Ud(u) => &u.private_data,
        }
    }
}

/// An id an event names: its handle and the caller's context value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CmIdRef {
    /// The id's handle ([`CmId::handle`](crate::rdmacm::CmId::handle)).
    pub handle: u32,
    /// Its context ([`CmId::context`](crate::rdmacm::CmId::context)).
    pub context: u64,
}

/// `struct rdma_cm_event`.
pub struct CmEvent<I> {
    /// What happened.
    pub event: CmEventType,
    /// 0, a negative errno, or the event's reason ([`reject`], [`sidr`]).
    pub status: i32,
    /// The id it happened to (for a [`CmEventType::ConnectRequest`], the new id).
    pub id: CmIdRef,
    /// For a [`CmEventType::ConnectRequest`]: the listening id.
    pub listen_id: Option<CmIdRef>,
    /// For a [`CmEventType::ConnectRequest`]: the new id, the caller's to accept, reject
    /// or drop.
    pub new_id: Option<I>,
    /// The peer's parameters (for [`CmEventType::MulticastJoin`]: the group's, see
    /// [`CmId::join_multicast`](crate::rdmacm::CmId::join_multicast)).
    pub param: CmEventParam,
    /// For [`CmEventType::MulticastJoin`] and [`CmEventType::MulticastError`]: the
    /// context the join was made with (librdmacm's `param.ud.private_data`).
    pub mcast: Option<u64>,
}

impl<I> CmEvent<I> {
    /// An event with no parameters and no new id.
    pub fn new(event: CmEventType, status: i32, id: CmIdRef) -> Self {
        CmEvent {
            event,
            status,
            id,
            listen_id: None,
            new_id: None,
            param: CmEventParam::None,
            mcast: None,
        }
    }
}

impl<I> fmt::Debug for CmEvent<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmEvent")
            .field("event", &self.event)
            .field("status", &self.status)
            .field("id", &self.id)
            .field("listen_id", &self.listen_id)
            .field("new_id", &self.new_id.is_some())
            .field("param", &self.param)
            .finish()
    }
}

impl<I> fmt::Display for CmEvent<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.event)?;
        if self.status != 0 {
            write!(f, " (status {})", self.status)?;
        }
        Ok(())
    }
}

/// The private data length an event reports for a message (rdma_cm's
/// `private_data_len` on InfiniBand and RoCE: the whole area of the message, less
/// rdma_cm's 36-byte header in a request of an IP port space).
pub fn private_data_len(event: CmEventType, qp_type: crate::qp::QpType) -> usize {
    match (event, qp_type) {
        (CmEventType::ConnectRequest, crate::qp::QpType::Ud) => 180,
        (CmEventType::ConnectRequest, _) => 56,
        (CmEventType::Established, crate::qp::QpType::Ud)
        | (CmEventType::Unreachable, crate::qp::QpType::Ud) => 136,
        (CmEventType::ConnectResponse, _) => 196,
        (CmEventType::Rejected, _) => 148,
        _ => 0,
    }
}

/// What `rdma_cm`'s address query reports of an id (`RDMA_USER_CM_QUERY_ADDR`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CmAddr {
    /// The id's source address (its bound or resolved address and port).
    pub src: Option<SocketAddr>,
    /// Its destination.
    pub dst: Option<SocketAddr>,
    /// The node GUID of the device the id is bound to, 0 if none.
    pub node_guid: u64,
    /// Its port.
    pub port_num: u8,
    /// The P_Key.
    pub pkey: u16,
    /// The device's index in the device list, if the backend knows it.
    pub ibdev_index: Option<u32>,
}

/// A path record (`struct ibv_sa_path_rec`): the route a resolved id uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PathRecord {
    /// Destination GID.
    pub dgid: Gid,
    /// Source GID.
    pub sgid: Gid,
    /// Destination LID.
    pub dlid: u16,
    /// Source LID.
    pub slid: u16,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Reversible.
    pub reversible: bool,
    /// P_Key.
    pub pkey: u16,
    /// Service level.
    pub sl: u8,
    /// Path MTU.
    pub mtu: Mtu,
    /// Static rate (`ibv_rate`).
    pub rate: u8,
    /// Packet lifetime (4.096 µs * 2^value).
    pub packet_life_time: u8,
    /// Preference.
    pub preference: u8,
}

/// `rdma_set_option`'s options (`RDMA_OPTION_ID_*`, `RDMA_OPTION_IB_PATH`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CmOption {
    /// `RDMA_OPTION_ID_TOS`: the type of service of the id's connections.
    Tos(u8),
    /// `RDMA_OPTION_ID_REUSEADDR`: the id may bind a port others bound.
    ReuseAddr(bool),
    /// `RDMA_OPTION_ID_AFONLY`: a listener bound to an IPv6 address takes IPv6 only.
    AfOnly(bool),
    /// `RDMA_OPTION_ID_ACK_TIMEOUT`: the QP's local ACK timeout (4.096 µs * 2^value).
    AckTimeout(u8),
    /// `RDMA_OPTION_IB_PATH`: the route, given instead of resolved.
    IbPath(Vec<PathRecord>),
}
