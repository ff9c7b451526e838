//! The commands of `rdma_user_cm.h`, as the kernel's `drivers/infiniband/core/ucma.c`
//! checks and answers them, served by the sim's connection manager through the
//! verbs-api traits (`verbs_api::rdmacm::CmId`).

use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

use backend_sim::rdmacm::SimCmId;
use verbs_api::rdmacm::sa::{PATH_FLAGS_PRIMARY, PATH_RECORD_LEN};
use verbs_api::rdmacm::{
    CmEvent, CmEventParam, CmEventType, CmId, CmOption, ConnParam, PathRecord, PortSpace,
};
use verbs_api::{AsyncEventType, QpAttr, QpAttrMask, QpState, QpType};

use super::user::{read, read_bytes, write};
use super::{addr, path, state, Entry, File, McEntry, State};
use crate::abi::ucma::*;
use crate::abi::{ib_uverbs_ah_attr, ib_uverbs_global_route, ib_uverbs_qp_attr};
use crate::ffi::Errno;

type R<T = ()> = std::result::Result<T, Errno>;

fn errno(call: &'static str) -> impl Fn(verbs_api::Error) -> Errno {
    move |e| crate::ffi::errno_of(call, &e)
}

/// The id `handle` of file `fd` (EINVAL for another file's or none, as `ucma_get_ctx`).
fn id_of(fd: RawFd, handle: u32) -> R<Arc<SimCmId>> {
    match state().ids.lock().get(&handle) {
        Some(e) if e.file == fd => Ok(e.id.clone()),
        Some(_) => Err(libc::EINVAL),
        None => Err(libc::ENOENT),
    }
}

fn timeout(ms: u32) -> Duration {
    Duration::from_millis(u64::from(ms))
}

