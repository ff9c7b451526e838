//! The connection manager's messages between two sim devices (docs/wire.md "Connection
//! manager"): IBA's communication management MADs (IBA 12.6: REQ, MRA, REJ, REP, RTU,
//! DREQ, DREP, and 12.11's SIDR_REQ, SIDR_REP) at the granularity the sim needs, with no
//! I/O.
//!
//! A message travels as the payload of a datagram to QP 1 (the GSI, as a CM MAD does on
//! an HCA) on the link between the two devices, whose setup proved which device is at the
//! other end: the receiver knows the sender's device from the link, never from the
//! message. Each message names the sender's communication ID (`local_comm_id`) and, once
//! it knows it, the receiver's (`remote_comm_id`), as IBA's Local and Remote
//! Communication IDs do.
//!
//! Private data is carried as the consumer gave it, up to IBA's size for the message
//! less what rdma_cm puts in front of it for an IP port space (its 36-byte header in a
//! REQ and a SIDR_REQ): the receiver sees the message's whole private data area
//! ([`private_data_size`]), zero-padded, as rdma_cm reports it.
//!
//! The decoder takes any bytes and never panics; every message has exactly one
//! encoding (reserved fields zero, lengths exact, QPNs and PSNs 24 bits).

use std::fmt;

/// The QP number CM messages are addressed to (IBA's General Services Interface, QP1).
pub const CM_QPN: u32 = 1;
/// The Q_Key of the GSI (IBA 13.5.1: QP1's well-known Q_Key).
pub const CM_QKEY: u32 = 0x8001_0000;

/// The bytes rdma_cm puts in front of the consumer's private data in a REQ and a
/// SIDR_REQ of an IP port space (`struct cma_hdr`).
pub const CMA_HDR_LEN: usize = 36;

/// Bytes of the common header.
const HDR_LEN: usize = 12;

/// IBA's private data sizes (IBA 12.6, `IB_CM_*_PRIVATE_DATA_SIZE`).
pub mod sizes {
    /// REQ.
    pub const REQ: usize = 92;
    /// MRA.
    pub const MRA: usize = 222;
    /// REJ.
    pub const REJ: usize = 148;
    /// REP.
    pub const REP: usize = 196;
    /// RTU.
    pub const RTU: usize = 224;
    /// DREQ.
    pub const DREQ: usize = 220;
    /// DREP.
    pub const DREP: usize = 224;
    /// SIDR_REQ.
    pub const SIDR_REQ: usize = 216;
    /// SIDR_REP.
    pub const SIDR_REP: usize = 136;
}

/// The message kinds, with the numbers the encoding uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// Connection request.
    Req = 1,
    /// Message receipt acknowledgement: the request (or reply) arrived and waits for its
    /// consumer.
    Mra = 2,
    /// Reject.
    Rej = 3,
    /// Reply to a request.
    Rep = 4,
    /// Ready to use.
    Rtu = 5,
    /// Disconnect request.
    Dreq = 6,
    /// Disconnect reply.
    Drep = 7,
    /// Service ID resolution request (UD).
    SidrReq = 8,
    /// Service ID resolution reply (UD).
    SidrRep = 9,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Req,
            2 => Kind::Mra,
            3 => Kind::Rej,
            4 => Kind::Rep,
            5 => Kind::Rtu,
            6 => Kind::Dreq,
            7 => Kind::Drep,
            8 => Kind::SidrReq,
            9 => Kind::SidrRep,
            _ => return None,
        })
    }

    /// Bytes of the kind's fields after the common header.
    fn body_len(self) -> usize {
        match self {
            Kind::Req => 8 + 4 + 1 + 4 + 7 + 2 + 16 + 16 + 3,
            Kind::Mra => 4,
            Kind::Rej => 4,
            Kind::Rep => 4 + 4 + 5 + 3,
            Kind::Rtu | Kind::Drep => 0,
            Kind::Dreq => 4,
            Kind::SidrReq => 8 + 2 + 2 + 16 + 16,
            Kind::SidrRep => 1 + 3 + 4 + 4,
        }
    }

    /// The most consumer private data the kind carries.
    pub fn max_private(self) -> usize {
        match self {
            Kind::Req => sizes::REQ - CMA_HDR_LEN,
            Kind::Mra => 0,
            Kind::Rej => sizes::REJ,
            Kind::Rep => sizes::REP,
            Kind::Rtu => sizes::RTU,
            Kind::Dreq => sizes::DREQ,
            Kind::Drep => sizes::DREP,
            Kind::SidrReq => sizes::SIDR_REQ - CMA_HDR_LEN,
            Kind::SidrRep => sizes::SIDR_REP,
        }
    }
}

