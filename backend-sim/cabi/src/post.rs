//! Posting work requests (`man ibv_post_send`, `man ibv_post_recv`,
//! `man ibv_post_srq_recv`): the program's linked lists of `struct ibv_send_wr` and
//! `struct ibv_recv_wr` as the sim's work requests, reached through `ibv_context::ops`
//! by the header's inline functions.
//!
//! A list is posted in rounds of up to [`POST_BATCH`] WRs converted on the stack (no
//! allocation per post); their SGE arrays are read in place (`struct ibv_sge` and the
//! sim's `Sge` have one layout). When a WR is refused, the ones before it stay posted, `*bad_wr`
//! names it, and the error number is returned, as `man ibv_post_send` says. Inline data
//! is read in place, from whatever memory the program names, as an HCA reads it at post
//! time: the sim is handed the bytes (`SimQp::post_send_with_inline`), not SGEs that would
//! have to lie in registered memory.

use std::ffi::c_int;
use std::ops::Range;

use arrayvec::ArrayVec;
use verbs_api::{
    AddressHandle, BindMw, PostError, QueuePair, RecvWr, RemoteAddr, SendFlags, SendWr, Sge,
    SharedReceiveQueue, UdDest, WrOp,
};

use crate::abi::{ibv_qp, ibv_recv_wr, ibv_send_wr, ibv_sge, ibv_srq, IBV_SEND_IP_CSUM};
use crate::ah::Ah;
use crate::ffi::{errno_of, value_verb, Errno};
use crate::live;
use crate::qp::{Qp, POST_BATCH};
use crate::srq::Srq;

/// The most SGEs a WR may name here (more is EINVAL whatever the QP: twice the most a sim
/// WR may carry, 32, which the sim checks against `max_send_sge`), and the inline pieces
/// a round holds, so that a round holds at least two WRs of any size.
const ROUND_SGES: usize = 64;

/// `IBV_QPT_UD`
const IBV_QPT_UD: u32 = 4;

/// The operation of a send WR, from its opcode and the union member that opcode uses.
pub fn send_op(w: &ibv_send_wr) -> Result<WrOp, Errno> {
    let imm_data = u32::from_be(w.imm_data);
    // SAFETY: every member of the `wr` union is plain data, valid for any bits; the
    // opcode says which one the program filled.
    let (rdma, atomic) = unsafe { (w.wr.rdma, w.wr.atomic) };
    let rdma = RemoteAddr::new(rdma.remote_addr, rdma.rkey);
    let atomic_at = RemoteAddr::new(atomic.remote_addr, atomic.rkey);
    Ok(match w.opcode {
        0 => WrOp::RdmaWrite { remote: rdma },
        1 => WrOp::RdmaWriteWithImm {
            remote: rdma,
            imm_data,
        },
        2 => WrOp::Send,
        3 => WrOp::SendWithImm { imm_data },
        4 => WrOp::RdmaRead { remote: rdma },
        5 => WrOp::AtomicCmpAndSwp {
            remote: atomic_at,
            compare: atomic.compare_add,
            swap: atomic.swap,
        },
        6 => WrOp::AtomicFetchAndAdd {
            remote: atomic_at,
            add: atomic.compare_add,
        },
        // `invalidate_rkey` shares the union with `imm_data`, in host order.
        7 => WrOp::LocalInv { rkey: w.imm_data },
        8 => WrOp::BindMw,
        9 => WrOp::SendWithInv { rkey: w.imm_data },
        // TSO, ATOMIC_WRITE and unknown opcodes: the sim has no segmentation offload or
        // atomic write.
        _ => return Err(libc::EINVAL),
    })
}

/// `IBV_WR_BIND_MW`
const IBV_WR_BIND_MW: u32 = 8;

/// The window and binding of a BIND_MW WR (`wr.bind_mw`), `None` for another opcode.
///
/// # Safety
///
/// `w` must be a valid WR of the program, whose window and region (for a BIND_MW)
/// outlive the result.
unsafe fn bind_of<'a>(w: &'a ibv_send_wr) -> Result<Option<BindMw<'a>>, Errno> {
    if w.opcode != IBV_WR_BIND_MW {
        return Ok(None);
    }
    // SAFETY: the caller's contract.
    unsafe { crate::mw::bind_wr(w.tail.mw, w.tail.rkey, &w.tail.bind_info) }.map(Some)
}

