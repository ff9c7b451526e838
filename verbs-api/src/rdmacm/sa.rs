//! A path record in the subnet administrator's wire layout (IBA 15.2.5.16, big-endian,
//! 64 bytes): what `rdma_set_option(RDMA_OPTION_IB_PATH)` takes in each `struct
//! ibv_path_data` and the route query answers in each `struct ib_path_rec_data` (the
//! kernel's `ib_sa_pack_path`, librdmacm's `ucma_convert_path`), so that the backends
//! and the sim's C ABI read and write it one way.

use super::types::PathRecord;
use crate::device::{Gid, Mtu};

/// The size of a packed path record.
pub const PATH_RECORD_LEN: usize = 64;

/// The selector "exactly" (2) in the top two bits of the MTU, rate and lifetime bytes.
const EXACTLY: u8 = 2 << 6;

/// `IBV_PATH_FLAG_GMP | IBV_PATH_FLAG_PRIMARY | IBV_PATH_FLAG_BIDIRECTIONAL`: the flags
/// of the path the kernel's `RDMA_OPTION_IB_PATH` takes (it skips the others) and of the
/// route's one path its query answers.
pub const PATH_FLAGS_PRIMARY: u32 = 1 | 2 | (8 | 32);

impl PathRecord {
    /// The record in the SA's layout, for service `service_id`.
    pub fn to_sa(&self, service_id: u64) -> [u8; PATH_RECORD_LEN] {
        let mut b = [0u8; PATH_RECORD_LEN];
        b[0..8].copy_from_slice(&service_id.to_be_bytes());
        b[8..24].copy_from_slice(&self.dgid.0);
        b[24..40].copy_from_slice(&self.sgid.0);
        b[40..42].copy_from_slice(&self.dlid.to_be_bytes());
        b[42..44].copy_from_slice(&self.slid.to_be_bytes());
        let fl_hop = ((self.flow_label & 0xf_ffff) << 8) | u32::from(self.hop_limit);
        b[44..48].copy_from_slice(&fl_hop.to_be_bytes());
        b[48] = self.traffic_class;
        b[49] = (u8::from(self.reversible) << 7) | 1;
        b[50..52].copy_from_slice(&self.pkey.to_be_bytes());
        b[52..54].copy_from_slice(&u16::from(self.sl & 0xf).to_be_bytes());
        b[54] = EXACTLY | (self.mtu as u8 & 0x3f);
        b[55] = EXACTLY | (self.rate & 0x3f);
        b[56] = EXACTLY | (self.packet_life_time & 0x3f);
        b[57] = self.preference;
        b
    }

    /// A record in the SA's layout (its service ID aside).
    pub fn from_sa(b: &[u8; PATH_RECORD_LEN]) -> PathRecord {
        let mut dgid = [0u8; 16];
        dgid.copy_from_slice(&b[8..24]);
        let mut sgid = [0u8; 16];
        sgid.copy_from_slice(&b[24..40]);
        let fl_hop = u32::from_be_bytes([b[44], b[45], b[46], b[47]]);
        PathRecord {
            dgid: Gid(dgid),
            sgid: Gid(sgid),
            dlid: u16::from_be_bytes([b[40], b[41]]),
            slid: u16::from_be_bytes([b[42], b[43]]),
            flow_label: (fl_hop >> 8) & 0xf_ffff,
            hop_limit: fl_hop as u8,
            traffic_class: b[48],
            reversible: b[49] & 0x80 != 0,
            pkey: u16::from_be_bytes([b[50], b[51]]),
            sl: (u16::from_be_bytes([b[52], b[53]]) & 0xf) as u8,
            mtu: Mtu::from_raw(u32::from(b[54] & 0x3f)).unwrap_or_default(),
            rate: b[55] & 0x3f,
            packet_life_time: b[56] & 0x3f,
            preference: b[57],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packed_path_unpacks_to_itself() {
        let p = PathRecord {
            dgid: Gid([1; 16]),
            sgid: Gid([2; 16]),
            dlid: 0x1234,
            slid: 0x4321,
            flow_label: 0xabcde,
            hop_limit: 64,
            traffic_class: 7,
            reversible: true,
            pkey: 0xffff,
            sl: 3,
            mtu: Mtu::Mtu1024,
            rate: 3,
            packet_life_time: 16,
            preference: 0,
        };
        let b = p.to_sa(0x0106_1d00);
        assert_eq!(&b[..8], &0x0106_1d00u64.to_be_bytes());
        assert_eq!(PathRecord::from_sa(&b), p);
    }
}
