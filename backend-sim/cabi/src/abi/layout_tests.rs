//! Every structure of [`crate::abi`] against the installed `<infiniband/verbs.h>`: a C
//! program compiled with the system's `cc` prints each size and field offset, and the
//! test compares them with Rust's. Needs a C compiler and libibverbs-dev.

use std::collections::BTreeMap;
use std::mem::{offset_of, size_of};
use std::process::Command;

use super::*;

/// One fact to check: the C expression (`sizeof(struct x)` or `offsetof(struct x, f)`)
/// and the value Rust computes for it.
struct Fact {
    c: String,
    rust: usize,
}

macro_rules! size {
    ($ty:ident) => {
        Fact {
            c: format!("sizeof(struct {})", stringify!($ty)),
            rust: size_of::<$ty>(),
        }
    };
}

/// `offset!(ty, rust.path)` for a field named as in C, `offset!(ty, rust.path => "c.path")`
/// where the names differ (a Rust keyword, a flattened anonymous union).
macro_rules! offset {
    ($ty:ident, $($f:ident).+) => {
        offset!($ty, $($f).+ => &stringify!($($f).+).replace(' ', ""))
    };
    ($ty:ident, $($f:ident).+ => $c:expr) => {
        Fact {
            c: format!("offsetof(struct {}, {})", stringify!($ty), $c),
            rust: offset_of!($ty, $($f).+),
        }
    };
}