/// `IBV_SEND_*` flags the sim knows; `IBV_SEND_IP_CSUM` (an offload of raw Ethernet and
/// UD checksums) has nothing to do.
pub fn send_flags(flags: u32) -> Result<SendFlags, Errno> {
    SendFlags::from_bits(flags & !IBV_SEND_IP_CSUM).ok_or(libc::EINVAL)
}

// `struct ibv_sge` and the sim's `Sge` have one layout (both `repr(C)`, the same fields
// in the same order), which `as_sges` relies on.
const _: () = {
    assert!(std::mem::size_of::<ibv_sge>() == std::mem::size_of::<Sge>());
    assert!(std::mem::align_of::<ibv_sge>() == std::mem::align_of::<Sge>());
    assert!(std::mem::offset_of!(ibv_sge, addr) == std::mem::offset_of!(Sge, addr));
    assert!(std::mem::offset_of!(ibv_sge, length) == std::mem::offset_of!(Sge, length));
    assert!(std::mem::offset_of!(ibv_sge, lkey) == std::mem::offset_of!(Sge, lkey));
};

/// A program's SGEs as the sim's, in place.
fn as_sges(list: &[ibv_sge]) -> &[Sge] {
    // SAFETY: the two types have the same size, alignment and field offsets (checked
    // above), and every bit pattern is valid for both (plain integers).
    unsafe { std::slice::from_raw_parts(list.as_ptr().cast::<Sge>(), list.len()) }
}

/// A program's SGE list as a slice.
///
/// # Safety
///
/// `sg_list` must point to `num_sge` SGEs (or `num_sge` be 0).
unsafe fn sges<'a>(sg_list: *const ibv_sge, num_sge: c_int) -> Result<&'a [ibv_sge], Errno> {
    match usize::try_from(num_sge) {
        Ok(0) => Ok(&[]),
        Ok(n) if !sg_list.is_null() => {
            // SAFETY: the caller's contract.
            Ok(unsafe { std::slice::from_raw_parts(sg_list, n) })
        }
        _ => Err(libc::EINVAL),
    }
}

/// Appends the pieces of an inline WR's data, in place in the program's memory, to
/// `out`; false (nothing appended) when the data is longer than the QP takes or a piece
/// is at address 0: the sim is then given the SGEs and refuses the WR (with its
/// profile's errno) without reading anything.
///
/// # Safety
///
/// Each SGE must name memory of the program readable for its length (its contract for
/// `IBV_SEND_INLINE`, which the HCA copies at post time whatever the lkey), not written
/// during the call.
unsafe fn inline_pieces<const N: usize>(
    list: &[ibv_sge],
    max_inline: usize,
    out: &mut ArrayVec<&[u8], N>,
) -> bool {
    let total: u64 = list.iter().map(|s| u64::from(s.length)).sum();
    if total > max_inline as u64 || list.iter().any(|s| s.length > 0 && s.addr == 0) {
        return false;
    }
    for s in list.iter().filter(|s| s.length > 0) {
        // SAFETY: the caller's contract; the total is at most `max_inline_data`.
        out.push(unsafe { std::slice::from_raw_parts(s.addr as *const u8, s.length as usize) });
    }
    true
}

/// One converted send WR of a round: its SGEs (read in place), or with `inline` its
/// data's pieces, the range `pieces` of the round's piece buffer.
struct Converted<'a> {
    wr_id: u64,
    op: WrOp,
    flags: SendFlags,
    sges: &'a [Sge],
    pieces: Range<usize>,
    inline: bool,
    ud: Option<UdDest<'a>>,
    bind: Option<BindMw<'a>>,
}

