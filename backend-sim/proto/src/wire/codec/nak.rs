//! A NAK's header: the syndrome in `aux`, the reason in the immediate field, each
//! written and read, and checked against the other.

use crate::wire::frame::{Frame, WireError};
use crate::wire::header::Base;
use crate::wire::nak::{NakCode, NakReason};

impl NakCode {
    /// The syndrome as a NAK's `aux` holds it.
    pub(super) fn to_raw(self) -> u16 {
        match self {
            NakCode::Rnr { timer } => 0x100 | (timer as u16 & 31),
            NakCode::PsnSeq => 0x200,
            NakCode::InvalidRequest => 0x201,
            NakCode::RemoteAccess => 0x202,
            NakCode::RemoteOperational => 0x203,
        }
    }

    /// The syndrome `aux` holds, or why it is none.
    fn from_raw(v: u16) -> Result<Self, WireError> {
        Ok(match v {
            0x100..=0x11f => NakCode::Rnr {
                timer: (v & 31) as u8,
            },
            0x200 => NakCode::PsnSeq,
            0x201 => NakCode::InvalidRequest,
            0x202 => NakCode::RemoteAccess,
            0x203 => NakCode::RemoteOperational,
            _ => return Err(WireError::BadField("NAK syndrome")),
        })
    }
}

impl Frame {
    /// Reads a NAK from its base header: the syndrome in `aux`, the reason (0: none) in
    /// the immediate field, which must be of the syndrome's kind.
    pub(super) fn decode_nak(b: &Base) -> Result<Frame, WireError> {
        let (psn, aux, imm_raw) = (b.psn, b.aux, b.imm_raw);
        let code = NakCode::from_raw(aux)?;
        let reason = match imm_raw {
            0 => None,
            v => match NakReason::from_vendor_err(v) {
                Some(r) if r.may_carry(code) => Some(r),
                _ => return Err(WireError::BadField("NAK reason")),
            },
        };
        Ok(Frame::Nak { psn, code, reason })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::header::u32_at;
    use crate::wire::MAX_HDR_LEN;

    /// A NAK's reason travels in the immediate field: a code of the table, of the NAK's
    /// kind, or 0 (none). Anything else is malformed, and a reason on a NAK of another
    /// kind too (so each NAK has one encoding).
    #[test]
    fn nak_reasons_are_checked() {
        let mut b = [0u8; MAX_HDR_LEN];
        for r in NakReason::ALL {
            assert_eq!(NakReason::from_vendor_err(r.vendor_err()), Some(r));
            let f = Frame::Nak {
                psn: 9,
                code: r.code(),
                reason: Some(r),
            };
            let n = f.encode(&mut b);
            assert_eq!(u32_at(&b, 12), r.vendor_err());
            assert_eq!(Frame::decode(&b[..n]), Ok(Some((f, n))));
        }
        let n = Frame::Nak {
            psn: 9,
            code: NakCode::RemoteAccess,
            reason: None,
        }
        .encode(&mut b);
        for bad in [
            1,
            0x100,
            0x10c,
            NakReason::MisalignedAtomic.vendor_err(),
            u32::MAX,
        ] {
            b[12..16].copy_from_slice(&bad.to_le_bytes());
            assert_eq!(
                Frame::decode(&b[..n]),
                Err(WireError::BadField("NAK reason")),
                "{bad:#x}"
            );
        }
        let n = Frame::Nak {
            psn: 9,
            code: NakCode::PsnSeq,
            reason: None,
        }
        .encode(&mut b);
        b[12..16].copy_from_slice(&NakReason::OutOfBounds.vendor_err().to_le_bytes());
        assert_eq!(Frame::decode(&b[..n]), Err(WireError::BadField("NAK reason")));
        assert_eq!(NakReason::from_vendor_err(0), None);
        // The errno values that IBV_WC_RETRY_EXC_ERR carries are no reasons.
        for errno in [libc::ECONNREFUSED, libc::EMFILE, libc::ETIMEDOUT, libc::ENOTCONN] {
            assert_eq!(NakReason::from_vendor_err(errno as u32), None);
        }
    }
}