/// The private data area the receiver of a `kind` reports (rdma_cm's
/// `private_data_len`): the whole area, less rdma_cm's header in a request.
pub fn private_data_size(kind: Kind) -> usize {
    kind.max_private()
}

/// A connection request (IBA 12.6.5), with what rdma_cm's header adds (the addresses).
/// The requester's GID and LID are its link's (the path's source is the device the link
/// proved).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Req {
    /// The service: rdma_cm's `(port space << 16) | port` for an IP port space.
    pub service_id: u64,
    /// The requesting QP.
    pub qpn: u32,
    /// Its transport (`ibv_qp_type`: 2 RC, 3 UC).
    pub qp_type: u8,
    /// The PSN the requester starts sending at.
    pub starting_psn: u32,
    /// READs and atomics the requester accepts from the peer.
    pub responder_resources: u8,
    /// READs and atomics the requester will have outstanding.
    pub initiator_depth: u8,
    /// End-to-end flow control.
    pub flow_control: u8,
    /// Transport retries.
    pub retry_count: u8,
    /// RNR retries.
    pub rnr_retry_count: u8,
    /// The requester uses an SRQ.
    pub srq: u8,
    /// The path MTU (`ibv_mtu`).
    pub path_mtu: u8,
    /// The requester's port (rdma_cm's header).
    pub src_port: u16,
    /// The requester's IP (IPv4-mapped for IPv4).
    pub src_ip: [u8; 16],
    /// The IP the requester addressed.
    pub dst_ip: [u8; 16],
    /// Consumer private data.
    pub private_data: Vec<u8>,
}

/// A reply to a request (IBA 12.6.8).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rep {
    /// The replying QP.
    pub qpn: u32,
    /// The PSN the replier starts sending at.
    pub starting_psn: u32,
    /// READs and atomics the replier accepts.
    pub responder_resources: u8,
    /// READs and atomics the replier will have outstanding.
    pub initiator_depth: u8,
    /// End-to-end flow control.
    pub flow_control: u8,
    /// RNR retries.
    pub rnr_retry_count: u8,
    /// The replier uses an SRQ.
    pub srq: u8,
    /// Consumer private data.
    pub private_data: Vec<u8>,
}

/// A service ID resolution request (IBA 12.11.1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SidrReq {
    /// The service, as in [`Req::service_id`].
    pub service_id: u64,
    /// The requester's port.
    pub src_port: u16,
    /// The requester's IP.
    pub src_ip: [u8; 16],
    /// The IP the requester addressed.
    pub dst_ip: [u8; 16],
    /// Consumer private data.
    pub private_data: Vec<u8>,
}

/// A service ID resolution reply (IBA 12.11.2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SidrRep {
    /// `IB_SIDR_SUCCESS` (0), `UNSUPPORTED` (1: no such service), `REJECT` (2), ...
    pub status: u8,
    /// The service's UD QP.
    pub qpn: u32,
    /// Its Q_Key.
    pub qkey: u32,
    /// Consumer private data.
    pub private_data: Vec<u8>,
}

/// What a message says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    /// [`Kind::Req`].
    Req(Req),
    /// [`Kind::Mra`]: the message of kind `of` (REQ or REP) waits for its consumer.
    Mra {
        /// The kind acknowledged.
        of: Kind,
    },
    /// [`Kind::Rej`].
    Rej {
        /// IBA's reject reason (`IB_CM_REJ_*`).
        reason: u16,
        /// The kind rejected (REQ or REP).
        of: Kind,
        /// Consumer private data.
        private_data: Vec<u8>,
    },
    /// [`Kind::Rep`].
    Rep(Rep),
    /// [`Kind::Rtu`].
    Rtu,
    /// [`Kind::Dreq`].
    Dreq {
        /// The QP the receiver's end of the connection is.
        remote_qpn: u32,
        /// Consumer private data.
        private_data: Vec<u8>,
    },
    /// [`Kind::Drep`].
    Drep,
    /// [`Kind::SidrReq`].
    SidrReq(SidrReq),
    /// [`Kind::SidrRep`].
    SidrRep(SidrRep),
}