impl Converted<'_> {
    /// The WR for the sim, and its inline data's pieces.
    fn wr<'b>(&self, pieces: &'b [&'b [u8]]) -> (SendWr<'b>, Option<&'b [&'b [u8]]>)
    where
        Self: 'b,
    {
        let (sg_list, pieces): (&[Sge], _) = if self.inline {
            (&[], Some(&pieces[self.pieces.clone()]))
        } else {
            (self.sges, None)
        };
        let wr = SendWr {
            wr_id: self.wr_id,
            sg_list,
            op: self.op,
            send_flags: self.flags,
            ud: self.ud,
            bind: self.bind,
        };
        (wr, pieces)
    }
}

/// Converts the program's WR `w`, appending its inline pieces to the buffer; `Ok(None)`
/// when it has no room left for them.
///
/// # Safety
///
/// `w` must be a valid WR of the program.
unsafe fn convert<'a, const N: usize>(
    q: &Qp,
    w: &'a ibv_send_wr,
    piece_buf: &mut ArrayVec<&'a [u8], N>,
) -> Result<Option<Converted<'a>>, Errno> {
    let op = send_op(w)?;
    let flags = send_flags(w.send_flags)?;
    // SAFETY: the program's WR names its SGE array.
    let list = unsafe { sges(w.sg_list, w.num_sge) }?;
    // SAFETY: the program's WR names its window and region.
    let bind = unsafe { bind_of(w) }?;
    let ud = if q.qp_type == IBV_QPT_UD {
        // SAFETY: every member of the `wr` union is plain data.
        let u = unsafe { w.wr.ud };
        // SAFETY: the program passes an address handle of this library.
        let ah: &Ah = unsafe { live::get_fast::<Ah>(u.ah) }?;
        Some(UdDest {
            ah: &ah.sim as &dyn AddressHandle,
            remote_qpn: u.remote_qpn,
            remote_qkey: u.remote_qkey,
        })
    } else {
        None
    };
    if list.len() > ROUND_SGES {
        return Err(libc::EINVAL);
    }
    let inline = flags.contains(SendFlags::INLINE);
    if inline && list.len() > piece_buf.remaining_capacity() {
        return Ok(None);
    }
    let first_piece = piece_buf.len();
    // SAFETY: inline data is the program's readable memory (its contract for
    // IBV_SEND_INLINE).
    let read = inline && unsafe { inline_pieces(list, q.max_inline, piece_buf) };
    // Not inline, or inline data longer than the QP takes: the SGEs, which the sim checks
    // (and refuses in the second case).
    Ok(Some(Converted {
        wr_id: w.wr_id,
        op,
        flags,
        sges: as_sges(list),
        pieces: first_piece..piece_buf.len(),
        inline: read,
        ud,
        bind,
    }))
}

/// Inline pieces of a WR posted alone that [`post_send_rounds`] converts without setting
/// up rounds.
const FEW_PIECES: usize = 4;

/// Posts a list of send WRs; on failure, the WR that failed and why.
///
/// # Safety
///
/// `first` must be NULL or a valid list of the program's send WRs.
unsafe fn post_send_list(q: &Qp, first: *mut ibv_send_wr) -> Result<(), (*mut ibv_send_wr, Errno)> {
    // SAFETY: the caller's contract.
    if let Some(w) = unsafe { first.as_ref() } {
        if w.next.is_null()
            && q.qp_type != IBV_QPT_UD
            && w.send_flags & SendFlags::INLINE.bits() == 0
            && w.opcode != IBV_WR_BIND_MW
        {
            // A WR posted alone, as a bandwidth test posts each of millions (perftest's
            // default), without inline data, a UD destination or a window to bind: its
            // SGEs are read in place, nothing is copied.
            // SAFETY: the caller's contract.
            return unsafe { post_lone(q, w) }.map_err(|e| (first, e));
        }
    }
    // SAFETY: the caller's contract.
    unsafe { post_send_rounds(q, first) }
}

