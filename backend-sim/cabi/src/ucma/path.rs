//! A path record as `struct ib_user_path_rec` (the older route query's answer; the SA's
//! layout that the newer one and `RDMA_OPTION_IB_PATH` use is
//! [`verbs_api::rdmacm::sa`]'s).

use verbs_api::rdmacm::PathRecord;

use crate::abi::ib_user_path_rec;

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