fn facts() -> Vec<Fact> {
    vec![
        size!(ibv_device),
        offset!(ibv_device, node_type),
        offset!(ibv_device, transport_type),
        offset!(ibv_device, name),
        offset!(ibv_device, dev_name),
        offset!(ibv_device, dev_path),
        offset!(ibv_device, ibdev_path),
        size!(ibv_gid_entry),
        offset!(ibv_gid_entry, gid_index),
        offset!(ibv_gid_entry, port_num),
        offset!(ibv_gid_entry, gid_type),
        offset!(ibv_gid_entry, ndev_ifindex),
        size!(ibv_device_attr),
        offset!(ibv_device_attr, node_guid),
        offset!(ibv_device_attr, max_mr_size),
        offset!(ibv_device_attr, vendor_id),
        offset!(ibv_device_attr, max_qp),
        offset!(ibv_device_attr, device_cap_flags),
        offset!(ibv_device_attr, atomic_cap),
        offset!(ibv_device_attr, max_ah),
        offset!(ibv_device_attr, max_srq),
        offset!(ibv_device_attr, max_srq_sge),
        offset!(ibv_device_attr, max_pkeys),
        offset!(ibv_device_attr, local_ca_ack_delay),
        offset!(ibv_device_attr, phys_port_cnt),
        size!(ibv_device_attr_ex),
        offset!(ibv_device_attr_ex, comp_mask),
        offset!(ibv_device_attr_ex, odp_caps),
        offset!(ibv_device_attr_ex, odp_caps.rc_odp_caps => "odp_caps.per_transport_caps.rc_odp_caps"),
        offset!(ibv_device_attr_ex, odp_caps.ud_odp_caps => "odp_caps.per_transport_caps.ud_odp_caps"),
        offset!(ibv_device_attr_ex, completion_timestamp_mask),
        offset!(ibv_device_attr_ex, hca_core_clock),
        offset!(ibv_device_attr_ex, device_cap_flags_ex),
        offset!(ibv_device_attr_ex, tso_caps),
        offset!(ibv_device_attr_ex, rss_caps),
        offset!(ibv_device_attr_ex, rss_caps.rx_hash_function),
        offset!(ibv_device_attr_ex, max_wq_type_rq),
        offset!(ibv_device_attr_ex, packet_pacing_caps),
        offset!(ibv_device_attr_ex, raw_packet_caps),
        offset!(ibv_device_attr_ex, tm_caps),
        offset!(ibv_device_attr_ex, cq_mod_caps),
        offset!(ibv_device_attr_ex, max_dm_size),
        offset!(ibv_device_attr_ex, pci_atomic_caps),
        offset!(ibv_device_attr_ex, xrc_odp_caps),
        offset!(ibv_device_attr_ex, phys_port_cnt_ex),
        size!(ibv_port_attr),
        offset!(ibv_port_attr, port_cap_flags),
        offset!(ibv_port_attr, qkey_viol_cntr),
        offset!(ibv_port_attr, pkey_tbl_len),
        offset!(ibv_port_attr, lid),
        offset!(ibv_port_attr, lmc),
        offset!(ibv_port_attr, active_speed),
        offset!(ibv_port_attr, link_layer),
        offset!(ibv_port_attr, flags),
        offset!(ibv_port_attr, port_cap_flags2),
        size!(ibv_context_ops),
        offset!(ibv_context_ops, alloc_mw),
        offset!(ibv_context_ops, bind_mw),
        offset!(ibv_context_ops, dealloc_mw),
        offset!(ibv_context_ops, poll_cq),
        offset!(ibv_context_ops, req_notify_cq),
        offset!(ibv_context_ops, post_srq_recv),
        offset!(ibv_context_ops, post_send),
        offset!(ibv_context_ops, post_recv),
        offset!(ibv_context_ops, _compat_async_event),
        size!(ibv_context),
        offset!(ibv_context, ops),
        offset!(ibv_context, cmd_fd),
        offset!(ibv_context, async_fd),
        offset!(ibv_context, num_comp_vectors),
        offset!(ibv_context, mutex),
        offset!(ibv_context, abi_compat),
        size!(verbs_context),
        offset!(verbs_context, query_port),
        offset!(verbs_context, advise_mr),
        offset!(verbs_context, reg_dm_mr),
        offset!(verbs_context, modify_cq),
        offset!(verbs_context, post_srq_ops),
        offset!(verbs_context, query_rt_values),
        offset!(verbs_context, create_cq_ex),
        offset!(verbs_context, priv_ => "priv"),
        offset!(verbs_context, query_device_ex),
        offset!(verbs_context, ibv_destroy_flow),
        offset!(verbs_context, abi_placeholder2 => "ABI_placeholder2"),
        offset!(verbs_context, ibv_create_flow),
        offset!(verbs_context, abi_placeholder1 => "ABI_placeholder1"),
        offset!(verbs_context, open_qp),
        offset!(verbs_context, create_qp_ex),
        offset!(verbs_context, get_srq_num),
        offset!(verbs_context, create_srq_ex),
        offset!(verbs_context, open_xrcd),
        offset!(verbs_context, close_xrcd),
        offset!(verbs_context, _abi_placeholder3 => "_ABI_placeholder3"),
        offset!(verbs_context, sz),
        offset!(verbs_context, context),
        size!(ibv_pd),
        offset!(ibv_pd, handle),
        size!(ibv_mr),
        offset!(ibv_mr, pd),
        offset!(ibv_mr, addr),
        offset!(ibv_mr, length),
        offset!(ibv_mr, handle),
        offset!(ibv_mr, lkey),
        offset!(ibv_mr, rkey),
        size!(ibv_mw),
        offset!(ibv_mw, rkey),
        offset!(ibv_mw, type_ => "type"),
        size!(ibv_comp_channel),
        offset!(ibv_comp_channel, fd),
        offset!(ibv_comp_channel, refcnt),
        size!(ibv_cq),
        offset!(ibv_cq, channel),
        offset!(ibv_cq, cq_context),
        offset!(ibv_cq, handle),
        offset!(ibv_cq, cqe),
        offset!(ibv_cq, mutex),
        offset!(ibv_cq, cond),
        offset!(ibv_cq, comp_events_completed),
        offset!(ibv_cq, async_events_completed),
        size!(ibv_cq_ex),
        offset!(ibv_cq_ex, comp_mask),
        offset!(ibv_cq_ex, status),
        offset!(ibv_cq_ex, wr_id),
        offset!(ibv_cq_ex, start_poll),
        offset!(ibv_cq_ex, next_poll),
        offset!(ibv_cq_ex, end_poll),
        offset!(ibv_cq_ex, read_opcode),
        offset!(ibv_cq_ex, read_imm_data),
        offset!(ibv_cq_ex, read_sl),
        offset!(ibv_cq_ex, read_completion_ts),
        offset!(ibv_cq_ex, read_tm_info),
        offset!(ibv_cq_ex, read_completion_wallclock_ns),
        size!(ibv_wc_tm_info),
        size!(ibv_qp),
        offset!(ibv_qp, qp_context),
        offset!(ibv_qp, pd),
        offset!(ibv_qp, send_cq),
        offset!(ibv_qp, recv_cq),
        offset!(ibv_qp, srq),
        offset!(ibv_qp, handle),
        offset!(ibv_qp, qp_num),
        offset!(ibv_qp, state),
        offset!(ibv_qp, qp_type),
        offset!(ibv_qp, mutex),
        offset!(ibv_qp, cond),
        offset!(ibv_qp, events_completed),
        size!(ibv_qp_ex),
        offset!(ibv_qp_ex, comp_mask),
        offset!(ibv_qp_ex, wr_id),
        offset!(ibv_qp_ex, wr_flags),
        offset!(ibv_qp_ex, wr_atomic_cmp_swp),
        offset!(ibv_qp_ex, wr_rdma_write_imm),
        offset!(ibv_qp_ex, wr_send),
        offset!(ibv_qp_ex, wr_set_ud_addr),
        offset!(ibv_qp_ex, wr_set_inline_data),
        offset!(ibv_qp_ex, wr_set_sge),
        offset!(ibv_qp_ex, wr_set_sge_list),
        offset!(ibv_qp_ex, wr_start),
        offset!(ibv_qp_ex, wr_complete),
        offset!(ibv_qp_ex, wr_abort),
        offset!(ibv_qp_ex, wr_atomic_write),
        size!(ibv_data_buf),
        size!(ibv_srq),
        offset!(ibv_srq, srq_context),
        offset!(ibv_srq, pd),
        offset!(ibv_srq, handle),
        offset!(ibv_srq, mutex),
        offset!(ibv_srq, cond),
        offset!(ibv_srq, events_completed),
        size!(ibv_ah),
        offset!(ibv_ah, pd),
        offset!(ibv_ah, handle),
        size!(ibv_async_event),
        offset!(ibv_async_event, event_type),
        size!(ibv_sge),
        offset!(ibv_sge, length),
        offset!(ibv_sge, lkey),
        size!(ibv_send_wr),
        offset!(ibv_send_wr, next),
        offset!(ibv_send_wr, sg_list),
        offset!(ibv_send_wr, num_sge),
        offset!(ibv_send_wr, opcode),
        offset!(ibv_send_wr, send_flags),
        offset!(ibv_send_wr, imm_data),
        offset!(ibv_send_wr, wr),
        offset!(ibv_send_wr, wr.rdma.remote_addr),
        offset!(ibv_send_wr, wr.rdma.rkey),
        offset!(ibv_send_wr, wr.atomic.remote_addr),
        offset!(ibv_send_wr, wr.atomic.compare_add),
        offset!(ibv_send_wr, wr.atomic.swap),
        offset!(ibv_send_wr, wr.atomic.rkey),
        offset!(ibv_send_wr, wr.ud.ah),
        offset!(ibv_send_wr, wr.ud.remote_qpn),
        offset!(ibv_send_wr, wr.ud.remote_qkey),
        offset!(ibv_send_wr, remote_srqn => "qp_type.xrc.remote_srqn"),
        offset!(ibv_send_wr, tail => "bind_mw"),
        offset!(ibv_send_wr, tail.rkey => "bind_mw.rkey"),
        offset!(ibv_send_wr, tail.bind_info => "bind_mw.bind_info"),
        size!(ibv_mw_bind_info),
        offset!(ibv_mw_bind_info, addr),
        offset!(ibv_mw_bind_info, length),
        offset!(ibv_mw_bind_info, mw_access_flags),
        size!(ibv_mw_bind),
        offset!(ibv_mw_bind, send_flags),
        offset!(ibv_mw_bind, bind_info),
        size!(ibv_recv_wr),
        offset!(ibv_recv_wr, next),
        offset!(ibv_recv_wr, sg_list),
        offset!(ibv_recv_wr, num_sge),
        size!(ibv_wc),
        offset!(ibv_wc, status),
        offset!(ibv_wc, opcode),
        offset!(ibv_wc, vendor_err),
        offset!(ibv_wc, byte_len),
        offset!(ibv_wc, imm_data),
        offset!(ibv_wc, qp_num),
        offset!(ibv_wc, src_qp),
        offset!(ibv_wc, wc_flags),
        offset!(ibv_wc, pkey_index),
        offset!(ibv_wc, slid),
        offset!(ibv_wc, sl),
        offset!(ibv_wc, dlid_path_bits),
        size!(ibv_qp_cap),
        offset!(ibv_qp_cap, max_inline_data),
        size!(ibv_qp_init_attr),
        offset!(ibv_qp_init_attr, send_cq),
        offset!(ibv_qp_init_attr, recv_cq),
        offset!(ibv_qp_init_attr, srq),
        offset!(ibv_qp_init_attr, cap),
        offset!(ibv_qp_init_attr, qp_type),
        offset!(ibv_qp_init_attr, sq_sig_all),
        size!(ibv_rx_hash_conf),
        size!(ibv_qp_init_attr_ex),
        offset!(ibv_qp_init_attr_ex, comp_mask),
        offset!(ibv_qp_init_attr_ex, pd),
        offset!(ibv_qp_init_attr_ex, xrcd),
        offset!(ibv_qp_init_attr_ex, create_flags),
        offset!(ibv_qp_init_attr_ex, max_tso_header),
        offset!(ibv_qp_init_attr_ex, rwq_ind_tbl),
        offset!(ibv_qp_init_attr_ex, rx_hash_conf),
        offset!(ibv_qp_init_attr_ex, source_qpn),
        offset!(ibv_qp_init_attr_ex, send_ops_flags),
        size!(ibv_global_route),
        offset!(ibv_global_route, flow_label),
        offset!(ibv_global_route, sgid_index),
        offset!(ibv_global_route, hop_limit),
        offset!(ibv_global_route, traffic_class),
        size!(ibv_ah_attr),
        offset!(ibv_ah_attr, dlid),
        offset!(ibv_ah_attr, sl),
        offset!(ibv_ah_attr, src_path_bits),
        offset!(ibv_ah_attr, static_rate),
        offset!(ibv_ah_attr, is_global),
        offset!(ibv_ah_attr, port_num),
        size!(ibv_grh),
        offset!(ibv_grh, paylen),
        offset!(ibv_grh, sgid),
        offset!(ibv_grh, dgid),
        size!(ibv_qp_attr),
        offset!(ibv_qp_attr, path_mig_state),
        offset!(ibv_qp_attr, qkey),
        offset!(ibv_qp_attr, dest_qp_num),
        offset!(ibv_qp_attr, qp_access_flags),
        offset!(ibv_qp_attr, cap),
        offset!(ibv_qp_attr, ah_attr),
        offset!(ibv_qp_attr, alt_ah_attr),
        offset!(ibv_qp_attr, pkey_index),
        offset!(ibv_qp_attr, en_sqd_async_notify),
        offset!(ibv_qp_attr, max_rd_atomic),
        offset!(ibv_qp_attr, min_rnr_timer),
        offset!(ibv_qp_attr, port_num),
        offset!(ibv_qp_attr, timeout),
        offset!(ibv_qp_attr, retry_cnt),
        offset!(ibv_qp_attr, rnr_retry),
        offset!(ibv_qp_attr, alt_timeout),
        offset!(ibv_qp_attr, rate_limit),
        size!(ibv_srq_attr),
        size!(ibv_srq_init_attr),
        offset!(ibv_srq_init_attr, attr),
        size!(ibv_srq_init_attr_ex),
        offset!(ibv_srq_init_attr_ex, comp_mask),
        offset!(ibv_srq_init_attr_ex, srq_type),
        offset!(ibv_srq_init_attr_ex, pd),
        offset!(ibv_srq_init_attr_ex, xrcd),
        offset!(ibv_srq_init_attr_ex, cq),
        offset!(ibv_srq_init_attr_ex, tm_cap),
        size!(ibv_cq_init_attr_ex),
        offset!(ibv_cq_init_attr_ex, cq_context),
        offset!(ibv_cq_init_attr_ex, channel),
        offset!(ibv_cq_init_attr_ex, comp_vector),
        offset!(ibv_cq_init_attr_ex, wc_flags),
        offset!(ibv_cq_init_attr_ex, comp_mask),
        offset!(ibv_cq_init_attr_ex, flags),
        offset!(ibv_cq_init_attr_ex, parent_domain),
        size!(ibv_poll_cq_attr),
        size!(ibv_query_device_ex_input),
        size!(ib_uverbs_global_route),
        offset!(ib_uverbs_global_route, flow_label),
        offset!(ib_uverbs_global_route, traffic_class),
        size!(ib_uverbs_ah_attr),
        offset!(ib_uverbs_ah_attr, dlid),
        offset!(ib_uverbs_ah_attr, port_num),
        size!(ib_uverbs_qp_attr),
        offset!(ib_uverbs_qp_attr, qp_access_flags),
        offset!(ib_uverbs_qp_attr, ah_attr),
        offset!(ib_uverbs_qp_attr, alt_ah_attr),
        offset!(ib_uverbs_qp_attr, max_send_wr),
        offset!(ib_uverbs_qp_attr, max_inline_data),
        offset!(ib_uverbs_qp_attr, pkey_index),
        offset!(ib_uverbs_qp_attr, en_sqd_async_notify),
        offset!(ib_uverbs_qp_attr, alt_timeout),
        size!(ib_user_path_rec),
        offset!(ib_user_path_rec, dlid),
        offset!(ib_user_path_rec, raw_traffic),
        offset!(ib_user_path_rec, mtu),
        offset!(ib_user_path_rec, pkey),
        offset!(ib_user_path_rec, numb_path),
        offset!(ib_user_path_rec, preference),
        size!(ibv_sa_path_rec),
        offset!(ibv_sa_path_rec, sgid),
        offset!(ibv_sa_path_rec, dlid),
        offset!(ibv_sa_path_rec, raw_traffic),
        offset!(ibv_sa_path_rec, flow_label),
        offset!(ibv_sa_path_rec, reversible),
        offset!(ibv_sa_path_rec, numb_path),
        offset!(ibv_sa_path_rec, pkey),
        offset!(ibv_sa_path_rec, sl),
        offset!(ibv_sa_path_rec, preference),
    ]
}

