//! What a device reports (`man ibv_query_device`, `man ibv_query_device_ex`,
//! `man ibv_query_port`, `man ibv_query_gid`, `man ibv_query_gid_ex`,
//! `man ibv_query_gid_table`, `man ibv_query_pkey`, `man ibv_get_pkey_index`): the sim's
//! attributes in libibverbs' structures.

use std::ffi::{c_int, c_uint};

use verbs_api::{Context as _, DeviceAttr, LinkLayer, PortAttr};

use crate::abi::{
    ibv_context, ibv_device_attr, ibv_device_attr_ex, ibv_gid, ibv_gid_entry, ibv_port_attr,
    ibv_query_device_ex_input, COMPAT_PORT_ATTR_SIZE, IBV_GID_TYPE_IB, IBV_GID_TYPE_ROCE_V2,
    IBV_GID_TYPE_SYSFS_IB_ROCE_V1, IBV_GID_TYPE_SYSFS_ROCE_V2,
};
use crate::context::{self, Context};
use crate::ffi::{copy_c_str, errno_of, errno_verb, minus_one_verb, Errno};

/// The only P_Key of the sim's port: the default, full-membership partition.
const DEFAULT_PKEY: u16 = 0xffff;

fn clamp(v: u32) -> c_int {
    v.min(c_int::MAX as u32) as c_int
}

/// `struct ibv_device_attr` from the sim's attributes.
pub fn device_attr(a: &DeviceAttr, max_ah: u32) -> ibv_device_attr {
    let mut fw_ver = [0; 64];
    copy_c_str(&mut fw_ver, &a.fw_ver);
    ibv_device_attr {
        fw_ver,
        node_guid: a.node_guid.to_be(),
        sys_image_guid: a.sys_image_guid.to_be(),
        max_mr_size: a.max_mr_size,
        page_size_cap: a.page_size_cap,
        vendor_id: a.vendor_id,
        vendor_part_id: a.vendor_part_id,
        hw_ver: a.hw_ver,
        max_qp: clamp(a.max_qp),
        max_qp_wr: clamp(a.max_qp_wr),
        device_cap_flags: a.device_cap_flags,
        max_sge: clamp(a.max_sge),
        max_sge_rd: clamp(a.max_sge_rd),
        max_cq: clamp(a.max_cq),
        max_cqe: clamp(a.max_cqe),
        max_mr: clamp(a.max_mr),
        max_pd: clamp(a.max_pd),
        max_qp_rd_atom: clamp(a.max_qp_rd_atom),
        max_ee_rd_atom: 0,
        max_res_rd_atom: clamp(a.max_qp_rd_atom.saturating_mul(a.max_qp)),
        max_qp_init_rd_atom: clamp(a.max_qp_init_rd_atom),
        max_ee_init_rd_atom: 0,
        atomic_cap: a.atomic_cap as u32,
        max_ee: 0,
        max_rdd: 0,
        max_mw: 0,
        max_raw_ipv6_qp: 0,
        max_raw_ethy_qp: 0,
        max_mcast_grp: clamp(a.max_mcast_grp),
        max_mcast_qp_attach: clamp(a.max_mcast_qp_attach),
        max_total_mcast_qp_attach: clamp(a.max_total_mcast_qp_attach),
        max_ah: clamp(max_ah),
        max_fmr: 0,
        max_map_per_fmr: 0,
        max_srq: clamp(a.max_srq),
        max_srq_wr: clamp(a.max_srq_wr),
        max_srq_sge: clamp(a.max_srq_sge),
        max_pkeys: a.max_pkeys,
        local_ca_ack_delay: 0,
        phys_port_cnt: a.phys_port_cnt,
    }
}

fn query_device_attr(ctx: &Context) -> Result<ibv_device_attr, Errno> {
    let a = ctx
        .sim
        .query_device()
        .map_err(|e| errno_of("ibv_query_device", &e))?;
    let caps = ctx
        .sim
        .capabilities()
        .map_err(|e| errno_of("ibv_query_device", &e))?;
    // Address handles exist where UD does.
    let max_ah = if caps.ud { a.max_qp } else { 0 };
    Ok(device_attr(&a, max_ah))
}