/// One CM message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CmMsg {
    /// The sender's communication ID (a SIDR's request ID).
    pub local_comm_id: u32,
    /// The receiver's communication ID, 0 while the sender does not know it.
    pub remote_comm_id: u32,
    /// The message.
    pub body: Body,
}

/// Why bytes are not a CM message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CmMsgError {
    /// Fewer bytes than the message's fields, or more than its fields and private data.
    #[error("a CM message of {got} bytes where its kind takes {want}")]
    Length {
        /// Bytes given.
        got: usize,
        /// Bytes the kind and its private data length take.
        want: usize,
    },
    /// An unknown message kind.
    #[error("unknown CM message kind {0}")]
    Kind(u8),
    /// More private data than the kind carries.
    #[error("{len} bytes of private data in a {kind:?}, which carries at most {max}")]
    PrivateData {
        /// The kind.
        kind: Kind,
        /// The length given.
        len: usize,
        /// Its most.
        max: usize,
    },
    /// A field out of its range.
    #[error("CM message field {0} out of range")]
    Field(&'static str),
}

impl CmMsg {
    /// The message's kind.
    pub fn kind(&self) -> Kind {
        match &self.body {
            Body::Req(_) => Kind::Req,
            Body::Mra { .. } => Kind::Mra,
            Body::Rej { .. } => Kind::Rej,
            Body::Rep(_) => Kind::Rep,
            Body::Rtu => Kind::Rtu,
            Body::Dreq { .. } => Kind::Dreq,
            Body::Drep => Kind::Drep,
            Body::SidrReq(_) => Kind::SidrReq,
            Body::SidrRep(_) => Kind::SidrRep,
        }
    }

    fn private_data(&self) -> &[u8] {
        match &self.body {
            Body::Req(r) => &r.private_data,
            Body::Rej { private_data, .. } | Body::Dreq { private_data, .. } => private_data,
            Body::Rep(r) => &r.private_data,
            Body::SidrReq(r) => &r.private_data,
            Body::SidrRep(r) => &r.private_data,
            Body::Mra { .. } | Body::Rtu | Body::Drep => &[],
        }
    }

    /// Checks what the encoding cannot carry: private data beyond the kind's size, QPNs
    /// and PSNs wider than 24 bits.
    pub fn check(&self) -> Result<(), CmMsgError> {
        let kind = self.kind();
        let len = self.private_data().len();
        if len > kind.max_private() {
            return Err(CmMsgError::PrivateData {
                kind,
                len,
                max: kind.max_private(),
            });
        }
        let wide = |v: u32| v > 0xff_ffff;
        match &self.body {
            Body::Req(r) if wide(r.qpn) || wide(r.starting_psn) => Err(CmMsgError::Field("qpn/psn")),
            Body::Rep(r) if wide(r.qpn) || wide(r.starting_psn) => Err(CmMsgError::Field("qpn/psn")),
            Body::Dreq { remote_qpn, .. } if wide(*remote_qpn) => Err(CmMsgError::Field("remote_qpn")),
            Body::SidrRep(r) if wide(r.qpn) => Err(CmMsgError::Field("qpn")),
            Body::Mra { of } | Body::Rej { of, .. } if !matches!(of, Kind::Req | Kind::Rep) => {
                Err(CmMsgError::Field("of"))
            }
            _ => Ok(()),
        }
    }

