//! The verbs context of a capture, as the events between its packets: WRs posted
//! (`wr_id`, opcode, length), completions (status, `vendor_err`), QP state changes,
//! connections set up and lost, and the faults injected. Each writer is called only
//! when the device captures (the caller's one check of its slot).

use std::fmt::Write as _;

use verbs_api::{RecvWr, SendWr, WcStatus, WorkCompletion};

use super::Capture;

/// WRs posted to the send queue of QP `qpn`, with the inline pieces the C library
/// passed beside them (a WR's length is its inline data's then). An RDMA or atomic WR
/// names its remote address and rkey, which its RETH or AtomicETH carries on the wire.
pub fn posted_sends(cap: &Capture, qpn: u32, wrs: &[SendWr<'_>], inline: &[Option<&[&[u8]]>]) {
    for (i, wr) in wrs.iter().enumerate() {
        let len: u64 = match inline.get(i).copied().flatten() {
            Some(pieces) => pieces.iter().map(|p| p.len() as u64).sum(),
            None => wr.sg_list.iter().map(|s| s.length as u64).sum(),
        };
        let mut t = format!(
            "QP {qpn:#x}: post_send wr_id {:#x} {:?} length {len}",
            wr.wr_id,
            wr.op.opcode()
        );
        if let Some(r) = wr.op.remote() {
            let _ = write!(t, " remote {:#x} rkey {:#x}", r.addr, r.rkey);
        }
        if wr.send_flags.contains(verbs_api::SendFlags::SIGNALED) {
            t.push_str(" signaled");
        }
        cap.note(&t);
    }
}

/// WRs posted to the receive queue of QP `qpn`.
pub fn posted_recvs(cap: &Capture, qpn: u32, wrs: &[RecvWr<'_>]) {
    for wr in wrs {
        let len: u64 = wr.sg_list.iter().map(|s| s.length as u64).sum();
        cap.note(&format!(
            "QP {qpn:#x}: post_recv wr_id {:#x} length {len}",
            wr.wr_id
        ));
    }
}

/// Completions about to reach their CQ.
pub fn completions<'a>(cap: &Capture, wcs: impl Iterator<Item = &'a WorkCompletion>) {
    for wc in wcs {
        let mut t = format!(
            "QP {:#x}: completion wr_id {:#x} {:?} status {:?}",
            wc.qp_num, wc.wr_id, wc.opcode, wc.status
        );
        if wc.status == WcStatus::Success {
            let _ = write!(t, " byte_len {}", wc.byte_len);
        } else {
            let _ = write!(t, " vendor_err {}", wc.vendor_err);
        }
        cap.note(&t);
    }
}

/// QP `qpn` moved from state `from` to `to`.
pub fn state(cap: &Capture, qpn: u32, from: verbs_api::QpState, to: verbs_api::QpState) {
    cap.note(&format!("QP {qpn:#x}: state {from:?} -> {to:?}"));
}

/// Something happened to QP `qpn`'s connection or was injected into it: `what` says.
pub fn qp(cap: &Capture, qpn: u32, what: std::fmt::Arguments<'_>) {
    cap.note(&format!("QP {qpn:#x}: {what}"));
}