/// `struct ibv_port_attr` from the sim's.
pub fn port_attr(p: &PortAttr) -> ibv_port_attr {
    ibv_port_attr {
        state: p.state as u32,
        max_mtu: p.max_mtu as u32,
        active_mtu: p.active_mtu as u32,
        gid_tbl_len: clamp(p.gid_tbl_len),
        port_cap_flags: 0,
        max_msg_sz: p.max_msg_sz,
        bad_pkey_cntr: p.bad_pkey_cntr,
        qkey_viol_cntr: p.qkey_viol_cntr,
        pkey_tbl_len: p.pkey_tbl_len,
        lid: p.lid,
        sm_lid: p.sm_lid,
        lmc: p.lmc,
        // One data VL (VL0), as every port has.
        max_vl_num: 1,
        sm_sl: 0,
        subnet_timeout: 0,
        init_type_reply: 0,
        active_width: p.active_width,
        active_speed: p.active_speed,
        phys_state: p.phys_state,
        link_layer: p.link_layer as u8,
        flags: 0,
        port_cap_flags2: 0,
    }
}

fn query_port(ctx: &Context, port: u8) -> Result<ibv_port_attr, Errno> {
    let p = ctx
        .sim
        .query_port(port)
        .map_err(|e| errno_of("ibv_query_port", &e))?;
    Ok(port_attr(&p))
}

/// Writes the first `len` bytes of `value` to `dst` (the caller's structure may be an
/// older, shorter version).
///
/// # Safety
///
/// `dst` must be valid for `len` bytes of writes.
unsafe fn write_prefix<T>(dst: *mut T, value: &T, len: usize) {
    let len = len.min(size_of::<T>());
    // SAFETY: the caller guarantees `dst` for `len` bytes; `value` is a live `T` of at
    // least `len` bytes; they do not overlap (`value` is ours).
    unsafe { std::ptr::copy_nonoverlapping((value as *const T).cast::<u8>(), dst.cast::<u8>(), len) };
}

/// `ibv_query_device`: 0 or an error number.
pub(crate) unsafe extern "C" fn ibv_query_device(ctx: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int {
    errno_verb("ibv_query_device", || {
        // SAFETY: used within this call only.
        let ctx = unsafe { context::get(ctx) }?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        let a = query_device_attr(ctx)?;
        // SAFETY: the program passes a `struct ibv_device_attr *`.
        unsafe { attr.write(a) };
        Ok(())
    })
}

/// `verbs_context::query_device_ex` (what `ibv_query_device_ex` calls): the attributes
/// and the extended ones the sim has (none of ODP, TSO, RSS, timestamps, ...), as much
/// as `attr_size` holds.
pub(crate) unsafe extern "C" fn query_device_ex_op(
    ctx: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    errno_verb("ibv_query_device_ex", || {
        // SAFETY: used within this call only.
        let ctx = unsafe { context::get(ctx) }?;
        // SAFETY: the program passes a `struct ibv_query_device_ex_input *` or NULL.
        if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
            return Err(libc::EINVAL);
        }
        if attr.is_null() || attr_size < size_of::<ibv_device_attr>() {
            return Err(libc::EINVAL);
        }
        let orig_attr = query_device_attr(ctx)?;
        let ex = ibv_device_attr_ex {
            orig_attr,
            comp_mask: 0,
            odp_caps: Default::default(),
            completion_timestamp_mask: 0,
            hca_core_clock: 0,
            device_cap_flags_ex: orig_attr.device_cap_flags as u64,
            tso_caps: Default::default(),
            rss_caps: Default::default(),
            max_wq_type_rq: 0,
            packet_pacing_caps: Default::default(),
            raw_packet_caps: 0,
            tm_caps: Default::default(),
            cq_mod_caps: Default::default(),
            max_dm_size: 0,
            pci_atomic_caps: Default::default(),
            xrc_odp_caps: 0,
            phys_port_cnt_ex: orig_attr.phys_port_cnt as u32,
        };
        // SAFETY: the program's structure holds `attr_size` bytes.
        unsafe { write_prefix(attr, &ex, attr_size) };
        Ok(())
    })
}