    /// Appends the message's bytes to `out`. The message must pass [`CmMsg::check`]
    /// (the encoder truncates what does not fit; the sim builds only messages that do).
    pub fn encode(&self, out: &mut Vec<u8>) {
        let kind = self.kind();
        let private = &self.private_data()[..self.private_data().len().min(kind.max_private())];
        out.push(kind as u8);
        out.push(0);
        out.extend_from_slice(&(private.len() as u16).to_le_bytes());
        out.extend_from_slice(&self.local_comm_id.to_le_bytes());
        out.extend_from_slice(&self.remote_comm_id.to_le_bytes());
        let start = out.len();
        match &self.body {
            Body::Req(r) => {
                out.extend_from_slice(&r.service_id.to_le_bytes());
                out.extend_from_slice(&(r.qpn & 0xff_ffff).to_le_bytes());
                out.push(r.qp_type);
                out.extend_from_slice(&(r.starting_psn & 0xff_ffff).to_le_bytes());
                out.extend_from_slice(&[
                    r.responder_resources,
                    r.initiator_depth,
                    r.flow_control,
                    r.retry_count,
                    r.rnr_retry_count,
                    r.srq,
                    r.path_mtu,
                ]);
                out.extend_from_slice(&r.src_port.to_le_bytes());
                out.extend_from_slice(&r.src_ip);
                out.extend_from_slice(&r.dst_ip);
                out.extend_from_slice(&[0; 3]);
            }
            Body::Mra { of } => out.extend_from_slice(&[*of as u8, 0, 0, 0]),
            Body::Rej { reason, of, .. } => {
                out.extend_from_slice(&reason.to_le_bytes());
                out.extend_from_slice(&[*of as u8, 0]);
            }
            Body::Rep(r) => {
                out.extend_from_slice(&(r.qpn & 0xff_ffff).to_le_bytes());
                out.extend_from_slice(&(r.starting_psn & 0xff_ffff).to_le_bytes());
                out.extend_from_slice(&[
                    r.responder_resources,
                    r.initiator_depth,
                    r.flow_control,
                    r.rnr_retry_count,
                    r.srq,
                    0,
                    0,
                    0,
                ]);
            }
            Body::Rtu | Body::Drep => {}
            Body::Dreq { remote_qpn, .. } => out.extend_from_slice(&(remote_qpn & 0xff_ffff).to_le_bytes()),
            Body::SidrReq(r) => {
                out.extend_from_slice(&r.service_id.to_le_bytes());
                out.extend_from_slice(&r.src_port.to_le_bytes());
                out.extend_from_slice(&[0, 0]);
                out.extend_from_slice(&r.src_ip);
                out.extend_from_slice(&r.dst_ip);
            }
            Body::SidrRep(r) => {
                out.extend_from_slice(&[r.status, 0, 0, 0]);
                out.extend_from_slice(&(r.qpn & 0xff_ffff).to_le_bytes());
                out.extend_from_slice(&r.qkey.to_le_bytes());
            }
        }
        debug_assert_eq!(out.len() - start, kind.body_len());
        out.extend_from_slice(private);
    }

    /// The message `b` holds, exactly (no bytes before or after it).
    pub fn decode(b: &[u8]) -> Result<CmMsg, CmMsgError> {
        if b.len() < HDR_LEN {
            return Err(CmMsgError::Length {
                got: b.len(),
                want: HDR_LEN,
            });
        }
        let kind = Kind::from_u8(b[0]).ok_or(CmMsgError::Kind(b[0]))?;
        if b[1] != 0 {
            return Err(CmMsgError::Field("reserved"));
        }
        let plen = u16::from_le_bytes([b[2], b[3]]) as usize;
        if plen > kind.max_private() {
            return Err(CmMsgError::PrivateData {
                kind,
                len: plen,
                max: kind.max_private(),
            });
        }
        let want = HDR_LEN + kind.body_len() + plen;
        if b.len() != want {
            return Err(CmMsgError::Length { got: b.len(), want });
        }
        let mut r = Reader { b: &b[4..] };
        let local_comm_id = r.u32();
        let remote_comm_id = r.u32();
        let body = match kind {
            Kind::Req => {
                let service_id = r.u64();
                let qpn = r.u24("qpn")?;
                let qp_type = r.u8();
                let starting_psn = r.u24("starting_psn")?;
                let f = r.bytes::<7>();
                let src_port = r.u16();
                let src_ip = r.bytes::<16>();
                let dst_ip = r.bytes::<16>();
                r.zeros::<3>()?;
                Body::Req(Req {
                    service_id,
                    qpn,
                    qp_type,
                    starting_psn,
                    responder_resources: f[0],
                    initiator_depth: f[1],
                    flow_control: f[2],
                    retry_count: f[3],
                    rnr_retry_count: f[4],
                    srq: f[5],
                    path_mtu: f[6],
                    src_port,
                    src_ip,
                    dst_ip,
                    private_data: r.rest(),
                })
            }
            Kind::Mra => {
                let of = r.of()?;
                r.zeros::<3>()?;
                Body::Mra { of }
            }
            Kind::Rej => {
                let reason = r.u16();
                let of = r.of()?;
                r.zeros::<1>()?;
                Body::Rej {
                    reason,
                    of,
                    private_data: r.rest(),
                }
            }
            Kind::Rep => {
                let qpn = r.u24("qpn")?;
                let starting_psn = r.u24("starting_psn")?;
                let f = r.bytes::<5>();
                r.zeros::<3>()?;
                Body::Rep(Rep {
                    qpn,
                    starting_psn,
                    responder_resources: f[0],
                    initiator_depth: f[1],
                    flow_control: f[2],
                    rnr_retry_count: f[3],
                    srq: f[4],
                    private_data: r.rest(),
                })
            }
            Kind::Rtu => Body::Rtu,
            Kind::Drep => Body::Drep,
            Kind::Dreq => Body::Dreq {
                remote_qpn: r.u24("remote_qpn")?,
                private_data: r.rest(),
            },
            Kind::SidrReq => {
                let service_id = r.u64();
                let src_port = r.u16();
                r.zeros::<2>()?;
                Body::SidrReq(SidrReq {
                    service_id,
                    src_port,
                    src_ip: r.bytes::<16>(),
                    dst_ip: r.bytes::<16>(),
                    private_data: r.rest(),
                })
            }
            Kind::SidrRep => {
                let status = r.u8();
                r.zeros::<3>()?;
                Body::SidrRep(SidrRep {
                    status,
                    qpn: r.u24("qpn")?,
                    qkey: r.u32(),
                    private_data: r.rest(),
                })
            }
        };
        let msg = CmMsg {
            local_comm_id,
            remote_comm_id,
            body,
        };
        // Private data the kind carries, and fields in range: whatever decodes encodes.
        msg.check()?;
        Ok(msg)
    }
}

