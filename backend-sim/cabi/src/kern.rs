//! Conversions between the kernel's structures and libibverbs' (`ibv_copy_*_from_kern`,
//! `ibv_copy_path_rec_to_kern`): field by field, as librdmacm expects of libibverbs when
//! it turns the rdma_cm kernel module's answers into verbs attributes.

use crate::abi::{
    ib_user_path_rec, ib_uverbs_ah_attr, ib_uverbs_qp_attr, ibv_ah_attr, ibv_gid, ibv_qp_attr,
    ibv_sa_path_rec,
};

fn ah_from_kern(src: &ib_uverbs_ah_attr) -> ibv_ah_attr {
    let mut a = ibv_ah_attr::default();
    a.grh.dgid = ibv_gid { raw: src.grh.dgid };
    a.grh.flow_label = src.grh.flow_label;
    a.grh.sgid_index = src.grh.sgid_index;
    a.grh.hop_limit = src.grh.hop_limit;
    a.grh.traffic_class = src.grh.traffic_class;
    a.dlid = src.dlid;
    a.sl = src.sl;
    a.src_path_bits = src.src_path_bits;
    a.static_rate = src.static_rate;
    a.is_global = src.is_global;
    a.port_num = src.port_num;
    a
}

/// `ibv_copy_ah_attr_from_kern`.
pub(crate) unsafe extern "C" fn ibv_copy_ah_attr_from_kern(
    dst: *mut ibv_ah_attr,
    src: *const ib_uverbs_ah_attr,
) {
    if dst.is_null() || src.is_null() {
        return;
    }
    // SAFETY: the caller passes valid structures of these types.
    unsafe { dst.write(ah_from_kern(&*src)) };
}

/// `ibv_copy_qp_attr_from_kern`: every field but `qp_state` (libibverbs leaves it too).
pub(crate) unsafe extern "C" fn ibv_copy_qp_attr_from_kern(
    dst: *mut ibv_qp_attr,
    src: *const ib_uverbs_qp_attr,
) {
    if dst.is_null() || src.is_null() {
        return;
    }
    // SAFETY: the caller passes valid structures of these types, distinct.
    let (d, s) = unsafe { (&mut *dst, &*src) };
    d.cur_qp_state = s.cur_qp_state;
    d.path_mtu = s.path_mtu;
    d.path_mig_state = s.path_mig_state;
    d.qkey = s.qkey;
    d.rq_psn = s.rq_psn;
    d.sq_psn = s.sq_psn;
    d.dest_qp_num = s.dest_qp_num;
    d.qp_access_flags = s.qp_access_flags;
    d.cap.max_send_wr = s.max_send_wr;
    d.cap.max_recv_wr = s.max_recv_wr;
    d.cap.max_send_sge = s.max_send_sge;
    d.cap.max_recv_sge = s.max_recv_sge;
    d.cap.max_inline_data = s.max_inline_data;
    d.ah_attr = ah_from_kern(&s.ah_attr);
    d.alt_ah_attr = ah_from_kern(&s.alt_ah_attr);
    d.pkey_index = s.pkey_index;
    d.alt_pkey_index = s.alt_pkey_index;
    d.en_sqd_async_notify = s.en_sqd_async_notify;
    d.sq_draining = s.sq_draining;
    d.max_rd_atomic = s.max_rd_atomic;
    d.max_dest_rd_atomic = s.max_dest_rd_atomic;
    d.min_rnr_timer = s.min_rnr_timer;
    d.port_num = s.port_num;
    d.timeout = s.timeout;
    d.retry_cnt = s.retry_cnt;
    d.rnr_retry = s.rnr_retry;
    d.alt_port_num = s.alt_port_num;
    d.alt_timeout = s.alt_timeout;
}

/// `ibv_copy_path_rec_from_kern`.
pub(crate) unsafe extern "C" fn ibv_copy_path_rec_from_kern(
    dst: *mut ibv_sa_path_rec,
    src: *const ib_user_path_rec,
) {
    if dst.is_null() || src.is_null() {
        return;
    }
    // SAFETY: the caller passes valid structures of these types, distinct.
    let (d, s) = unsafe { (&mut *dst, &*src) };
    d.dgid = ibv_gid { raw: s.dgid };
    d.sgid = ibv_gid { raw: s.sgid };
    d.dlid = s.dlid;
    d.slid = s.slid;
    d.raw_traffic = s.raw_traffic as _;
    d.flow_label = s.flow_label;
    d.hop_limit = s.hop_limit;
    d.traffic_class = s.traffic_class;
    d.reversible = s.reversible as _;
    d.numb_path = s.numb_path;
    d.pkey = s.pkey;
    d.sl = s.sl;
    d.mtu_selector = s.mtu_selector;
    d.mtu = s.mtu as u8;
    d.rate_selector = s.rate_selector;
    d.rate = s.rate;
    d.packet_life_time_selector = s.packet_life_time_selector;
    d.packet_life_time = s.packet_life_time;
    d.preference = s.preference;
}

/// `ibv_copy_path_rec_to_kern`.
pub(crate) unsafe extern "C" fn ibv_copy_path_rec_to_kern(
    dst: *mut ib_user_path_rec,
    src: *const ibv_sa_path_rec,
) {
    if dst.is_null() || src.is_null() {
        return;
    }
    // SAFETY: the caller passes valid structures of these types, distinct.
    let (d, s) = unsafe { (&mut *dst, &*src) };
    d.dgid = s.dgid.raw;
    d.sgid = s.sgid.raw;
    d.dlid = s.dlid;
    d.slid = s.slid;
    d.raw_traffic = s.raw_traffic as _;
    d.flow_label = s.flow_label;
    d.hop_limit = s.hop_limit;
    d.traffic_class = s.traffic_class;
    d.reversible = s.reversible as _;
    d.numb_path = s.numb_path;
    d.pkey = s.pkey;
    d.sl = s.sl;
    d.mtu_selector = s.mtu_selector;
    d.mtu = s.mtu as u32;
    d.rate_selector = s.rate_selector;
    d.rate = s.rate;
    d.packet_life_time_selector = s.packet_life_time_selector;
    d.packet_life_time = s.packet_life_time;
    d.preference = s.preference;
}
