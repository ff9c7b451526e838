//! What two sides exchange out of band before they can talk: the QP [`Endpoint`]
//! (GID, LID, QP number, starting PSN, as `ibv_rc_pingpong` and perftest send over their
//! TCP side channel) and [`RemoteMr`] descriptors (address, rkey, length) for one-sided
//! access. Both have a fixed big-endian byte encoding, so programs in any language can
//! read them.

use crate::device::Gid;
use crate::error::{Error, Result};
use crate::sge::RemoteAddr;

/// The address of one end of an RC connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// GID of the port (from `ibv_query_gid` at the chosen GID index).
    pub gid: Gid,
    /// LID of the port (0 on RoCE).
    pub lid: u16,
    /// QP number.
    pub qpn: u32,
    /// First PSN this side will send (the peer's `rq_psn`).
    pub psn: u32,
}

impl Endpoint {
    /// Bytes of [`Endpoint::to_bytes`].
    pub const WIRE_LEN: usize = 26;

    /// Fixed encoding: gid (16) | lid (2) | qpn (4) | psn (4), big-endian.
    pub fn to_bytes(&self) -> [u8; Self::WIRE_LEN] {
        let mut b = [0u8; Self::WIRE_LEN];
        b[..16].copy_from_slice(&self.gid.0);
        b[16..18].copy_from_slice(&self.lid.to_be_bytes());
        b[18..22].copy_from_slice(&self.qpn.to_be_bytes());
        b[22..26].copy_from_slice(&self.psn.to_be_bytes());
        b
    }

    /// Decodes [`Endpoint::to_bytes`]; QPN and PSN must fit in 24 bits.
    pub fn from_bytes(b: &[u8]) -> Result<Self> {
        if b.len() != Self::WIRE_LEN {
            return Err(Error::invalid(
                "Endpoint::from_bytes",
                format!("{} bytes, expected {}", b.len(), Self::WIRE_LEN),
            ));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[..16]);
        let lid = u16::from_be_bytes([b[16], b[17]]);
        let qpn = u32::from_be_bytes([b[18], b[19], b[20], b[21]]);
        let psn = u32::from_be_bytes([b[22], b[23], b[24], b[25]]);
        if qpn > 0xff_ffff || psn > 0xff_ffff {
            return Err(Error::invalid(
                "Endpoint::from_bytes",
                format!("qpn {qpn:#x} or psn {psn:#x} exceeds 24 bits"),
            ));
        }
        Ok(Endpoint {
            gid: Gid(gid),
            lid,
            qpn,
            psn,
        })
    }
}

/// A remote memory descriptor: what a peer needs to RDMA READ/WRITE or run atomics on a
/// region (`addr`, `rkey`) and how far it may go (`len`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RemoteMr {
    /// Start address in the owner's address space.
    pub addr: u64,
    /// Remote key.
    pub rkey: u32,
    /// Length in bytes.
    pub len: u64,
}

impl RemoteMr {
    /// Bytes of [`RemoteMr::to_bytes`].
    pub const WIRE_LEN: usize = 20;

    /// The remote address `offset` bytes into the region (not bounds-checked: the
    /// responder checks, and a bad offset must be testable).
    pub fn at(&self, offset: u64) -> RemoteAddr {
        RemoteAddr {
            addr: self.addr.wrapping_add(offset),
            rkey: self.rkey,
        }
    }

    /// A sub-range of the region, checked against its length.
    pub fn slice(&self, offset: u64, len: u64) -> Result<RemoteMr> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(RemoteMr {
                addr: self.addr + offset,
                rkey: self.rkey,
                len,
            }),
            _ => Err(Error::OutOfBounds {
                offset: offset as usize,
                end: offset.saturating_add(len) as usize,
                len: self.len as usize,
            }),
        }
    }

    /// Fixed encoding: addr (8) | rkey (4) | len (8), big-endian.
    pub fn to_bytes(&self) -> [u8; Self::WIRE_LEN] {
        let mut b = [0u8; Self::WIRE_LEN];
        b[..8].copy_from_slice(&self.addr.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..20].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    /// Decodes [`RemoteMr::to_bytes`].
    pub fn from_bytes(b: &[u8]) -> Result<Self> {
        if b.len() != Self::WIRE_LEN {
            return Err(Error::invalid(
                "RemoteMr::from_bytes",
                format!("{} bytes, expected {}", b.len(), Self::WIRE_LEN),
            ));
        }
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[..8]);
        let mut r = [0u8; 4];
        r.copy_from_slice(&b[8..12]);
        let mut l = [0u8; 8];
        l.copy_from_slice(&b[12..20]);
        Ok(RemoteMr {
            addr: u64::from_be_bytes(a),
            rkey: u32::from_be_bytes(r),
            len: u64::from_be_bytes(l),
        })
    }
}

impl From<RemoteMr> for RemoteAddr {
    fn from(r: RemoteMr) -> Self {
        RemoteAddr {
            addr: r.addr,
            rkey: r.rkey,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn endpoint_roundtrip(gid in any::<[u8; 16]>(), lid in any::<u16>(), qpn in 0u32..1 << 24, psn in 0u32..1 << 24) {
            let e = Endpoint { gid: Gid(gid), lid, qpn, psn };
            prop_assert_eq!(Endpoint::from_bytes(&e.to_bytes()).unwrap(), e);
        }

        #[test]
        fn remote_mr_roundtrip(addr in any::<u64>(), rkey in any::<u32>(), len in any::<u64>()) {
            let r = RemoteMr { addr, rkey, len };
            prop_assert_eq!(RemoteMr::from_bytes(&r.to_bytes()).unwrap(), r);
        }

        #[test]
        fn endpoint_decoder_never_panics(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Endpoint::from_bytes(&b);
            let _ = RemoteMr::from_bytes(&b);
        }
    }

    #[test]
    fn slice_checks_bounds() {
        let r = RemoteMr {
            addr: 0x1000,
            rkey: 7,
            len: 64,
        };
        assert_eq!(r.slice(8, 8).unwrap().addr, 0x1008);
        assert!(r.slice(60, 8).is_err());
        assert!(r.slice(u64::MAX, 2).is_err());
    }
}