/// `verbs_context::query_port` (what the header's inline `ibv_query_port` calls).
pub(crate) unsafe extern "C" fn query_port_op(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
    attr_len: usize,
) -> c_int {
    errno_verb("ibv_query_port", || {
        // SAFETY: used within this call only.
        let ctx = unsafe { context::get(ctx) }?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        let p = query_port(ctx, port)?;
        // SAFETY: the program's structure holds `attr_len` bytes.
        unsafe { write_prefix(attr, &p, attr_len) };
        Ok(())
    })
}

/// The exported `ibv_query_port`, which programs reach only without the inline wrapper
/// (built before it existed): `struct _compat_ibv_port_attr`, without `port_cap_flags2`.
pub(crate) unsafe extern "C" fn ibv_query_port(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    // SAFETY: the compat structure is the first COMPAT_PORT_ATTR_SIZE bytes.
    unsafe { query_port_op(ctx, port, attr, COMPAT_PORT_ATTR_SIZE) }
}

fn gid(ctx: &Context, port: u8, index: u32) -> Result<ibv_gid, Errno> {
    let g = ctx
        .sim
        .query_gid(port, index)
        .map_err(|e| errno_of("ibv_query_gid", &e))?;
    Ok(ibv_gid { raw: g.0 })
}

/// `ibv_query_gid`: 0, or -1 with errno.
pub(crate) unsafe extern "C" fn ibv_query_gid(
    ctx: *mut ibv_context,
    port: u8,
    index: c_int,
    out: *mut ibv_gid,
) -> c_int {
    minus_one_verb("ibv_query_gid", || {
        // SAFETY: used within this call only.
        let ctx = unsafe { context::get(ctx) }?;
        let index = u32::try_from(index).map_err(|_| libc::EINVAL)?;
        if out.is_null() {
            return Err(libc::EINVAL);
        }
        let g = gid(ctx, port, index)?;
        // SAFETY: the program passes a `union ibv_gid *`.
        unsafe { out.write(g) };
        Ok(0)
    })
}

/// Whether `port` is an Ethernet (RoCE v2) port, whose GIDs are RoCE v2 GIDs.
fn roce_port(ctx: &Context, port: u8) -> Result<bool, Errno> {
    let p = ctx
        .sim
        .query_port(port)
        .map_err(|e| errno_of("ibv_query_port", &e))?;
    Ok(p.link_layer == LinkLayer::Ethernet)
}

/// The entry at `index`: ENODATA for an empty one (the zero GID), as the kernel answers
/// `ibv_query_gid_ex` for it.
fn gid_entry(ctx: &Context, port: u32, index: u32) -> Result<ibv_gid_entry, Errno> {
    let port8 = u8::try_from(port).map_err(|_| libc::EINVAL)?;
    let gid = gid(ctx, port8, index)?;
    if gid.raw == [0; 16] {
        return Err(libc::ENODATA);
    }
    Ok(ibv_gid_entry {
        gid,
        gid_index: index,
        port_num: port,
        gid_type: if roce_port(ctx, port8)? {
            IBV_GID_TYPE_ROCE_V2
        } else {
            IBV_GID_TYPE_IB
        },
        ndev_ifindex: 0,
    })
}

/// `_ibv_query_gid_ex` (behind the inline `ibv_query_gid_ex`): 0 or an error number.
pub(crate) unsafe extern "C" fn _ibv_query_gid_ex(
    ctx: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    errno_verb("ibv_query_gid_ex", || {
        // SAFETY: used within this call only.
        let ctx = unsafe { context::get(ctx) }?;
        if flags != 0 || entry.is_null() || entry_size < size_of::<ibv_gid_entry>() {
            return Err(libc::EINVAL);
        }
        let e = gid_entry(ctx, port, index)?;
        // SAFETY: the program passes a `struct ibv_gid_entry *` of `entry_size` bytes.
        unsafe { entry.write(e) };
        Ok(())
    })
}

