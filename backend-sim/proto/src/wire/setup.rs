//! Connection and link setup frames (docs/wire.md "Connection setup", "Links"): the
//! hello of a QP pair's connection and its check with the claimed device, a link's hello
//! and its check, the CM rendezvous, their answers; the protocol version they carry, and
//! how setup reads exactly one of their headers.

use verbs_api::QpType;

use super::frame::{Frame, WireError};
use super::header::{u16_at, u32_at, Base, BASE_LEN};
use super::opcode::{header_len, op};

/// Magic of the hello frame ("RSIM").
pub const HELLO_MAGIC: u32 = 0x4d49_5352;
/// Protocol version in the hello frame (11: a same-host connection's setup message also
/// passes the one-sided fast path's tables and use counts, and a WRITE the requester
/// placed itself travels as [`Frame::WritePlaced`], without its payload; 10: on a same-host (unix socket) connection of a
/// QP pair, the connector follows the hello's answer with one message that passes the
/// shared-memory rings its frames then take, or says they stay on the socket; 9: a
/// message's packets may travel apart, and a requester resends from a PSN inside a
/// message ([`Frame::Part`]); 8: the connection manager: a rendezvous at an
/// rdma_cm port ([`Frame::CmLookup`], [`Frame::CmAddress`]) and CM messages as datagrams
/// to QP 1 ([`crate::cm_msg`]); 7: SEND_WITH_INV ([`F_INV`](super::F_INV)), and NAK
/// reasons for memory windows; 6: a datagram's GRH says whether its source is the
/// sender's default GID ([`Grh::src_default`](super::Grh::src_default)), and READs and
/// atomics carry the requester's count of them outstanding ([`Frame::Read`]'s
/// `inflight`); 5: links between devices carry UD datagrams ([`Frame::LinkHello`],
/// [`Frame::LinkVerify`], [`Frame::Datagram`]); 4: hellos name the QP type, RC or UC, and
/// a UC connection's responder acknowledges every message it took in; 3: hellos carry a
/// token that the passive side checks with the claimed peer device ([`Frame::Verify`]),
/// and a NAK may carry a [`NakReason`](super::NakReason); 2: SEND and WRITE may carry
/// [`F_ACK_REQ`](super::F_ACK_REQ)). A device refuses a hello of another version
/// ([`HelloReject::Version`]): both ends of a connection must run builds that speak the
/// same frames.
pub const VERSION: u16 = 11;
/// Bytes of the token a hello carries.
pub const TOKEN_LEN: usize = 16;

/// Why a connection setup (or a [`Frame::Verify`]) was refused.
///
/// A device tells a stranger nothing about its QPs: whether the QP does not exist, is
/// not ready, expects another peer or the claim failed its check, the refusal is the same
/// bytes ([`HelloReject::Refused`]); the device logs the real reason at debug level. Only
/// a protocol version mismatch, which says nothing about QPs, is told apart, so that the
/// other build can report it instead of retrying.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum HelloReject {
    /// Refused (no such QP, not ready, another peer, or the claim was not confirmed).
    Refused = 1,
    /// Protocol version mismatch.
    Version = 4,
}

impl HelloReject {
    pub(super) fn from_raw(v: u16) -> Result<Self, WireError> {
        Ok(match v {
            1 => HelloReject::Refused,
            4 => HelloReject::Version,
            _ => return Err(WireError::BadField("hello reject reason")),
        })
    }
}

/// The header length of a connection-setup frame (hello, link hello, their checks and
/// their answers)
/// from its base header alone, so that setup reads exactly one header and never a data
/// frame's: any other opcode is an error, and so is a hello or check of another protocol
/// version, before its extension (whose length may differ between versions) is read.
pub fn setup_header_len(base: &[u8; BASE_LEN]) -> Result<usize, WireError> {
    let opcode = base[0];
    match opcode {
        op::HELLO | op::VERIFY | op::LINK_HELLO | op::LINK_VERIFY | op::CM_LOOKUP | op::CM_ADDRESS
            if u16_at(base, 2) != VERSION =>
        {
            Err(WireError::Version(u16_at(base, 2)))
        }
        op::HELLO
        | op::HELLO_ACK
        | op::HELLO_NAK
        | op::VERIFY
        | op::LINK_HELLO
        | op::LINK_VERIFY
        | op::CM_LOOKUP
        | op::CM_ADDRESS => Ok(header_len(opcode).expect("setup opcodes are known")),
        _ => Err(WireError::UnknownOpcode(opcode)),
    }
}