/// Runs the command of `len` bytes at `buf` for file `fd`.
pub fn run(fd: RawFd, file: &Arc<File>, buf: u64, len: usize) -> R {
    let hdr_len = size_of::<rdma_ucm_cmd_hdr>();
    if len < hdr_len {
        return Err(libc::EINVAL);
    }
    let _window = super::user::Window::load(buf, len);
    let hdr: rdma_ucm_cmd_hdr = read(buf, hdr_len)?;
    if hdr.cmd >= cmd::COUNT {
        return Err(libc::EINVAL);
    }
    let in_len = usize::from(hdr.r#in);
    if in_len + hdr_len > len {
        return Err(libc::EINVAL);
    }
    let out_len = usize::from(hdr.out);
    let inbuf = buf + hdr_len as u64;
    match hdr.cmd {
        cmd::CREATE_ID => create_id(fd, file, inbuf, in_len, out_len),
        cmd::DESTROY_ID => destroy_id(fd, inbuf, in_len, out_len),
        cmd::BIND_IP => {
            let c: rdma_ucm_bind_ip = read(inbuf, in_len)?;
            let a = addr::from_in6(&c.addr)?.ok_or(libc::EINVAL)?;
            id_of(fd, c.id)?.bind_addr(a).map_err(errno("rdma_bind_addr"))
        }
        cmd::BIND => {
            let c: rdma_ucm_bind = read(inbuf, in_len)?;
            if c.reserved != 0 || c.addr_size == 0 {
                return Err(libc::EINVAL);
            }
            let a = addr::from_storage(&c.addr, c.addr_size)?.ok_or(libc::EINVAL)?;
            id_of(fd, c.id)?.bind_addr(a).map_err(errno("rdma_bind_addr"))
        }
        cmd::RESOLVE_IP => {
            let c: rdma_ucm_resolve_ip = read(inbuf, in_len)?;
            let src = addr::from_in6(&c.src_addr)?;
            let dst = addr::from_in6(&c.dst_addr)?.ok_or(libc::EINVAL)?;
            id_of(fd, c.id)?
                .resolve_addr(src, dst, timeout(c.timeout_ms))
                .map_err(errno("rdma_resolve_addr"))
        }
        cmd::RESOLVE_ADDR => {
            let c: rdma_ucm_resolve_addr = read(inbuf, in_len)?;
            if c.reserved != 0 || c.dst_size == 0 {
                return Err(libc::EINVAL);
            }
            let src = addr::from_storage(&c.src_addr, c.src_size)?;
            let dst = addr::from_storage(&c.dst_addr, c.dst_size)?.ok_or(libc::EINVAL)?;
            id_of(fd, c.id)?
                .resolve_addr(src, dst, timeout(c.timeout_ms))
                .map_err(errno("rdma_resolve_addr"))
        }
        cmd::RESOLVE_ROUTE => {
            let c: rdma_ucm_resolve_route = read(inbuf, in_len)?;
            id_of(fd, c.id)?
                .resolve_route(timeout(c.timeout_ms))
                .map_err(errno("rdma_resolve_route"))
        }
        cmd::QUERY_ROUTE => query_route(fd, inbuf, in_len, out_len),
        cmd::QUERY => query(fd, inbuf, in_len, out_len),
        cmd::CONNECT => {
            let c: rdma_ucm_connect = read(inbuf, in_len)?;
            if c.conn_param.valid == 0 {
                return Err(libc::EINVAL);
            }
            id_of(fd, c.id)?
                .connect(&conn_param(&c.conn_param))
                .map_err(errno("rdma_connect"))
        }
        cmd::LISTEN => {
            let c: rdma_ucm_listen = read(inbuf, in_len)?;
            id_of(fd, c.id)?.listen(c.backlog).map_err(errno("rdma_listen"))
        }
        cmd::ACCEPT => {
            let c: rdma_ucm_accept = read(inbuf, in_len)?;
            let id = id_of(fd, c.id)?;
            if c.conn_param.valid != 0 {
                id.accept(Some(&conn_param(&c.conn_param)))
                    .map_err(errno("rdma_accept"))?;
                // Its events now carry the program's context (the kernel's `ctx->uid`).
                id.set_context(c.uid);
                Ok(())
            } else {
                id.accept(None).map_err(errno("rdma_accept"))
            }
        }
        cmd::REJECT => {
            let c: rdma_ucm_reject = read(inbuf, in_len)?;
            let n = usize::from(c.private_data_len).min(RDMA_MAX_PRIVATE_DATA);
            id_of(fd, c.id)?
                .reject(&c.private_data[..n], c.reason)
                .map_err(errno("rdma_reject"))
        }
        cmd::DISCONNECT => {
            let c: rdma_ucm_disconnect = read(inbuf, in_len)?;
            id_of(fd, c.id)?.disconnect().map_err(errno("rdma_disconnect"))
        }
        cmd::INIT_QP_ATTR => init_qp_attr(fd, inbuf, in_len, out_len),
        cmd::GET_EVENT => get_event(fd, file, inbuf, in_len, out_len),
        cmd::SET_OPTION => set_option(fd, inbuf, in_len),
        cmd::NOTIFY => {
            let c: rdma_ucm_notify = read(inbuf, in_len)?;
            let ev = if c.event == AsyncEventType::CommEst as u32 {
                AsyncEventType::CommEst
            } else {
                AsyncEventType::QpFatal
            };
            id_of(fd, c.id)?.notify(ev).map_err(errno("rdma_notify"))
        }
        cmd::MIGRATE_ID => migrate(fd, file, inbuf, in_len, out_len),
        cmd::JOIN_IP_MCAST => {
            let c: rdma_ucm_join_ip_mcast = read(inbuf, in_len)?;
            let a = addr::from_in6(&c.addr)?.ok_or(libc::EINVAL)?;
            join(fd, c.id, c.uid, a, false, c.response, out_len)
        }
        cmd::JOIN_MCAST => {
            let c: rdma_ucm_join_mcast = read(inbuf, in_len)?;
            let a = addr::from_storage(&c.addr, c.addr_size)?.ok_or(libc::EINVAL)?;
            let send_only = match c.join_flags {
                MC_JOIN_FLAG_FULLMEMBER => false,
                MC_JOIN_FLAG_SENDONLY_FULLMEMBER => true,
                _ => return Err(libc::EINVAL),
            };
            join(fd, c.id, c.uid, a, send_only, c.response, out_len)
        }
        cmd::LEAVE_MCAST => leave(fd, inbuf, in_len, out_len),
        // GET_OPTION is the kernel's ENOSYS too.
        cmd::GET_OPTION => Err(libc::ENOSYS),
        _ => Err(libc::EINVAL),
    }
}

fn conn_param(c: &rdma_ucm_conn_param) -> ConnParam {
    let n = usize::from(c.private_data_len).min(RDMA_MAX_PRIVATE_DATA);
    ConnParam {
        private_data: c.private_data[..n].to_vec(),
        responder_resources: c.responder_resources,
        initiator_depth: c.initiator_depth,
        flow_control: c.flow_control,
        retry_count: c.retry_count,
        rnr_retry_count: c.rnr_retry_count,
        srq: c.srq != 0,
        qp_num: c.qp_num,
        qkey: c.qkey,
    }
}

fn create_id(fd: RawFd, file: &Arc<File>, inbuf: u64, in_len: usize, out_len: usize) -> R {
    let c: rdma_ucm_create_id = read(inbuf, in_len)?;
    let ps = PortSpace::from_raw(u32::from(c.ps)).ok_or(libc::EINVAL)?;
    let qp_type = match ps {
        PortSpace::Tcp => QpType::Rc,
        PortSpace::Udp | PortSpace::Ipoib => QpType::Ud,
        PortSpace::Ib => match u32::from(c.qp_type) {
            t if t == QpType::Rc as u32 => QpType::Rc,
            t if t == QpType::Ud as u32 => QpType::Ud,
            _ => return Err(libc::EINVAL),
        },
    };
    let id = verbs_api::rdmacm::CmEventChannel::create_id(&file.ch, c.uid, ps, qp_type)
        .map_err(errno("rdma_create_id"))?;
    let handle = id.handle();
    let resp = rdma_ucm_create_id_resp { id: handle };
    // A program that cannot take the answer does not get the id.
    write(c.response, &resp, out_len)?;
    state().ids.lock().insert(
        handle,
        Entry {
            id: Arc::new(id),
            file: fd,
            events: 0,
        },
    );
    Ok(())
}

fn destroy_id(fd: RawFd, inbuf: u64, in_len: usize, out_len: usize) -> R {
    let c: rdma_ucm_destroy_id = read(inbuf, in_len)?;
    let entry = {
        let mut ids = state().ids.lock();
        match ids.get(&c.id) {
            Some(e) if e.file == fd => ids.remove(&c.id).expect("present"),
            Some(_) => return Err(libc::EINVAL),
            None => return Err(libc::ENOENT),
        }
    };
    state().mcs.lock().retain(|_, m| m.id != c.id);
    let resp = rdma_ucm_destroy_id_resp {
        events_reported: entry.events,
    };
    drop(entry);
    write(c.response, &resp, out_len)
}

/// `JOIN_MCAST` / `JOIN_IP_MCAST` (the kernel's `ucma_process_join()`): the join's
/// handle is answered; a program that cannot take the answer leaves the group again.
fn join(
    fd: RawFd,
    id: u32,
    uid: u64,
    a: std::net::SocketAddr,
    send_only: bool,
    response: u64,
    out_len: usize,
) -> R {
    let cm = id_of(fd, id)?;
    let handle = state()
        .last_mc
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        .wrapping_add(1);
    // Listed before the join, whose event may be taken at once by another thread.
    state().mcs.lock().insert(handle, McEntry { id, uid, events: 0 });
    if let Err(e) = cm.join_multicast(a, u64::from(handle), send_only) {
        state().mcs.lock().remove(&handle);
        return Err(errno("rdma_join_multicast")(e));
    }
    if let Err(e) = write(response, &rdma_ucm_create_id_resp { id: handle }, out_len) {
        let _ = cm.leave_multicast_joined(u64::from(handle));
        state().mcs.lock().remove(&handle);
        return Err(e);
    }
    Ok(())
}

/// `LEAVE_MCAST` (the kernel's `ucma_leave_multicast()`): answers how many of the
/// join's events the program was handed, which librdmacm waits to see acknowledged.
fn leave(fd: RawFd, inbuf: u64, in_len: usize, out_len: usize) -> R {
    let c: rdma_ucm_destroy_id = read(inbuf, in_len)?;
    let id = state().mcs.lock().get(&c.id).map(|m| m.id).ok_or(libc::ENOENT)?;
    let cm = id_of(fd, id)?;
    cm.leave_multicast_joined(u64::from(c.id))
        .map_err(errno("rdma_leave_multicast"))?;
    let events = state().mcs.lock().remove(&c.id).map_or(0, |m| m.events);
    write(
        c.response,
        &rdma_ucm_destroy_id_resp {
            events_reported: events,
        },
        out_len,
    )
}

fn node_guid_be(g: u64) -> u64 {
    g.to_be()
}

fn query_route(fd: RawFd, inbuf: u64, in_len: usize, out_len: usize) -> R {
    let c: rdma_ucm_query = read(inbuf, in_len)?;
    let id = id_of(fd, c.id)?;
    let a = id.query_addr().map_err(errno("rdma_query_route"))?;
    let paths = id.query_path().map_err(errno("rdma_query_route"))?;
    let mut r = rdma_ucm_query_route_resp {
        node_guid: node_guid_be(a.node_guid),
        src_addr: addr::to_in6(a.src),
        dst_addr: addr::to_in6(a.dst),
        num_paths: paths.len().min(2) as u32,
        port_num: a.port_num,
        ibdev_index: a.ibdev_index.unwrap_or(0),
        ..Default::default()
    };
    for (slot, p) in r.ib_route.iter_mut().zip(&paths) {
        *slot = path::to_user(p);
    }
    if paths.is_empty() {
        // The GIDs of an id bound to a device but not resolved (librdmacm reads them).
        let (s, d) = id.query_gid().map_err(errno("rdma_query_route"))?;
        r.ib_route[0].sgid = s.0;
        r.ib_route[0].dgid = d.0;
        r.ib_route[0].pkey = 0xffff;
    }
    write(c.response, &r, out_len)
}

fn query(fd: RawFd, inbuf: u64, in_len: usize, out_len: usize) -> R {
    let c: rdma_ucm_query = read(inbuf, in_len)?;
    let id = id_of(fd, c.id)?;
    match c.option {
        query::ADDR | query::GID => {
            let a = id.query_addr().map_err(errno("rdma_query"))?;
            let mut r = rdma_ucm_query_addr_resp {
                node_guid: node_guid_be(a.node_guid),
                port_num: a.port_num,
                pkey: a.pkey.to_be(),
                ibdev_index: a.ibdev_index.unwrap_or(0),
                ..Default::default()
            };
            if c.option == query::ADDR {
                (r.src_addr, r.src_size) = addr::to_storage(a.src);
                (r.dst_addr, r.dst_size) = addr::to_storage(a.dst);
            } else {
                let (s, d) = id.query_gid().map_err(errno("rdma_query"))?;
                r.src_addr = addr::ib_with_gid(s.0);
                r.dst_addr = addr::ib_with_gid(d.0);
                r.src_size = 48;
                r.dst_size = 48;
            }
            write(c.response, &r, out_len)
        }
        query::PATH => {
            // The sim's routes have one path.
            let paths = id.query_path().map_err(errno("rdma_query"))?;
            let a = id.query_addr().map_err(errno("rdma_query"))?;
            let service_id = a
                .dst
                .map_or(0, |d| ((id.port_space() as u64) << 16) | u64::from(d.port()));
            let mut r = rdma_ucm_query_path_resp {
                num_paths: paths.len().min(1) as u32,
                ..Default::default()
            };
            if let Some(p) = paths.first() {
                r.path_data[0] = ib_path_rec_data {
                    flags: PATH_FLAGS_PRIMARY,
                    reserved: 0,
                    path_rec: p.to_sa(service_id),
                };
            }
            let n = std::mem::offset_of!(rdma_ucm_query_path_resp, path_data)
                + r.num_paths as usize * size_of::<ib_path_rec_data>();
            write(c.response, &r, out_len.min(n))
        }
        _ => Err(libc::ENOSYS),
    }
}

fn init_qp_attr(fd: RawFd, inbuf: u64, in_len: usize, out_len: usize) -> R {
    let c: rdma_ucm_init_qp_attr = read(inbuf, in_len)?;
    let state = QpState::from_raw(c.qp_state).ok_or(libc::EINVAL)?;
    let (a, m) = id_of(fd, c.id)?
        .init_qp_attr(state)
        .map_err(errno("rdma_init_qp_attr"))?;
    write(c.response, &to_kern(&a, m), out_len)
}

fn ah_to_kern(a: &verbs_api::AhAttr) -> ib_uverbs_ah_attr {
    ib_uverbs_ah_attr {
        grh: ib_uverbs_global_route {
            dgid: a.grh.dgid.0,
            flow_label: a.grh.flow_label,
            sgid_index: a.grh.sgid_index,
            hop_limit: a.grh.hop_limit,
            traffic_class: a.grh.traffic_class,
            reserved: 0,
        },
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        is_global: u8::from(a.is_global),
        port_num: a.port_num,
        reserved: 0,
    }
}

/// `ib_copy_qp_attr_to_user`.
fn to_kern(a: &QpAttr, m: QpAttrMask) -> ib_uverbs_qp_attr {
    ib_uverbs_qp_attr {
        qp_attr_mask: m.bits(),
        qp_state: a.qp_state as u32,
        cur_qp_state: a.cur_qp_state as u32,
        path_mtu: a.path_mtu as u32,
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        qp_access_flags: a.qp_access_flags.bits(),
        ah_attr: ah_to_kern(&a.ah_attr),
        pkey_index: a.pkey_index,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        ..Default::default()
    }
}

fn get_event(fd: RawFd, file: &Arc<File>, inbuf: u64, in_len: usize, out_len: usize) -> R {
    let c: rdma_ucm_get_event = read(inbuf, in_len)?;
    if out_len < size_of::<rdma_ucm_event_resp>() {
        return Err(libc::ENOSPC);
    }
    let (ev, uid, handle) = take_event(fd, state(), || {
        file.ch.read_event().map_err(errno("rdma_get_cm_event"))
    })?;
    let mut r = rdma_ucm_event_resp {
        uid,
        id: handle,
        event: ev.event as u32,
        status: ev.status as u32,
        ..Default::default()
    };
    match &ev.param {
        CmEventParam::None => {}
        CmEventParam::Conn(p) => {
            let mut k = rdma_ucm_conn_param {
                qp_num: p.qp_num,
                qkey: p.qkey,
                srq: u8::from(p.srq),
                responder_resources: p.responder_resources,
                initiator_depth: p.initiator_depth,
                flow_control: p.flow_control,
                retry_count: p.retry_count,
                rnr_retry_count: p.rnr_retry_count,
                ..Default::default()
            };
            let n = p.private_data.len().min(RDMA_MAX_PRIVATE_DATA);
            k.private_data[..n].copy_from_slice(&p.private_data[..n]);
            k.private_data_len = n as u8;
            r.param.conn = k;
        }
        CmEventParam::Ud(p) => {
            let mut k = rdma_ucm_ud_param {
                qp_num: p.qp_num,
                qkey: p.qkey,
                ah_attr: ah_to_kern(&p.ah_attr),
                private_data: [0; RDMA_MAX_PRIVATE_DATA],
                private_data_len: 0,
                reserved: [0; 7],
            };
            let n = p.private_data.len().min(RDMA_MAX_PRIVATE_DATA);
            k.private_data[..n].copy_from_slice(&p.private_data[..n]);
            k.private_data_len = n as u8;
            r.param.ud = k;
        }
    }
    write(c.response, &r, out_len)
}

/// The next event of the file that is still the program's, counted as handed over: its
/// `uid` and `id` for the answer.
///
/// The kernel takes an event off the file and counts it for its id (or join) in one
/// step under the file's lock, and `DESTROY_ID` (`LEAVE_MCAST`) drops the id's pending
/// events and answers the count under that lock too, so librdmacm, which frees the id
/// once that many events are acknowledged, never sees an event for an id it freed. Here
/// the event leaves the channel before it is counted: an id destroyed (a join left) in
/// between is found gone when the event is counted, and the event goes as the kernel
/// would have dropped it (a connection request's new id with it: the peer is
/// rejected). Counting it, or handing it over uncounted, would let a program thread
/// read an event whose id another thread has freed.
fn take_event(
    fd: RawFd,
    st: &State,
    mut read_event: impl FnMut() -> R<CmEvent<SimCmId>>,
) -> R<(CmEvent<SimCmId>, u64, u32)> {
    loop {
        let mut ev = read_event()?;
        // A join's events name the join (the kernel's `uevent->mc`) and count for it and
        // for its id, as librdmacm acknowledges them (`ucma_complete_mc_event`).
        // (The lock order of `close`: ids, then joins. Both guards go before `ev` does, so
        // a dropped request's new id is destroyed with neither held.)
        let mut ids = st.ids.lock();
        let mut mcs = st.mcs.lock();
        let join = match ev.mcast.map(|h| h as u32) {
            Some(h) => match mcs.get_mut(&h) {
                Some(m) => Some((h, m)),
                None => {
                    tracing::debug!(join = h, event = %ev.event, "rdma_cm: an event of a join left meanwhile is dropped");
                    continue;
                }
            },
            None => None,
        };
        let counted = ev.listen_id.map_or(ev.id.handle, |l| l.handle);
        let Some(e) = ids.get_mut(&counted) else {
            tracing::debug!(id = counted, event = %ev.event, "rdma_cm: an event of an id destroyed meanwhile is dropped");
            continue;
        };
        e.events += 1;
        if let Some((h, m)) = join {
            m.events += 1;
            return Ok((ev, m.uid, h));
        }
        if ev.event == CmEventType::ConnectRequest {
            if let Some(new) = ev.new_id.take() {
                // The new id is the program's until it destroys it; until it accepts,
                // its own events carry no context (the kernel's `ctx->uid` is 0).
                new.set_context(0);
                ids.insert(
                    ev.id.handle,
                    Entry {
                        id: Arc::new(new),
                        file: fd,
                        events: 0,
                    },
                );
            }
        }
        let (uid, handle) = (ev.id.context, ev.id.handle);
        return Ok((ev, uid, handle));
    }
}

fn set_option(fd: RawFd, inbuf: u64, in_len: usize) -> R {
    let c: rdma_ucm_set_option = read(inbuf, in_len)?;
    let len = c.optlen as usize;
    if len > 4096 {
        return Err(libc::EINVAL);
    }
    let mut v = vec![0u8; len];
    read_bytes(c.optval, &mut v)?;
    let int = || -> R<i32> {
        let b: [u8; 4] = v.as_slice().try_into().map_err(|_| libc::EINVAL)?;
        Ok(i32::from_ne_bytes(b))
    };
    let byte = || -> R<u8> {
        match v.as_slice() {
            [b] => Ok(*b),
            _ => Err(libc::EINVAL),
        }
    };
    let opt = match (c.level, c.optname) {
        (option::LEVEL_ID, option::ID_TOS) => CmOption::Tos(byte()?),
        (option::LEVEL_ID, option::ID_REUSEADDR) => CmOption::ReuseAddr(int()? != 0),
        (option::LEVEL_ID, option::ID_AFONLY) => CmOption::AfOnly(int()? != 0),
        (option::LEVEL_ID, option::ID_ACK_TIMEOUT) => CmOption::AckTimeout(byte()?),
        (option::LEVEL_IB, option::IB_PATH) => {
            let n = size_of::<ib_path_rec_data>();
            if len == 0 || len % n != 0 {
                return Err(libc::EINVAL);
            }
            let recs = v
                .chunks_exact(n)
                .map(|ch| {
                    let mut rec = [0u8; PATH_RECORD_LEN];
                    rec.copy_from_slice(&ch[8..8 + PATH_RECORD_LEN]);
                    PathRecord::from_sa(&rec)
                })
                .collect();
            CmOption::IbPath(recs)
        }
        _ => return Err(libc::ENOSYS),
    };
    id_of(fd, c.id)?
        .set_option(&opt)
        .map_err(errno("rdma_set_option"))
}

fn migrate(fd: RawFd, file: &Arc<File>, inbuf: u64, in_len: usize, out_len: usize) -> R {
    let c: rdma_ucm_migrate_id = read(inbuf, in_len)?;
    let old = c.fd as RawFd;
    let id = id_of(old, c.id)?;
    id.migrate(&file.ch).map_err(errno("rdma_migrate_id"))?;
    let events = {
        let mut ids = state().ids.lock();
        let e = ids.get_mut(&c.id).ok_or(libc::ENOENT)?;
        e.file = fd;
        e.events
    };
    write(
        c.response,
        &rdma_ucm_destroy_id_resp {
            events_reported: events,
        },
        out_len,
    )
}

#[cfg(test)]
mod tests {
    use verbs_api::rdmacm::CmIdRef;

    use super::*;

    fn event(handle: u32, join: Option<u64>) -> CmEvent<SimCmId> {
        let mut ev = CmEvent::new(
            CmEventType::Disconnected,
            0,
            CmIdRef {
                handle,
                context: 0x10,
            },
        );
        if join.is_some() {
            ev.event = CmEventType::MulticastJoin;
            ev.mcast = join;
        }
        ev
    }

    /// An event taken off the channel after its id was destroyed (or its join left) is
    /// never handed over: librdmacm frees the id once the events `DESTROY_ID` counted are
    /// acknowledged, so a program thread reading it would touch freed memory.
    #[test]
    fn an_event_whose_id_or_join_went_meanwhile_is_dropped() {
        let st = State::default();
        let mut pending = vec![event(7, None), event(8, Some(9))].into_iter();
        let mut reads = 0;
        let r = take_event(3, &st, || {
            reads += 1;
            pending.next().ok_or(libc::EAGAIN)
        });
        assert_eq!(
            r.err(),
            Some(libc::EAGAIN),
            "no event of a destroyed id or a left join"
        );
        assert_eq!(reads, 3, "both events read and dropped, then the next waited for");
    }
}