/// [`post_send_list`] for any list: a WR alone with inline data or a UD destination, or
/// in rounds of up to [`POST_BATCH`]. Out of line: its buffers make a stack frame of
/// kilobytes, which a lone WR's post need not set up.
///
/// # Safety
///
/// `first` must be NULL or a valid list of the program's send WRs.
#[inline(never)]
unsafe fn post_send_rounds(q: &Qp, first: *mut ibv_send_wr) -> Result<(), (*mut ibv_send_wr, Errno)> {
    // SAFETY: the caller's contract.
    if let Some(w) = unsafe { first.as_ref() } {
        if w.next.is_null() {
            // Alone, with inline data or a UD destination: no rounds, a small buffer.
            let mut piece_buf: ArrayVec<&[u8], FEW_PIECES> = ArrayVec::new();
            // SAFETY: the caller's contract.
            match unsafe { convert(q, w, &mut piece_buf) } {
                Ok(Some(c)) => {
                    let (wr, pieces) = c.wr(&piece_buf);
                    return q
                        .sim
                        .post_send_with_inline(std::slice::from_ref(&wr), std::slice::from_ref(&pieces))
                        .map_err(|e| post_failed("ibv_post_send", &[first], e));
                }
                // More inline pieces than the small buffer holds: in a round.
                Ok(None) => {}
                Err(e) => return Err((first, e)),
            }
        }
    }
    let mut cur = first;
    while !cur.is_null() {
        // Filled as WRs are converted (not cleared first).
        let mut piece_buf: ArrayVec<&[u8], ROUND_SGES> = ArrayVec::new();
        let mut ptrs: ArrayVec<*mut ibv_send_wr, POST_BATCH> = ArrayVec::new();
        let mut round: ArrayVec<Converted<'_>, POST_BATCH> = ArrayVec::new();
        let mut refused = None;
        while !cur.is_null() && !ptrs.is_full() {
            // SAFETY: the caller's contract: `cur` is a valid WR of the list.
            let w = unsafe { &*cur };
            // SAFETY: as above.
            match unsafe { convert(q, w, &mut piece_buf) } {
                Ok(Some(c)) => {
                    round.push(c);
                    ptrs.push(cur);
                    cur = w.next;
                }
                Ok(None) => break,
                Err(e) => {
                    refused = Some((cur, e));
                    break;
                }
            }
        }
        // Pushed in place: `collect` builds the array elsewhere and moves all of it
        // (every slot, used or not), a copy of kilobytes per `ibv_post_send`.
        let mut wrs: ArrayVec<SendWr<'_>, POST_BATCH> = ArrayVec::new();
        let mut inline: ArrayVec<Option<&[&[u8]]>, POST_BATCH> = ArrayVec::new();
        for c in &round {
            let (wr, pieces) = c.wr(&piece_buf);
            wrs.push(wr);
            inline.push(pieces);
        }
        if !wrs.is_empty() {
            q.sim
                .post_send_with_inline(&wrs, &inline)
                .map_err(|e| post_failed("ibv_post_send", &ptrs, e))?;
        }
        if let Some(r) = refused {
            return Err(r);
        }
    }
    Ok(())
}

/// Posts `w`, a WR alone without inline data or a UD destination, on `q`.
///
/// # Safety
///
/// `w` must be a valid WR of the program.
unsafe fn post_lone(q: &Qp, w: &ibv_send_wr) -> Result<(), Errno> {
    let op = send_op(w)?;
    let send_flags = send_flags(w.send_flags)?;
    // SAFETY: the program's WR names its SGE array.
    let list = unsafe { sges(w.sg_list, w.num_sge) }?;
    if list.len() > ROUND_SGES {
        return Err(libc::EINVAL);
    }
    let wr = SendWr {
        wr_id: w.wr_id,
        sg_list: as_sges(list),
        op,
        send_flags,
        ud: None,
        bind: None,
    };
    q.sim
        .post_send_with_inline(std::slice::from_ref(&wr), &[])
        .map_err(|e| errno_of("ibv_post_send", &e.error))
}

/// The WR of `ptrs` that the sim refused, and the errno of its refusal by `call`.
fn post_failed<T: Copy>(call: &'static str, ptrs: &[T], e: PostError) -> (T, Errno) {
    (ptrs[e.index], errno_of(call, &e.error))
}