impl Frame {
    /// Writes the extension of a setup frame (the others have none here).
    pub(super) fn encode_setup_ext(&self, e: &mut [u8]) {
        match *self {
            Frame::Hello {
                src_gid,
                src_lid,
                qp_type,
                src_qpn,
                dst_qpn,
                token,
            } => {
                e[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
                e[4..6].copy_from_slice(&src_lid.to_le_bytes());
                e[6..8].copy_from_slice(&(qp_type as u16).to_le_bytes());
                e[8..12].copy_from_slice(&src_qpn.to_le_bytes());
                e[12..16].copy_from_slice(&dst_qpn.to_le_bytes());
                e[16..32].copy_from_slice(&src_gid);
                e[32..48].copy_from_slice(&token);
            }
            Frame::Verify {
                src_qpn,
                dst_qpn,
                token,
            } => {
                e[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
                e[4..8].copy_from_slice(&src_qpn.to_le_bytes());
                e[8..12].copy_from_slice(&dst_qpn.to_le_bytes());
                e[12..16].copy_from_slice(&0u32.to_le_bytes());
                e[16..32].copy_from_slice(&token);
            }
            Frame::LinkHello {
                src_gid,
                src_lid,
                token,
            } => {
                e[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
                e[4..6].copy_from_slice(&src_lid.to_le_bytes());
                e[6..8].copy_from_slice(&0u16.to_le_bytes());
                e[8..24].copy_from_slice(&src_gid);
                e[24..40].copy_from_slice(&token);
            }
            Frame::LinkVerify {
                at_ip,
                at_port,
                token,
            } => {
                e[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
                e[4..6].copy_from_slice(&at_port.to_le_bytes());
                e[6..8].copy_from_slice(&0u16.to_le_bytes());
                e[8..24].copy_from_slice(&at_ip);
                e[24..40].copy_from_slice(&token);
            }
            Frame::CmLookup { port_space, port } => {
                e[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
                e[4..6].copy_from_slice(&port_space.to_le_bytes());
                e[6..8].copy_from_slice(&port.to_le_bytes());
            }
            Frame::CmAddress { gid, lid } => {
                e[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
                e[4..6].copy_from_slice(&lid.to_le_bytes());
                e[6..8].copy_from_slice(&0u16.to_le_bytes());
                e[8..24].copy_from_slice(&gid);
            }
            _ => {}
        }
    }

    /// Reads a setup frame (hello, its check, link hello, its check, CM rendezvous, and
    /// their answers) from its base header and extension.
    pub(super) fn decode_setup(b: &Base, e: &[u8]) -> Result<Frame, WireError> {
        let (opcode, aux) = (b.opcode, b.aux);
        Ok(match opcode {
            op::HELLO => {
                if u32_at(e, 0) != HELLO_MAGIC {
                    return Err(WireError::BadField("hello magic"));
                }
                if aux != VERSION {
                    return Err(WireError::Version(aux));
                }
                let src_qpn = u32_at(e, 8);
                let dst_qpn = u32_at(e, 12);
                if src_qpn > 0xff_ffff || dst_qpn > 0xff_ffff {
                    return Err(WireError::BadField("QPN"));
                }
                let mut src_gid = [0u8; 16];
                src_gid.copy_from_slice(&e[16..32]);
                let mut token = [0u8; TOKEN_LEN];
                token.copy_from_slice(&e[32..48]);
                let qp_type = match u16_at(e, 6) {
                    2 => QpType::Rc,
                    3 => QpType::Uc,
                    _ => return Err(WireError::BadField("QP type")),
                };
                Frame::Hello {
                    src_gid,
                    src_lid: u16_at(e, 4),
                    qp_type,
                    src_qpn,
                    dst_qpn,
                    token,
                }
            }
            op::VERIFY => {
                if u32_at(e, 0) != HELLO_MAGIC {
                    return Err(WireError::BadField("verify magic"));
                }
                if aux != VERSION {
                    return Err(WireError::Version(aux));
                }
                let src_qpn = u32_at(e, 4);
                let dst_qpn = u32_at(e, 8);
                if src_qpn > 0xff_ffff || dst_qpn > 0xff_ffff {
                    return Err(WireError::BadField("QPN"));
                }
                if u32_at(e, 12) != 0 {
                    return Err(WireError::BadField("reserved field"));
                }
                let mut token = [0u8; TOKEN_LEN];
                token.copy_from_slice(&e[16..32]);
                Frame::Verify {
                    src_qpn,
                    dst_qpn,
                    token,
                }
            }
            op::LINK_HELLO | op::LINK_VERIFY => {
                if u32_at(e, 0) != HELLO_MAGIC {
                    return Err(WireError::BadField("link magic"));
                }
                if aux != VERSION {
                    return Err(WireError::Version(aux));
                }
                if u16_at(e, 6) != 0 {
                    return Err(WireError::BadField("reserved field"));
                }
                let mut addr = [0u8; 16];
                addr.copy_from_slice(&e[8..24]);
                let mut token = [0u8; TOKEN_LEN];
                token.copy_from_slice(&e[24..40]);
                if opcode == op::LINK_HELLO {
                    Frame::LinkHello {
                        src_gid: addr,
                        src_lid: u16_at(e, 4),
                        token,
                    }
                } else {
                    Frame::LinkVerify {
                        at_ip: addr,
                        at_port: u16_at(e, 4),
                        token,
                    }
                }
            }
            op::CM_LOOKUP | op::CM_ADDRESS => {
                if u32_at(e, 0) != HELLO_MAGIC {
                    return Err(WireError::BadField("CM rendezvous magic"));
                }
                if aux != VERSION {
                    return Err(WireError::Version(aux));
                }
                if opcode == op::CM_LOOKUP {
                    Frame::CmLookup {
                        port_space: u16_at(e, 4),
                        port: u16_at(e, 6),
                    }
                } else {
                    if u16_at(e, 6) != 0 {
                        return Err(WireError::BadField("reserved field"));
                    }
                    let mut gid = [0u8; 16];
                    gid.copy_from_slice(&e[8..24]);
                    Frame::CmAddress {
                        gid,
                        lid: u16_at(e, 4),
                    }
                }
            }
            op::HELLO_ACK => Frame::HelloAck,
            op::HELLO_NAK => Frame::HelloNak {
                reason: HelloReject::from_raw(aux)?,
            },
            other => return Err(WireError::UnknownOpcode(other)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::MAX_HDR_LEN;

    #[test]
    fn only_setup_frames_of_this_version_are_read_during_setup() {
        let base = |opcode: u8, version: u16| {
            let mut b = [0u8; BASE_LEN];
            b[0] = opcode;
            b[2..4].copy_from_slice(&version.to_le_bytes());
            b
        };
        for op in [
            op::HELLO,
            op::VERIFY,
            op::LINK_HELLO,
            op::LINK_VERIFY,
            op::CM_LOOKUP,
            op::CM_ADDRESS,
        ] {
            assert_eq!(setup_header_len(&base(op, VERSION)).ok(), header_len(op));
            assert_eq!(
                setup_header_len(&base(op, VERSION - 1)),
                Err(WireError::Version(VERSION - 1))
            );
        }
        for op in [op::HELLO_ACK, op::HELLO_NAK] {
            assert_eq!(setup_header_len(&base(op, 0)).ok(), header_len(op));
        }
        for op in [
            op::SEND,
            op::WRITE,
            op::READ,
            op::ACK,
            op::NAK,
            op::DATAGRAM,
            0x99,
        ] {
            assert_eq!(setup_header_len(&base(op, 0)), Err(WireError::UnknownOpcode(op)));
        }
    }

    /// A hello names RC (2) or UC (3), `ibv_qp_type`'s numbers; anything else is refused.
    #[test]
    fn a_hello_names_rc_or_uc() {
        let mut b = [0u8; MAX_HDR_LEN];
        let hello = Frame::Hello {
            src_gid: [1; 16],
            src_lid: 7,
            qp_type: QpType::Uc,
            src_qpn: 2,
            dst_qpn: 3,
            token: [9; TOKEN_LEN],
        };
        let n = hello.encode(&mut b);
        assert_eq!(u16_at(&b, BASE_LEN + 6), 3);
        assert_eq!(Frame::decode(&b[..n]), Ok(Some((hello, n))));
        for bad in [0u16, 1, 4, 0xffff] {
            b[BASE_LEN + 6..BASE_LEN + 8].copy_from_slice(&bad.to_le_bytes());
            assert_eq!(
                Frame::decode(&b[..n]),
                Err(WireError::BadField("QP type")),
                "{bad}"
            );
        }
    }
}
