//! Between librdmacm's C structures and verbs-api's connection-manager types: socket
//! addresses, connection parameters, events' parameters and path records
//! (`rdma_cma.h`, `sa.h`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use rdma_sys::{ibv_path_data, ibv_sa_path_rec, rdma_cm_event, rdma_conn_param};
use verbs_api::rdmacm::sa::{PATH_FLAGS_PRIMARY, PATH_RECORD_LEN};
use verbs_api::rdmacm::{CmEventParam, CmEventType, ConnParam, PathRecord, UdParam};
use verbs_api::{Gid, Mtu};

/// A `struct sockaddr_storage` holding `addr`.
pub(super) fn to_sockaddr(addr: SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than sockaddr_in and suitably aligned.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
        }
    }
    ss
}

/// The address a `struct sockaddr` holds, `None` for an unset one (family 0) or a family
/// other than IPv4 and IPv6 (`AF_IB`).
///
/// # Safety
///
/// `sa` points to a socket address as large as its family says.
pub(super) unsafe fn from_sockaddr(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the caller's promise.
    match unsafe { (*sa).sa_family } as i32 {
        libc::AF_INET => {
            // SAFETY: an AF_INET address is a sockaddr_in.
            let sin = unsafe { &*(sa as *const libc::sockaddr_in) };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(sin.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 address is a sockaddr_in6.
            let sin6 = unsafe { &*(sa as *const libc::sockaddr_in6) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Whether `addr` is the wildcard address of its family.
pub(super) fn is_any(addr: &SocketAddr) -> bool {
    match addr.ip() {
        IpAddr::V4(a) => a.is_unspecified(),
        IpAddr::V6(a) => a.is_unspecified(),
    }
}

/// `param` as `struct rdma_conn_param`; its private data points into `param`, which must
/// outlive the result's use.
pub(super) fn conn_param_to_raw(param: &ConnParam) -> rdma_conn_param {
    rdma_conn_param {
        private_data: if param.private_data.is_empty() {
            std::ptr::null()
        } else {
            param.private_data.as_ptr().cast()
        },
        private_data_len: param.private_data.len().min(u8::MAX as usize) as u8,
        responder_resources: param.responder_resources,
        initiator_depth: param.initiator_depth,
        flow_control: param.flow_control,
        retry_count: param.retry_count,
        rnr_retry_count: param.rnr_retry_count,
        srq: param.srq as u8,
        qp_num: param.qp_num,
    }
}

/// The bytes of an event's private data.
///
/// # Safety
///
/// `p` is NULL or points to `len` readable bytes.
unsafe fn private_data(p: *const std::ffi::c_void, len: u8) -> Vec<u8> {
    if p.is_null() || len == 0 {
        return Vec::new();
    }
    // SAFETY: the caller's promise.
    unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len as usize) }.to_vec()
}

/// An event's parameters, copied out of librdmacm's event before it is acknowledged: a
/// UD id's request, establishment and unreachable events carry `param.ud`, the other
/// events of a connection `param.conn` (as `rdma_get_cm_event` fills them).
///
/// # Safety
///
/// `ev` is an event `rdma_get_cm_event` returned and not yet acknowledged.
pub(super) unsafe fn event_param(ev: &rdma_cm_event, kind: CmEventType, ud: bool) -> CmEventParam {
    use CmEventType::*;
    match kind {
        ConnectRequest | Established | Unreachable if ud => {
            // SAFETY: librdmacm fills `param.ud` for a UD id's events of these kinds.
            let u = unsafe { ev.param.ud };
            CmEventParam::Ud(UdParam {
                // SAFETY: librdmacm's event owns the private data until acknowledged.
                private_data: unsafe { private_data(u.private_data, u.private_data_len) },
                ah_attr: crate::qp::ah_from_raw(&u.ah_attr),
                qp_num: u.qp_num,
                qkey: u.qkey,
            })
        }
        MulticastJoin => {
            // SAFETY: librdmacm fills `param.ud` for a join's event; its private data
            // is the join's context, not bytes (`CmEvent::mcast`).
            let u = unsafe { ev.param.ud };
            CmEventParam::Ud(UdParam {
                private_data: Vec::new(),
                ah_attr: crate::qp::ah_from_raw(&u.ah_attr),
                qp_num: u.qp_num,
                qkey: u.qkey,
            })
        }
        ConnectRequest | ConnectResponse | ConnectError | Unreachable | Rejected | Established
        | Disconnected => {
            // SAFETY: librdmacm fills `param.conn` for a connected id's events.
            let c = unsafe { ev.param.conn };
            CmEventParam::Conn(ConnParam {
                // SAFETY: as above.
                private_data: unsafe { private_data(c.private_data, c.private_data_len) },
                responder_resources: c.responder_resources,
                initiator_depth: c.initiator_depth,
                flow_control: c.flow_control,
                retry_count: c.retry_count,
                rnr_retry_count: c.rnr_retry_count,
                srq: c.srq != 0,
                qp_num: c.qp_num,
                qkey: 0,
            })
        }
        _ => CmEventParam::None,
    }
}

/// A path record from librdmacm's route (network byte order fields to host order).
pub(super) fn path_from_raw(p: &ibv_sa_path_rec) -> PathRecord {
    PathRecord {
        // SAFETY: both union variants are plain bytes covering all 16 bytes.
        dgid: Gid(unsafe { p.dgid.raw }),
        // SAFETY: as above.
        sgid: Gid(unsafe { p.sgid.raw }),
        dlid: u16::from_be(p.dlid),
        slid: u16::from_be(p.slid),
        flow_label: u32::from_be(p.flow_label),
        hop_limit: p.hop_limit,
        traffic_class: p.traffic_class,
        reversible: p.reversible != 0,
        pkey: u16::from_be(p.pkey),
        sl: p.sl,
        mtu: Mtu::from_raw(p.mtu as u32).unwrap_or_default(),
        rate: p.rate,
        packet_life_time: p.packet_life_time,
        preference: p.preference,
    }
}

/// `RDMA_OPTION_IB_PATH`'s value for `recs`: a `struct ibv_path_data` per record, each
/// the route's primary path both ways (the flags the kernel takes; it uses the first
/// record with them), the record in the SA's layout.
pub(super) fn path_data(recs: &[PathRecord]) -> Vec<u8> {
    const ENTRY: usize = std::mem::size_of::<ibv_path_data>();
    const _: () = assert!(ENTRY == 8 + PATH_RECORD_LEN);
    let mut out = Vec::with_capacity(recs.len() * ENTRY);
    for p in recs {
        out.extend_from_slice(&PATH_FLAGS_PRIMARY.to_ne_bytes());
        out.extend_from_slice(&0u32.to_ne_bytes());
        // The service ID: the kernel computes its own from the id's port.
        out.extend_from_slice(&p.to_sa(0));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ib_path_option_is_one_primary_bidirectional_path_data_per_record() {
        let p = PathRecord {
            dgid: Gid([1; 16]),
            sgid: Gid([2; 16]),
            pkey: 0xffff,
            hop_limit: 64,
            mtu: Mtu::Mtu1024,
            ..PathRecord::default()
        };
        let v = path_data(&[p, p]);
        let entry = std::mem::size_of::<ibv_path_data>();
        assert_eq!(v.len(), 2 * entry);
        for e in v.chunks_exact(entry) {
            // SAFETY: `e` holds `size_of::<ibv_path_data>()` bytes; the structure is plain
            // integers and bytes, any value valid; read unaligned.
            let d: ibv_path_data = unsafe { std::ptr::read_unaligned(e.as_ptr().cast()) };
            assert_eq!(d.flags, PATH_FLAGS_PRIMARY);
            // SAFETY: plain bytes, as above.
            let rec: [u8; PATH_RECORD_LEN] = unsafe { std::mem::transmute_copy(&d.path) };
            assert_eq!(PathRecord::from_sa(&rec), p);
        }
    }
}