#[test]
fn layouts_match_verbs_h() {
    let facts = facts();
    let mut c = String::from("#include <stdio.h>\n#include <stddef.h>\n#include <infiniband/verbs.h>\n#include <infiniband/sa.h>\n#include <rdma/ib_user_verbs.h>\n#include <rdma/ib_user_sa.h>\nint main(void) {\n");
    for (i, f) in facts.iter().enumerate() {
        c.push_str(&format!("  printf(\"{i} %zu\\n\", (size_t)({}));\n", f.c));
    }
    c.push_str("  return 0;\n}\n");
    let dir = std::env::temp_dir().join(format!("ibverbs-sim-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, c).unwrap();
    let cc = Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("run cc");
    assert!(
        cc.status.success(),
        "cc failed (needs libibverbs-dev): {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let out = Command::new(&exe).output().expect("run the layout program");
    let _ = std::fs::remove_dir_all(&dir);
    let c_values: BTreeMap<usize, usize> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (i, v) = l.split_once(' ').unwrap();
            (i.parse().unwrap(), v.parse().unwrap())
        })
        .collect();
    assert_eq!(c_values.len(), facts.len(), "the C program printed every fact");
    let wrong: Vec<String> = facts
        .iter()
        .enumerate()
        .filter(|(i, f)| c_values[i] != f.rust)
        .map(|(i, f)| format!("{}: C {} Rust {}", f.c, c_values[&i], f.rust))
        .collect();
    assert!(
        wrong.is_empty(),
        "layouts differ from verbs.h:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn compat_port_attr_ends_at_flags() {
    assert_eq!(COMPAT_PORT_ATTR_SIZE, 48);
}