/// `_ibv_query_gid_table` (behind the inline `ibv_query_gid_table`): the number of
/// entries written, or a negative error number.
pub(crate) unsafe extern "C" fn _ibv_query_gid_table(
    ctx: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    let r = crate::ffi::value_verb(
        "ibv_query_gid_table",
        Err(libc::EIO),
        || -> Result<isize, Errno> {
            // SAFETY: used within this call only.
            let ctx = unsafe { context::get(ctx) }?;
            if flags != 0 || entries.is_null() || entry_size < size_of::<ibv_gid_entry>() {
                return Err(libc::EINVAL);
            }
            let ports = ctx
                .sim
                .query_device()
                .map_err(|e| errno_of("ibv_query_gid_table", &e))?
                .phys_port_cnt;
            let mut n = 0usize;
            for port in 1..=ports {
                let len = query_port(ctx, port)?.gid_tbl_len as u32;
                for index in 0..len {
                    if n == max_entries {
                        return Err(libc::EINVAL);
                    }
                    let e = match gid_entry(ctx, port as u32, index) {
                        Ok(e) => e,
                        // Only the populated entries are listed.
                        Err(libc::ENODATA) => continue,
                        Err(e) => return Err(e),
                    };
                    // SAFETY: the program's array holds `max_entries` entries of
                    // `entry_size` bytes; n < max_entries.
                    unsafe {
                        entries
                            .cast::<u8>()
                            .add(n * entry_size)
                            .cast::<ibv_gid_entry>()
                            .write_unaligned(e)
                    };
                    n += 1;
                }
            }
            Ok(n as isize)
        },
    );
    r.unwrap_or_else(|e| -(e as isize))
}

/// `ibv_query_gid_type` (libibverbs' private, used by `ibv_devinfo`): 0 with
/// `IBV_GID_TYPE_SYSFS_IB_ROCE_V1` (the sysfs name of an IB GID) or, on an Ethernet
/// port, `IBV_GID_TYPE_SYSFS_ROCE_V2`; or -1.
pub(crate) unsafe extern "C" fn ibv_query_gid_type(
    ctx: *mut ibv_context,
    port: u8,
    index: c_uint,
    ty: *mut u32,
) -> c_int {
    minus_one_verb("ibv_query_gid_type", || {
        // SAFETY: used within this call only.
        let ctx = unsafe { context::get(ctx) }?;
        gid(ctx, port, index)?;
        if ty.is_null() {
            return Err(libc::EINVAL);
        }
        let sysfs_type = if roce_port(ctx, port)? {
            IBV_GID_TYPE_SYSFS_ROCE_V2
        } else {
            IBV_GID_TYPE_SYSFS_IB_ROCE_V1
        };
        // SAFETY: the program passes an `enum ibv_gid_type_sysfs *`.
        unsafe { ty.write(sysfs_type) };
        Ok(0)
    })
}

/// `ibv_query_pkey`: 0, or -1 with errno. The port's table holds the default P_Key.
pub(crate) unsafe extern "C" fn ibv_query_pkey(
    ctx: *mut ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    minus_one_verb("ibv_query_pkey", || {
        // SAFETY: used within this call only.
        let ctx = unsafe { context::get(ctx) }?;
        let len = query_port(ctx, port)?.pkey_tbl_len;
        if pkey.is_null() || index < 0 || index >= len as c_int {
            return Err(libc::EINVAL);
        }
        // SAFETY: the program passes a `__be16 *`.
        unsafe { pkey.write(DEFAULT_PKEY.to_be()) };
        Ok(0)
    })
}

/// `ibv_get_pkey_index`: the index of `pkey` (network order), or -1.
pub(crate) unsafe extern "C" fn ibv_get_pkey_index(ctx: *mut ibv_context, port: u8, pkey: u16) -> c_int {
    minus_one_verb("ibv_get_pkey_index", || {
        // SAFETY: used within this call only.
        let ctx = unsafe { context::get(ctx) }?;
        query_port(ctx, port)?;
        if u16::from_be(pkey) == DEFAULT_PKEY {
            Ok(0)
        } else {
            Err(libc::ENOENT)
        }
    })
}