/// Posts a list of receive WRs through `post` (for the verb `call`); on failure, the WR
/// that failed and why.
///
/// # Safety
///
/// `first` must be NULL or a valid list of the program's receive WRs.
unsafe fn post_recv_list(
    call: &'static str,
    first: *mut ibv_recv_wr,
    post: impl Fn(&[RecvWr<'_>]) -> Result<(), PostError>,
) -> Result<(), (*mut ibv_recv_wr, Errno)> {
    // SAFETY: the caller's contract.
    if let Some(w) = unsafe { first.as_ref() } {
        // SAFETY: the program's WR names its SGE array.
        match unsafe { sges(w.sg_list, w.num_sge) } {
            // A WR posted alone, as a receiver reposts one per completion: no rounds.
            Ok(list) if w.next.is_null() && list.len() <= ROUND_SGES => {
                return post(&[RecvWr::new(w.wr_id, as_sges(list))])
                    .map_err(|e| post_failed(call, &[first], e));
            }
            Ok(_) => {}
            Err(e) => return Err((first, e)),
        }
    }
    let mut cur = first;
    while !cur.is_null() {
        let mut ptrs: ArrayVec<*mut ibv_recv_wr, POST_BATCH> = ArrayVec::new();
        let mut wrs: ArrayVec<RecvWr<'_>, POST_BATCH> = ArrayVec::new();
        let mut refused = None;
        while !cur.is_null() && !ptrs.is_full() {
            // SAFETY: the caller's contract: `cur` is a valid WR of the list.
            let w = unsafe { &*cur };
            // SAFETY: the program's WR names its SGE array.
            let list = match unsafe { sges(w.sg_list, w.num_sge) } {
                Ok(l) if l.len() <= ROUND_SGES => l,
                Ok(_) | Err(_) => {
                    refused = Some((cur, libc::EINVAL));
                    break;
                }
            };
            wrs.push(RecvWr::new(w.wr_id, as_sges(list)));
            ptrs.push(cur);
            cur = w.next;
        }
        if !wrs.is_empty() {
            post(&wrs).map_err(|e| post_failed(call, &ptrs, e))?;
        }
        if let Some(r) = refused {
            return Err(r);
        }
    }
    Ok(())
}

/// Stores the failed WR in `*bad` (when the program gave a place) and returns the error
/// number.
///
/// # Safety
///
/// `bad` must be NULL or valid for a write.
unsafe fn report<T>(r: Result<(), (*mut T, Errno)>, bad: *mut *mut T) -> c_int {
    match r {
        Ok(()) => 0,
        Err((wr, e)) => {
            if !bad.is_null() {
                // SAFETY: the caller's contract.
                unsafe { *bad = wr };
            }
            e
        }
    }
}

/// `ops.post_send` (what the inline `ibv_post_send` calls).
pub(crate) unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    value_verb("ibv_post_send", libc::EIO, || {
        // SAFETY: the data path trusts the program's QP pointer, as libibverbs does.
        let r = match unsafe { live::get_fast::<Qp>(qp.cast()) } {
            // SAFETY: the program passes its WR list.
            Ok(q) => unsafe { post_send_list(q, wr) },
            Err(e) => Err((wr, e)),
        };
        // SAFETY: the program passes a `struct ibv_send_wr **` (or NULL).
        unsafe { report(r, bad) }
    })
}

/// `ops.post_recv` (what the inline `ibv_post_recv` calls).
pub(crate) unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    value_verb("ibv_post_recv", libc::EIO, || {
        // SAFETY: the data path trusts the program's QP pointer, as libibverbs does.
        let r = match unsafe { live::get_fast::<Qp>(qp.cast()) } {
            // SAFETY: the program passes its WR list.
            Ok(q) => unsafe { post_recv_list("ibv_post_recv", wr, |w| q.sim.post_recv(w)) },
            Err(e) => Err((wr, e)),
        };
        // SAFETY: the program passes a `struct ibv_recv_wr **` (or NULL).
        unsafe { report(r, bad) }
    })
}

