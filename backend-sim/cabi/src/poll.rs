//! Taking completions (`man ibv_poll_cq`, `man ibv_create_cq_ex` for `ibv_start_poll`,
//! `ibv_next_poll`, `ibv_end_poll` and the `ibv_wc_read_*` accessors): the sim's
//! completions in `struct ibv_wc`. A poll that finds the CQ empty drives the sim's
//! progress on the polling thread, so a C program spinning on `ibv_poll_cq` is what moves
//! its messages, as on an HCA.

use std::ffi::c_int;

use verbs_api::{CompletionQueue, WcFlags, WorkCompletion};

use crate::abi::{ibv_cq, ibv_cq_ex, ibv_poll_cq_attr, ibv_wc, ibv_wc_tm_info};
use crate::cq::Cq;
use crate::ffi::{errno_of, value_verb, Errno};
use crate::live;

/// The union of `imm_data` and `invalidated_rkey` as `struct ibv_wc` holds it: immediate
/// data (`IBV_WC_WITH_IMM`) in network byte order, else the rkey a SEND_WITH_INV
/// invalidated in host order (`ibv_wc_read_invalidated_rkey` returns `read_imm_data` as
/// it is), whichever flag the profile's device marks it with (`IBV_WC_WITH_INV`, or
/// rxe's `IBV_WC_IP_CSUM_OK`), and 0 for neither.
fn imm_or_rkey(w: &WorkCompletion) -> u32 {
    if w.wc_flags.contains(WcFlags::WITH_IMM) {
        w.imm_data.to_be()
    } else {
        w.imm_data
    }
}

/// A sim completion as `struct ibv_wc`.
pub fn wc_to_c(w: &WorkCompletion) -> ibv_wc {
    ibv_wc {
        wr_id: w.wr_id,
        status: w.status as u32,
        opcode: w.opcode as u32,
        vendor_err: w.vendor_err,
        byte_len: w.byte_len,
        imm_data: imm_or_rkey(w),
        qp_num: w.qp_num,
        src_qp: w.src_qp,
        wc_flags: w.wc_flags.bits(),
        pkey_index: w.pkey_index,
        slid: w.slid,
        sl: w.sl,
        dlid_path_bits: w.dlid_path_bits,
    }
}

/// Polls up to `n` completions of `q` into the program's array `out`, each written as a
/// `struct ibv_wc` as the sim hands it over (no buffer in between).
///
/// # Safety
///
/// `out` must have room for `n` entries.
unsafe fn poll(q: &Cq, n: usize, out: *mut ibv_wc) -> Result<usize, Errno> {
    let mut done = 0;
    q.sim
        .poll_each(n, |w| {
            // The sim hands over at most `n`; the check keeps the write below inside the
            // program's array whatever it does.
            debug_assert!(done < n, "the sim handed over more than {n} completions");
            if done < n {
                // SAFETY: the program's array holds `n` entries, and done < n.
                unsafe { out.add(done).write(wc_to_c(w)) };
                done += 1;
            }
        })
        .map_err(|e| errno_of("ibv_poll_cq", &e))?;
    Ok(done)
}

/// `ops.poll_cq` (what the inline `ibv_poll_cq` calls): how many completions were
/// written, or a negative error number (`-EOVERFLOW` for a CQ that overran).
pub(crate) unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    value_verb("ibv_poll_cq", -libc::EIO, || {
        // SAFETY: the data path trusts the program's CQ pointer, as libibverbs does.
        let q = match unsafe { live::get_fast::<Cq>(cq.cast()) } {
            Ok(q) => q,
            Err(e) => return -e,
        };
        let Ok(n) = usize::try_from(num_entries) else {
            return -libc::EINVAL;
        };
        if n > 0 && wc.is_null() {
            return -libc::EINVAL;
        }
        // SAFETY: the program passes an array of `num_entries` entries (checked non-NULL
        // when it asks for any).
        match unsafe { poll(q, n, wc) } {
            Ok(got) => got as c_int,
            Err(e) => -e,
        }
    })
}

/// The CQ of an `ibv_cq_ex *` on the polling path.
///
/// # Safety
///
/// `cq` must be NULL or a live CQ of this library.
unsafe fn cq_of<'a>(cq: *mut ibv_cq_ex) -> Option<&'a Cq> {
    // SAFETY: forwarded contract.
    unsafe { live::get_fast::<Cq>(cq) }.ok()
}

/// Takes one completion into `current` and the `wr_id`/`status` fields: 0, ENOENT when
/// the CQ is empty, or an error number.
fn take_one(q: &Cq) -> c_int {
    let mut one = [WorkCompletion::default()];
    match q.sim.poll(&mut one) {
        Ok(0) => libc::ENOENT,
        Ok(_) => {
            // SAFETY: the C part is ours to write; the program reads these fields after
            // this call returns, on the thread that polls (`man ibv_create_cq_ex`: one
            // poller between start and end).
            unsafe {
                (*q.c.get()).wr_id = one[0].wr_id;
                (*q.c.get()).status = one[0].status as u32;
            }
            *q.current.lock() = one[0];
            0
        }
        Err(e) => errno_of("ibv_start_poll", &e),
    }
}

unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    value_verb("ibv_start_poll", libc::EIO, || {
        // SAFETY: the program passes its CQ.
        let Some(q) = (unsafe { cq_of(cq) }) else {
            return libc::EINVAL;
        };
        // SAFETY: the program passes a `struct ibv_poll_cq_attr *`.
        if attr.is_null() || unsafe { (*attr).comp_mask } != 0 {
            return libc::EINVAL;
        }
        take_one(q)
    })
}

unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    value_verb("ibv_next_poll", libc::EIO, || {
        // SAFETY: the program passes its CQ.
        match unsafe { cq_of(cq) } {
            Some(q) => take_one(q),
            None => libc::EINVAL,
        }
    })
}

unsafe extern "C" fn end_poll(_cq: *mut ibv_cq_ex) {}

/// Reads a field of the current completion.
///
/// # Safety
///
/// `cq` must be NULL or a live CQ of this library.
unsafe fn read<T: Default>(cq: *mut ibv_cq_ex, f: impl FnOnce(&WorkCompletion) -> T) -> T {
    // SAFETY: forwarded contract.
    match unsafe { cq_of(cq) } {
        Some(q) => f(&q.current.lock()),
        None => T::default(),
    }
}

unsafe extern "C" fn read_opcode(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the program passes its CQ.
    unsafe { read(cq, |w| w.opcode as u32) }
}
unsafe extern "C" fn read_vendor_err(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the program passes its CQ.
    unsafe { read(cq, |w| w.vendor_err) }
}
unsafe extern "C" fn read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the program passes its CQ.
    unsafe { read(cq, |w| w.byte_len) }
}
unsafe extern "C" fn read_imm_data(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the program passes its CQ.
    unsafe { read(cq, imm_or_rkey) }
}
unsafe extern "C" fn read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the program passes its CQ.
    unsafe { read(cq, |w| w.qp_num) }
}
unsafe extern "C" fn read_src_qp(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the program passes its CQ.
    unsafe { read(cq, |w| w.src_qp) }
}
unsafe extern "C" fn read_wc_flags(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the program passes its CQ.
    unsafe { read(cq, |w| w.wc_flags.bits()) }
}
unsafe extern "C" fn read_slid(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the program passes its CQ.
    unsafe { read(cq, |w| w.slid as u32) }
}
unsafe extern "C" fn read_sl(cq: *mut ibv_cq_ex) -> u8 {
    // SAFETY: the program passes its CQ.
    unsafe { read(cq, |w| w.sl) }
}
unsafe extern "C" fn read_dlid_path_bits(cq: *mut ibv_cq_ex) -> u8 {
    // SAFETY: the program passes its CQ.
    unsafe { read(cq, |w| w.dlid_path_bits) }
}
/// Fields a CQ cannot be created with (timestamps, VLAN, flow tag): 0.
unsafe extern "C" fn read_zero_u64(_cq: *mut ibv_cq_ex) -> u64 {
    0
}
unsafe extern "C" fn read_zero_u32(_cq: *mut ibv_cq_ex) -> u32 {
    0
}
unsafe extern "C" fn read_zero_u16(_cq: *mut ibv_cq_ex) -> u16 {
    0
}
unsafe extern "C" fn read_tm_info(_cq: *mut ibv_cq_ex, info: *mut ibv_wc_tm_info) {
    if !info.is_null() {
        // SAFETY: the program passes a `struct ibv_wc_tm_info *`.
        unsafe { info.write(ibv_wc_tm_info { tag: 0, priv_: 0 }) };
    }
}

/// A CQ's C part: `cq` followed by the extended polling interface.
pub fn cq_ex(cq: ibv_cq) -> ibv_cq_ex {
    ibv_cq_ex {
        cq,
        comp_mask: 0,
        status: 0,
        wr_id: 0,
        start_poll: Some(start_poll),
        next_poll: Some(next_poll),
        end_poll: Some(end_poll),
        read_opcode: Some(read_opcode),
        read_vendor_err: Some(read_vendor_err),
        read_byte_len: Some(read_byte_len),
        read_imm_data: Some(read_imm_data),
        read_qp_num: Some(read_qp_num),
        read_src_qp: Some(read_src_qp),
        read_wc_flags: Some(read_wc_flags),
        read_slid: Some(read_slid),
        read_sl: Some(read_sl),
        read_dlid_path_bits: Some(read_dlid_path_bits),
        read_completion_ts: Some(read_zero_u64),
        read_cvlan: Some(read_zero_u16),
        read_flow_tag: Some(read_zero_u32),
        read_tm_info: Some(read_tm_info),
        read_completion_wallclock_ns: Some(read_zero_u64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use verbs_api::{WcFlags, WcOpcode, WcStatus};

    #[test]
    fn completion_fields_and_byte_order() {
        let w = WorkCompletion {
            wr_id: 7,
            status: WcStatus::RemAccessErr,
            opcode: WcOpcode::RecvRdmaWithImm,
            vendor_err: 0x101,
            byte_len: 64,
            imm_data: 0x0102_0304,
            qp_num: 0x12345,
            wc_flags: WcFlags::WITH_IMM,
            ..Default::default()
        };
        let c = wc_to_c(&w);
        assert_eq!((c.wr_id, c.status, c.opcode, c.vendor_err), (7, 10, 129, 0x101));
        assert_eq!(
            c.imm_data.to_ne_bytes(),
            [1, 2, 3, 4],
            "immediate data in network order"
        );
        assert_eq!((c.qp_num, c.wc_flags, c.byte_len), (0x12345, 2, 64));
    }
}
