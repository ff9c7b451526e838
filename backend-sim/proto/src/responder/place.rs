//! Placing an incoming message where it goes, one step for every transport: a SEND in
//! the receive it took (its buffers resolved against their own lkeys, IBA 10.7.2.2; a
//! message longer than them cannot be placed), a WRITE's payload in the region the
//! remote access check resolved, and the receive a SEND or WRITE_WITH_IMM fills, which
//! completes once the payload is in. What a transport does with a message that cannot be
//! placed is its own: RC NAKs it, UC drops it, UD loses the datagram.

use verbs_api::{WcOpcode, WcStatus, WorkCompletion};

use super::{trim, Incoming, Responder, Taken};
use crate::memory::{MrTable, Seg};
use crate::switches::RecvError;

/// Why a message could not be placed in the receive it took. The receive has completed
/// with [`Unplaced::status`] by then.
#[derive(Clone, Copy, Debug)]
pub(super) enum Unplaced {
    /// The receive names memory it may not write, the QP's own error on every transport
    /// (`IBV_WC_LOC_PROT_ERR`, or the profile's malformed-WQE status): the QP goes to ERR.
    BadLkey(WcStatus),
    /// Longer than the buffers (`room` bytes) where the profile treats that as a
    /// malformed WQE (`IBV_WC_LOC_QP_OP_ERR`): the QP goes to ERR.
    Malformed { room: u64 },
    /// Longer than the buffers (`room` bytes): `IBV_WC_LOC_LEN_ERR`, as the IBA says.
    TooLong { room: u64 },
}

impl Unplaced {
    /// The status the receive completed with.
    pub(super) fn status(self) -> WcStatus {
        match self {
            Unplaced::BadLkey(s) => s,
            Unplaced::Malformed { .. } => WcStatus::LocQpOpErr,
            Unplaced::TooLong { .. } => WcStatus::LocLenErr,
        }
    }
}

/// What fills a receive: a SEND's payload, or the immediate of a WRITE_WITH_IMM.
#[derive(Clone, Copy, Debug)]
pub(super) struct Fill {
    pub opcode: WcOpcode,
    pub byte_len: u32,
    pub imm: Option<u32>,
    pub inv: Option<u32>,
    pub solicited: bool,
}

impl Responder {
    /// The scatter list of the receive taken, for a message of `len` bytes; or why the
    /// message cannot go there, the receive then completed in error.
    pub(super) fn place(
        &mut self,
        len: u64,
        mrs: &MrTable,
        out: &mut Vec<(WorkCompletion, bool)>,
    ) -> Result<Vec<Seg>, Unplaced> {
        let mut segs = std::mem::take(&mut self.scratch);
        let unplaced = match mrs.resolve_local(self.pd, &self.wqe.sges, true, &mut segs) {
            Err(_) => Unplaced::BadLkey(Self::recv_error(self.sw.recv_bad_lkey, WcStatus::LocProtErr)),
            Ok(room) if len <= room => return Ok(segs),
            Ok(room) if self.sw.recv_too_small == RecvError::MalformedWqe => Unplaced::Malformed { room },
            Ok(room) => Unplaced::TooLong { room },
        };
        segs.clear();
        self.scratch = segs;
        self.fail_recv(unplaced.status(), out);
        Err(unplaced)
    }

    /// Hands back a scatter list [`Responder::place`] gave, unused.
    pub(super) fn unplace(&mut self, mut segs: Vec<Seg>) {
        segs.clear();
        self.scratch = segs;
    }

    /// Message `psn`'s payload goes to `segs` (cut to `len` bytes); `fill`, if any, is
    /// what the receive taken for it completes with once the payload is in.
    pub(super) fn sink(&mut self, psn: u32, mut segs: Vec<Seg>, len: u32, fill: Option<Fill>) -> Incoming {
        trim(&mut segs, len as usize);
        if let Some(f) = fill {
            self.taken = Some(Taken::Filling {
                opcode: f.opcode,
                byte_len: f.byte_len,
                imm: f.imm,
                inv: f.inv,
                solicited: f.solicited,
            });
        }
        self.payload_psn = Some(psn);
        Incoming::Sink(segs)
    }

    /// A WRITE's payload goes to `seg`, the region the remote access check resolved (none
    /// for a zero-length WRITE).
    pub(super) fn sink_write(
        &mut self,
        psn: u32,
        seg: Option<Seg>,
        len: u32,
        imm: Option<u32>,
        solicited: bool,
    ) -> Incoming {
        let mut segs = std::mem::take(&mut self.scratch);
        segs.clear();
        segs.extend(seg);
        let fill = imm.map(|_| Fill {
            opcode: WcOpcode::RecvRdmaWithImm,
            byte_len: len,
            imm,
            inv: None,
            solicited,
        });
        self.sink(psn, segs, len, fill)
    }
}
