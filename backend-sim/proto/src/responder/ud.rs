//! The responder of a UD QP (IBA 9.8.4 "Unreliable datagram service", 10.2.5 "Q_Keys",
//! 8.3 "Global route header"; `man ibv_post_recv`, `man ibv_poll_cq`): datagrams from any
//! QP of any device, each taken whole into one receive, or dropped without a word.
//!
//! - The datagram's Q_Key must be the QP's; otherwise it is dropped and the port's
//!   `qkey_viol_cntr` counts it ([`UdOutcome::QkeyViolation`]; rxe's `check_keys()`).
//! - It takes the oldest receive, of the QP's own queue or its SRQ; with none it is
//!   dropped ([`UdOutcome::NoReceive`]), counted by the driver (rxe drops it and counts
//!   nothing).
//! - The first 40 bytes of the receive take the GRH, the payload starts at byte 40, and
//!   `byte_len` is 40 plus the payload. The sim's port is an InfiniBand port, where a
//!   packet has a GRH only when its sender's address handle had one (`is_global`): then
//!   the 40 bytes hold it (IP version 6, the sender's traffic class and flow label, the
//!   payload length as IBA counts it, next header 0x1B, the hop limit, the source GID of
//!   the link the datagram came on and the destination GID it names) and the completion
//!   has `IBV_WC_GRH`; otherwise the 40 bytes are left as they were and the flag is not
//!   set. (rxe, a RoCE device, always writes them, an IPv4 or IPv6 header, and always
//!   sets the flag.)
//! - A receive too short for 40 bytes plus the payload completes with
//!   `IBV_WC_LOC_LEN_ERR`, nothing is written, and the QP stays as it is (IBA; mlx5).
//!   (rxe completes it with `IBV_WC_LOC_QP_OP_ERR` and moves the QP to ERR:
//!   `copy_data()` fails, then `RESPST_ERR_MALFORMED_WQE`.) A receive with a bad lkey is
//!   the QP's own error: `IBV_WC_LOC_PROT_ERR`, and the QP goes to ERR.
//! - The completion names the sender: `src_qp` (its QP), `slid` (its device's LID, the
//!   one its link proved), `sl` 0, `pkey_index` 0; `qp_num` is this QP's, also with an
//!   SRQ.

use verbs_api::{WcFlags, WcOpcode, WcStatus, WorkCompletion};

use super::place::Unplaced;
use super::Responder;
use crate::memory::{MrTable, Seg};
use crate::requester::Fatal;
use crate::wire::{Frame, Grh, GRH_LEN};

/// Where a datagram came from, as the link it arrived on proved it (never as the frame
/// says): the sending device's GID and LID.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DatagramSource {
    /// The sending device's IP GID (the GRH's source GID, or what its default GID is
    /// made of: [`Grh::src_default`]).
    pub gid: [u8; 16],
    /// The sending device's LID (the completion's `slid`).
    pub lid: u16,
}

/// What became of a datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UdOutcome {
    /// Taken into a receive (which completed successfully).
    Received,
    /// Its receive was too short: completed with `IBV_WC_LOC_LEN_ERR`, nothing written.
    TooLong,
    /// Dropped: its Q_Key is not the QP's (the port's `qkey_viol_cntr` counts these).
    QkeyViolation,
    /// Dropped: no receive posted.
    NoReceive,
    /// Not a datagram, or a payload not of its length (the driver never hands such
    /// over).
    Malformed,
}

impl Responder {
    /// The same as the responder of a UD QP.
    pub fn datagram(mut self) -> Self {
        self.ud = true;
        self
    }

    /// Datagram `frame` with its `payload`, from `src`, arrived for this QP (which is in
    /// a state that receives). Its receive's completion goes to `out`. `Err`: the QP must
    /// go to ERR (its receive completed with the error).
    pub fn on_datagram(
        &mut self,
        frame: &Frame,
        payload: &[u8],
        src: &DatagramSource,
        mrs: &MrTable,
        out: &mut Vec<(WorkCompletion, bool)>,
    ) -> Result<UdOutcome, Fatal> {
        let Frame::Datagram {
            len,
            src_qpn,
            qkey,
            imm,
            solicited,
            grh,
            ..
        } = *frame
        else {
            return Ok(UdOutcome::Malformed);
        };
        if payload.len() != len as usize {
            return Ok(UdOutcome::Malformed);
        }
        if qkey != self.qkey {
            tracing::debug!(
                qpn = self.qpn,
                src_qpn,
                qkey = %format_args!("{qkey:#x}"),
                own = %format_args!("{:#x}", self.qkey),
                "UD: datagram dropped: wrong Q_Key"
            );
            return Ok(UdOutcome::QkeyViolation);
        }
        if !self.take_recv() {
            tracing::debug!(qpn = self.qpn, src_qpn, "UD: datagram dropped: no receive posted");
            return Ok(UdOutcome::NoReceive);
        }
        let byte_len = GRH_LEN + payload.len();
        let segs = match self.place(byte_len as u64, mrs, out) {
            Ok(segs) => segs,
            Err(Unplaced::TooLong { room }) => {
                tracing::debug!(
                    qpn = self.qpn,
                    src_qpn,
                    len = byte_len,
                    room,
                    "UD: receive too short for the GRH and the payload (LOC_LEN_ERR)"
                );
                return Ok(UdOutcome::TooLong);
            }
            Err(e) => return Err(Fatal(e.status())),
        };
        let mut written = match grh {
            Some(g) if self.roce => scatter(&segs, 0, &roce_ip_header(&g, src, payload.len(), imm.is_some())),
            Some(g) => scatter(&segs, 0, &grh_bytes(&g, src, payload.len(), imm.is_some())),
            None => true,
        };
        written &= scatter(&segs, GRH_LEN, payload);
        self.unplace(segs);
        if !written {
            // A receive buffer deregistered while the datagram was copied in.
            self.fail_recv(WcStatus::LocProtErr, out);
            return Err(Fatal(WcStatus::LocProtErr));
        }
        self.taken = None;
        let mut wc = self.recv_completion(self.wqe.wr_id, WcStatus::Success);
        wc.opcode = WcOpcode::Recv;
        wc.byte_len = byte_len as u32;
        wc.src_qp = src_qpn;
        wc.slid = src.lid;
        if let Some(imm) = imm {
            wc.imm_data = imm;
            wc.wc_flags |= WcFlags::WITH_IMM;
        }
        if grh.is_some() {
            wc.wc_flags |= WcFlags::GRH;
        }
        out.push((wc, solicited));
        Ok(UdOutcome::Received)
    }
}

