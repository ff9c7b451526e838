//! Address handles (`man ibv_create_ah`, `man ibv_destroy_ah`,
//! `man ibv_init_ah_from_wc`, `man ibv_create_ah_from_wc`), wired to the verbs-api
//! address handle: they work as soon as the sim creates them (with UD), and until then
//! the sim's EOPNOTSUPP is what the program gets.

use std::cell::UnsafeCell;
use std::ffi::c_int;

use verbs_api::{AhOf, Context as _, ProtectionDomain};

use crate::abi::{ibv_ah, ibv_ah_attr, ibv_context, ibv_gid, ibv_grh, ibv_pd, ibv_wc};
use crate::context::{self, Context};
use crate::ffi::{errno_of, errno_verb, minus_one_verb, ptr_verb, Errno};
use crate::live::{self, Kind, Object};
use crate::pd::{next_handle, Pd};
use crate::qp::ah_attr_from_c;
use crate::runtime::B;

/// `IBV_WC_GRH`
const IBV_WC_GRH: u32 = 1;

/// An address handle.
#[repr(C)]
pub struct Ah {
    /// What programs see, shared with them.
    pub c: UnsafeCell<ibv_ah>,
    /// The sim's address handle.
    pub sim: AhOf<B>,
    pd: *const Pd,
}

// SAFETY: `#[repr(C)]` with the `ibv_ah` first.
unsafe impl Object for Ah {
    const KIND: Kind = Kind::Ah;
    type C = ibv_ah;
}

impl Drop for Ah {
    fn drop(&mut self) {
        // SAFETY: the AH holds a count on its PD.
        unsafe { &*self.pd }.release();
    }
}

fn create(pd: *mut ibv_pd, attr: &ibv_ah_attr) -> Result<*mut ibv_ah, Errno> {
    // SAFETY: used within this call; the AH then holds a count.
    let p = unsafe { live::get::<Pd>(pd) }?;
    let sim = p
        .sim
        .create_ah(&ah_attr_from_c(attr))
        .map_err(|e| errno_of("ibv_create_ah", &e))?;
    p.hold();
    Ok(live::register(Box::new(Ah {
        c: UnsafeCell::new(ibv_ah {
            context: p.ctx().c_ptr(),
            pd,
            handle: next_handle(),
        }),
        sim,
        pd: p,
    })))
}

/// `ibv_create_ah`.
pub(crate) unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    ptr_verb("ibv_create_ah", || {
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the program passes a `struct ibv_ah_attr *`.
        create(pd, unsafe { &*attr })
    })
}

/// `ibv_destroy_ah`: 0 or EINVAL.
pub(crate) unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    errno_verb("ibv_destroy_ah", || {
        // SAFETY: no reference to the AH is in use.
        drop(unsafe { live::unregister::<Ah>(ah) }?);
        Ok(())
    })
}

/// The address vector that answers the sender of `wc` (and `grh`, when the completion
/// has one): its LID, SL and path bits, and with a GRH its GID as destination and the
/// index of the GID it was sent to as source. On RoCE v2 between IPv4 addresses the
/// 40 bytes in front of the payload are 20 unused ones and the packet's IPv4 header (rxe
/// copies it there), whose addresses are the GIDs' IPv4 and whose TOS and TTL are the
/// traffic class and hop limit; libibverbs' `ibv_init_ah_from_wc` tells the two apart
/// as [`ipv4_header`] does.
fn reply_av(ctx: &Context, port: u8, wc: &ibv_wc, grh: Option<&ibv_grh>) -> Result<ibv_ah_attr, Errno> {
    let mut a = ibv_ah_attr {
        dlid: wc.slid,
        sl: wc.sl,
        src_path_bits: wc.dlid_path_bits,
        port_num: port,
        ..Default::default()
    };
    if wc.wc_flags & IBV_WC_GRH != 0 {
        let grh = grh.ok_or(libc::EINVAL)?;
        let (to, from) = match ipv4_header(grh) {
            Some(ip) => {
                let mapped = |at: usize| {
                    let v4 = std::net::Ipv4Addr::new(ip[at], ip[at + 1], ip[at + 2], ip[at + 3]);
                    v4.to_ipv6_mapped().octets()
                };
                a.grh.traffic_class = ip[1];
                a.grh.hop_limit = ip[8];
                (mapped(16), mapped(12))
            }
            None => {
                let flow = u32::from_be(grh.version_tclass_flow);
                a.grh.flow_label = flow & 0xfffff;
                a.grh.traffic_class = (flow >> 20) as u8;
                a.grh.hop_limit = 0xff;
                (grh.dgid.raw, grh.sgid.raw)
            }
        };
        let len = ctx
            .sim
            .query_port(port)
            .map_err(|e| errno_of("ibv_init_ah_from_wc", &e))?
            .gid_tbl_len;
        let sgid_index = (0..len)
            .find(|i| ctx.sim.query_gid(port, *i).is_ok_and(|g| g.0 == to))
            .ok_or(libc::ENOENT)?;
        a.is_global = 1;
        a.grh.dgid = ibv_gid { raw: from };
        a.grh.sgid_index = u8::try_from(sgid_index).map_err(|_| libc::EINVAL)?;
    }
    Ok(a)
}

/// The IPv4 header in the GRH's place, if that is what `grh` holds: the first word is
/// not an IPv6 header's, or bytes 20..40 are an IPv4 header of 20 bytes whose checksum
/// holds (libibverbs' `get_grh_header_version`).
fn ipv4_header(grh: &ibv_grh) -> Option<[u8; 20]> {
    // SAFETY: `ibv_grh` is 40 bytes of plain data.
    let bytes: &[u8; 40] = unsafe { &*(grh as *const ibv_grh).cast() };
    let ip: [u8; 20] = bytes[20..].try_into().expect("20 bytes");
    if bytes[0] >> 4 != 6 {
        return (ip[0] >> 4 == 4).then_some(ip);
    }
    if ip[0] != 0x45 {
        return None;
    }
    let mut sum: u32 = ip
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    (sum == 0xffff).then_some(ip)
}

/// `ibv_init_ah_from_wc`: 0, or -1 with errno.
pub(crate) unsafe extern "C" fn ibv_init_ah_from_wc(
    ctx: *mut ibv_context,
    port: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    attr: *mut ibv_ah_attr,
) -> c_int {
    minus_one_verb("ibv_init_ah_from_wc", || {
        // SAFETY: used within this call only.
        let c = unsafe { context::get(ctx) }?;
        if wc.is_null() || attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the program passes its completion and (for one with a GRH) the GRH in
        // front of the receive buffer.
        let a = reply_av(c, port, unsafe { &*wc }, unsafe { grh.as_ref() })?;
        // SAFETY: the program passes a `struct ibv_ah_attr *`.
        unsafe { attr.write(a) };
        Ok(0)
    })
}

/// `ibv_create_ah_from_wc`.
pub(crate) unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    port: u8,
) -> *mut ibv_ah {
    ptr_verb("ibv_create_ah_from_wc", || {
        // SAFETY: used within this call only.
        let p = unsafe { live::get::<Pd>(pd) }?;
        if wc.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: as in `ibv_init_ah_from_wc`.
        let a = reply_av(p.ctx(), port, unsafe { &*wc }, unsafe { grh.as_ref() })?;
        create(pd, &a)
    })
}