impl fmt::Display for CmMsg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} (comm ids {:#x} -> {:#x})",
            self.kind(),
            self.local_comm_id,
            self.remote_comm_id
        )
    }
}

/// Reads fields in order; the caller checked the length first, so no read runs past the
/// end.
struct Reader<'a> {
    b: &'a [u8],
}

impl Reader<'_> {
    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let n = N.min(self.b.len());
        out[..n].copy_from_slice(&self.b[..n]);
        self.b = &self.b[n..];
        out
    }

    fn u8(&mut self) -> u8 {
        self.bytes::<1>()[0]
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.bytes())
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes())
    }

    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.bytes())
    }

    fn u24(&mut self, name: &'static str) -> Result<u32, CmMsgError> {
        let v = self.u32();
        if v > 0xff_ffff {
            return Err(CmMsgError::Field(name));
        }
        Ok(v)
    }

    fn zeros<const N: usize>(&mut self) -> Result<(), CmMsgError> {
        if self.bytes::<N>().iter().any(|&b| b != 0) {
            return Err(CmMsgError::Field("reserved"));
        }
        Ok(())
    }

    fn of(&mut self) -> Result<Kind, CmMsgError> {
        match Kind::from_u8(self.u8()) {
            Some(k @ (Kind::Req | Kind::Rep)) => Ok(k),
            _ => Err(CmMsgError::Field("of")),
        }
    }

    fn rest(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.b).to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ip() -> impl Strategy<Value = [u8; 16]> {
        any::<[u8; 16]>()
    }

    fn private(max: usize) -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(any::<u8>(), 0..=max)
    }

    fn msg() -> impl Strategy<Value = CmMsg> {
        let u24 = 0u32..=0xff_ffff;
        let body = prop_oneof![
            (
                any::<u64>(),
                u24.clone(),
                any::<u8>(),
                u24.clone(),
                any::<[u8; 7]>(),
                any::<u16>(),
                ip(),
                ip(),
                private(Kind::Req.max_private())
            )
                .prop_map(
                    |(service_id, qpn, qp_type, starting_psn, f, src_port, src_ip, dst_ip, p)| {
                        Body::Req(Req {
                            service_id,
                            qpn,
                            qp_type,
                            starting_psn,
                            responder_resources: f[0],
                            initiator_depth: f[1],
                            flow_control: f[2],
                            retry_count: f[3],
                            rnr_retry_count: f[4],
                            srq: f[5],
                            path_mtu: f[6],
                            src_port,
                            src_ip,
                            dst_ip,
                            private_data: p,
                        })
                    }
                ),
            prop_oneof![Just(Kind::Req), Just(Kind::Rep)].prop_map(|of| Body::Mra { of }),
            (
                any::<u16>(),
                prop_oneof![Just(Kind::Req), Just(Kind::Rep)],
                private(sizes::REJ)
            )
                .prop_map(|(reason, of, private_data)| Body::Rej {
                    reason,
                    of,
                    private_data
                }),
            (u24.clone(), u24.clone(), any::<[u8; 5]>(), private(sizes::REP)).prop_map(|(qpn, psn, f, p)| {
                Body::Rep(Rep {
                    qpn,
                    starting_psn: psn,
                    responder_resources: f[0],
                    initiator_depth: f[1],
                    flow_control: f[2],
                    rnr_retry_count: f[3],
                    srq: f[4],
                    private_data: p,
                })
            }),
            Just(Body::Rtu),
            Just(Body::Drep),
            (u24.clone(), private(sizes::DREQ)).prop_map(|(remote_qpn, private_data)| Body::Dreq {
                remote_qpn,
                private_data
            }),
            (
                any::<u64>(),
                any::<u16>(),
                ip(),
                ip(),
                private(Kind::SidrReq.max_private())
            )
                .prop_map(
                    |(service_id, src_port, src_ip, dst_ip, private_data)| Body::SidrReq(SidrReq {
                        service_id,
                        src_port,
                        src_ip,
                        dst_ip,
                        private_data
                    })
                ),
            (any::<u8>(), u24, any::<u32>(), private(sizes::SIDR_REP)).prop_map(|(status, qpn, qkey, p)| {
                Body::SidrRep(SidrRep {
                    status,
                    qpn,
                    qkey,
                    private_data: p,
                })
            }),
        ];
        (any::<u32>(), any::<u32>(), body).prop_map(|(local_comm_id, remote_comm_id, body)| CmMsg {
            local_comm_id,
            remote_comm_id,
            body,
        })
    }

    proptest! {
        #[test]
        fn every_message_round_trips(m in msg()) {
            prop_assert!(m.check().is_ok());
            let mut b = Vec::new();
            m.encode(&mut b);
            prop_assert_eq!(CmMsg::decode(&b), Ok(m));
        }

        #[test]
        fn any_bytes_decode_or_fail_without_panic_and_decoded_bytes_reencode(b in proptest::collection::vec(any::<u8>(), 0..400)) {
            if let Ok(m) = CmMsg::decode(&b) {
                let mut again = Vec::new();
                m.encode(&mut again);
                prop_assert_eq!(again, b);
            }
        }

        #[test]
        fn a_truncated_or_extended_message_is_refused(m in msg(), cut in 1usize..20) {
            let mut b = Vec::new();
            m.encode(&mut b);
            let short = &b[..b.len().saturating_sub(cut)];
            prop_assert!(CmMsg::decode(short).is_err());
            let mut long = b.clone();
            long.push(0);
            prop_assert!(CmMsg::decode(&long).is_err());
        }
    }

    #[test]
    fn too_much_private_data_is_refused_before_anything_else() {
        let m = CmMsg {
            local_comm_id: 1,
            remote_comm_id: 0,
            body: Body::Rej {
                reason: 28,
                of: Kind::Req,
                private_data: vec![0; sizes::REJ + 1],
            },
        };
        assert!(matches!(m.check(), Err(CmMsgError::PrivateData { max: 148, .. })));
        let mut b = vec![Kind::Rej as u8, 0];
        b.extend_from_slice(&(sizes::REJ as u16 + 1).to_le_bytes());
        b.extend_from_slice(&[0; 8]);
        assert!(matches!(CmMsg::decode(&b), Err(CmMsgError::PrivateData { .. })));
        assert_eq!(CmMsg::decode(&[0xee; 12]), Err(CmMsgError::Kind(0xee)));
    }

    #[test]
    fn the_private_data_rdma_cm_reports() {
        assert_eq!(private_data_size(Kind::Req), 56);
        assert_eq!(private_data_size(Kind::Rep), 196);
        assert_eq!(private_data_size(Kind::Rej), 148);
        assert_eq!(private_data_size(Kind::SidrReq), 180);
        assert_eq!(private_data_size(Kind::SidrRep), 136);
    }
}