/// Writes `bytes` at byte `at` of the scatter list `segs` (which holds them: checked by
/// the caller). False if a region was deregistered meanwhile.
fn scatter(segs: &[Seg], at: usize, bytes: &[u8]) -> bool {
    let (mut skip, mut rest, mut ok) = (at, bytes, true);
    for s in segs {
        if rest.is_empty() {
            break;
        }
        if skip >= s.len {
            skip -= s.len;
            continue;
        }
        let n = rest.len().min(s.len - skip);
        ok &= s.copy_in(skip, &rest[..n]);
        rest = &rest[n..];
        skip = 0;
    }
    ok
}

/// Bytes of IBA's transport headers and trailer that the GRH's payload length counts
/// around a UD SEND's payload: the BTH (12), the DETH (8) and the ICRC (4).
const UD_TRANSPORT_BYTES: usize = 12 + 8 + 4;

/// What a RoCE v2 device (rxe) writes in the receive's first 40 bytes instead of an IB
/// GRH: the IP header of the packet. Between IPv4-mapped GIDs, 20 zero bytes and the
/// IPv4 header (version 4, IHL 5, the total length of IP, UDP (8), the IB transport
/// headers and the payload, the hop limit as TTL, protocol UDP (17), the source and
/// destination addresses; rxe_resp.c `execute()` copies the received header there);
/// otherwise the IPv6 header, which has the GRH's layout with next header UDP.
pub fn roce_ip_header(g: &Grh, src: &DatagramSource, len: usize, imm: bool) -> [u8; GRH_LEN] {
    let v4 = |gid: &[u8; 16]| std::net::Ipv6Addr::from(*gid).to_ipv4_mapped();
    let transport = UD_TRANSPORT_BYTES + if imm { 4 } else { 0 } + len.next_multiple_of(4);
    match (v4(&source_gid(g, src)), v4(&g.dgid)) {
        (Some(s), Some(d)) => {
            let mut h = [0u8; GRH_LEN];
            let ip = &mut h[20..];
            ip[0] = 0x45;
            ip[1] = g.traffic_class;
            let total = (20 + 8 + transport) as u16;
            ip[2..4].copy_from_slice(&total.to_be_bytes());
            ip[8] = g.hop_limit;
            ip[9] = 17;
            ip[12..16].copy_from_slice(&s.octets());
            ip[16..20].copy_from_slice(&d.octets());
            let mut sum = 0u32;
            for w in ip.chunks(2) {
                sum += u16::from_be_bytes([w[0], w[1]]) as u32;
            }
            while sum > 0xffff {
                sum = (sum & 0xffff) + (sum >> 16);
            }
            ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
            h
        }
        _ => {
            let mut h = grh_bytes(g, src, len, imm);
            h[4..6].copy_from_slice(&((8 + transport) as u16).to_be_bytes());
            h[6] = 17;
            h
        }
    }
}

/// The 40-byte GRH (IBA 8.3.1) of a datagram of `len` payload bytes with the fields of
/// `g`, from `src`: IPVer 6, TClass, FlowLabel, PayLen (the bytes after the GRH up to the
/// ICRC: BTH, DETH, ImmDt, the payload padded to 4 bytes, ICRC), NxtHdr 0x1B (an IBA
/// transport header follows), HopLmt, SGID, DGID; big-endian, as on the wire.
pub fn grh_bytes(g: &Grh, src: &DatagramSource, len: usize, imm: bool) -> [u8; GRH_LEN] {
    let mut h = [0u8; GRH_LEN];
    let word = (6u32 << 28) | ((g.traffic_class as u32) << 20) | (g.flow_label & 0xf_ffff);
    h[0..4].copy_from_slice(&word.to_be_bytes());
    let pay_len = UD_TRANSPORT_BYTES + if imm { 4 } else { 0 } + len.next_multiple_of(4);
    h[4..6].copy_from_slice(&(pay_len as u16).to_be_bytes());
    h[6] = 0x1b;
    h[7] = g.hop_limit;
    h[8..24].copy_from_slice(&source_gid(g, src));
    h[24..40].copy_from_slice(&g.dgid);
    h
}

/// The datagram's source GID: the sending device's default GID or the GID of its IP
/// (its link's), as the sender's address handle chose ([`Grh::src_default`]).
fn source_gid(g: &Grh, src: &DatagramSource) -> [u8; 16] {
    if g.src_default {
        crate::gid::default_of(&src.gid)
    } else {
        src.gid
    }
}
