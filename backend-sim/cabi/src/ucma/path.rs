//! A path record in the two layouts rdma_cm's answers use: the SA's wire format of
//! `struct ib_path_rec_data` (IBA 15.2.5.16, big-endian, what the kernel's
//! `ib_sa_pack_path` writes and librdmacm's `ucma_convert_path` reads), and
//! `struct ib_user_path_rec` (the older route query's).

use verbs_api::rdmacm::PathRecord;
use verbs_api::{Gid, Mtu};

use crate::abi::ib_user_path_rec;

/// The selector "exactly" (2) in the top two bits of the MTU, rate and lifetime bytes.
const EXACTLY: u8 = 2 << 6;

/// `p` in the SA's 64-byte layout, for service `service_id`.
pub fn pack(p: &PathRecord, service_id: u64) -> [u8; 64] {
    let mut b = [0u8; 64];
    b[0..8].copy_from_slice(&service_id.to_be_bytes());
    b[8..24].copy_from_slice(&p.dgid.0);
    b[24..40].copy_from_slice(&p.sgid.0);
    b[40..42].copy_from_slice(&p.dlid.to_be_bytes());
    b[42..44].copy_from_slice(&p.slid.to_be_bytes());
    let fl_hop = ((p.flow_label & 0xf_ffff) << 8) | u32::from(p.hop_limit);
    b[44..48].copy_from_slice(&fl_hop.to_be_bytes());
    b[48] = p.traffic_class;
    b[49] = (u8::from(p.reversible) << 7) | 1;
    b[50..52].copy_from_slice(&p.pkey.to_be_bytes());
    b[52..54].copy_from_slice(&u16::from(p.sl & 0xf).to_be_bytes());
    b[54] = EXACTLY | (p.mtu as u8 & 0x3f);
    b[55] = EXACTLY | (p.rate & 0x3f);
    b[56] = EXACTLY | (p.packet_life_time & 0x3f);
    b[57] = p.preference;
    b
}

/// A path record in the SA's layout (what `rdma_set_option(RDMA_OPTION_IB_PATH)` gives).
pub fn unpack(b: &[u8; 64]) -> PathRecord {
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

/// `p` as `struct ib_user_path_rec` (network byte order where the header says `__be`).
pub fn to_user(p: &PathRecord) -> ib_user_path_rec {
    ib_user_path_rec {
        dgid: p.dgid.0,
        sgid: p.sgid.0,
        dlid: p.dlid.to_be(),
        slid: p.slid.to_be(),
        raw_traffic: 0,
        flow_label: p.flow_label.to_be(),
        reversible: u32::from(p.reversible),
        mtu: p.mtu as u32,
        pkey: p.pkey.to_be(),
        hop_limit: p.hop_limit,
        traffic_class: p.traffic_class,
        numb_path: 1,
        sl: p.sl,
        mtu_selector: 2,
        rate_selector: 2,
        rate: p.rate,
        packet_life_time_selector: 2,
        packet_life_time: p.packet_life_time,
        preference: p.preference,
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
        assert_eq!(unpack(&pack(&p, 0x0106_1d00)), p);
    }
}