/// `ops.post_srq_recv` (what the inline `ibv_post_srq_recv` calls).
pub(crate) unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    value_verb("ibv_post_srq_recv", libc::EIO, || {
        // SAFETY: the data path trusts the program's SRQ pointer, as libibverbs does.
        let r = match unsafe { live::get_fast::<Srq>(srq) } {
            // SAFETY: the program passes its WR list.
            Ok(s) => unsafe { post_recv_list("ibv_post_srq_recv", wr, |w| s.sim.post_recv(w)) },
            Err(e) => Err((wr, e)),
        };
        // SAFETY: the program passes a `struct ibv_recv_wr **` (or NULL).
        unsafe { report(r, bad) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::{ibv_mw_bind_info, ibv_send_wr_tail, ibv_send_wr_wr, ibv_wr_atomic, ibv_wr_rdma};

    fn wr(opcode: u32, wr: ibv_send_wr_wr) -> ibv_send_wr {
        ibv_send_wr {
            wr_id: 1,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
            opcode,
            send_flags: 0,
            imm_data: 0x0102_0304u32.to_be(),
            wr,
            remote_srqn: 0,
            tail: ibv_send_wr_tail {
                mw: std::ptr::null_mut(),
                rkey: 0,
                bind_info: ibv_mw_bind_info {
                    mr: std::ptr::null_mut(),
                    addr: 0,
                    length: 0,
                    mw_access_flags: 0,
                },
            },
        }
    }

    #[test]
    fn opcodes_and_their_union_members() {
        let rdma = ibv_send_wr_wr {
            rdma: ibv_wr_rdma {
                remote_addr: 0x1000,
                rkey: 9,
            },
        };
        let at = RemoteAddr::new(0x1000, 9);
        assert_eq!(send_op(&wr(0, rdma)), Ok(WrOp::RdmaWrite { remote: at }));
        assert_eq!(
            send_op(&wr(1, rdma)),
            Ok(WrOp::RdmaWriteWithImm {
                remote: at,
                imm_data: 0x0102_0304
            }),
            "immediate data from network order"
        );
        assert_eq!(send_op(&wr(2, rdma)), Ok(WrOp::Send));
        assert_eq!(send_op(&wr(4, rdma)), Ok(WrOp::RdmaRead { remote: at }));
        let atomic = ibv_send_wr_wr {
            atomic: ibv_wr_atomic {
                remote_addr: 0x2000,
                compare_add: 5,
                swap: 6,
                rkey: 11,
            },
        };
        let at = RemoteAddr::new(0x2000, 11);
        assert_eq!(
            send_op(&wr(5, atomic)),
            Ok(WrOp::AtomicCmpAndSwp {
                remote: at,
                compare: 5,
                swap: 6
            })
        );
        assert_eq!(
            send_op(&wr(6, atomic)),
            Ok(WrOp::AtomicFetchAndAdd { remote: at, add: 5 })
        );
        // LOCAL_INV and SEND_WITH_INV take `invalidate_rkey` as it is (host order).
        let mut inv = wr(7, rdma);
        inv.imm_data = 0xabcd_ef01;
        assert_eq!(send_op(&inv), Ok(WrOp::LocalInv { rkey: 0xabcd_ef01 }));
        inv.opcode = 9;
        assert_eq!(send_op(&inv), Ok(WrOp::SendWithInv { rkey: 0xabcd_ef01 }));
        assert_eq!(send_op(&wr(8, rdma)), Ok(WrOp::BindMw));
        // TSO, ATOMIC_WRITE, unknown.
        for op in [10, 15, 99] {
            assert_eq!(send_op(&wr(op, rdma)), Err(libc::EINVAL), "opcode {op}");
        }
    }

    #[test]
    fn send_flags_ignore_ip_csum_and_refuse_unknown_bits() {
        assert_eq!(
            send_flags(0b1111 | IBV_SEND_IP_CSUM),
            Ok(SendFlags::FENCE | SendFlags::SIGNALED | SendFlags::SOLICITED | SendFlags::INLINE)
        );
        assert_eq!(send_flags(1 << 7), Err(libc::EINVAL));
    }
}
