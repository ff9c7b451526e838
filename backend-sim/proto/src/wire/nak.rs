//! A NAK's syndrome (IBA 9.7.5.2.8) and the reason the sim's responder gives beside it,
//! which the requester reports as the work completion's `vendor_err` (read from a NAK's
//! header in `codec::nak`).

use std::fmt;

/// The syndrome of a NAK (IBA 9.7.5.2.8, AETH syndrome encodings).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NakCode {
    /// Receiver not ready: no receive posted. Carries the responder's RNR timer code.
    Rnr {
        /// `min_rnr_timer` code of the responder QP.
        timer: u8,
    },
    /// PSN sequence error: the responder expected another PSN (carried in the frame).
    PsnSeq,
    /// Invalid request (message too long for the receive, misaligned atomic, ...).
    InvalidRequest,
    /// Remote access error (rkey, PD, rights, bounds).
    RemoteAccess,
    /// Remote operational error (the responder failed, e.g. a bad receive SGE).
    RemoteOperational,
}

/// Which check a responder's request failed, carried in its NAK beside the syndrome (a
/// field of the sim's own: the AETH of IBA 9.7.5.2.8 has room only for the syndrome) and
/// reported by the requester in the work completion's `vendor_err`, where an HCA puts its
/// vendor syndrome. `IBV_WC_REM_ACCESS_ERR` says that a remote access was refused,
/// `IBV_WC_REM_INV_REQ_ERR` that a request was invalid; the code says why.
///
/// | `vendor_err` | status | reason |
/// |---|---|---|
/// | `0x101` | `IBV_WC_REM_ACCESS_ERR` | [`NakReason::UnknownRkey`] |
/// | `0x102` | `IBV_WC_REM_ACCESS_ERR` | [`NakReason::DeregisteredRkey`] |
/// | `0x103` | `IBV_WC_REM_ACCESS_ERR` | [`NakReason::WrongPd`] |
/// | `0x104` | `IBV_WC_REM_ACCESS_ERR` | [`NakReason::QpAccess`] |
/// | `0x105` | `IBV_WC_REM_ACCESS_ERR` | [`NakReason::MrAccess`] |
/// | `0x106` | `IBV_WC_REM_ACCESS_ERR` | [`NakReason::OutOfBounds`] |
/// | `0x107` | `IBV_WC_REM_ACCESS_ERR` | [`NakReason::UnboundWindow`] |
/// | `0x108` | `IBV_WC_REM_ACCESS_ERR` | [`NakReason::StaleWindowKey`] |
/// | `0x109` | `IBV_WC_REM_ACCESS_ERR` | [`NakReason::WindowOfOtherQp`] |
/// | `0x10a` | `IBV_WC_REM_ACCESS_ERR` | [`NakReason::WindowAccess`] |
/// | `0x10b` | `IBV_WC_REM_ACCESS_ERR` | [`NakReason::OutsideWindow`] |
/// | `0x201` | `IBV_WC_REM_INV_REQ_ERR` | [`NakReason::MisalignedAtomic`] |
/// | `0x202` | `IBV_WC_REM_INV_REQ_ERR` | [`NakReason::NoRdAtomicResources`] |
/// | `0x203` | `IBV_WC_REM_INV_REQ_ERR` | [`NakReason::RecvTooShort`] |
/// | `0x204` | `IBV_WC_REM_INV_REQ_ERR` | [`NakReason::RdAtomicOverLimit`] |
///
/// `vendor_err` 0 with these statuses: the responder gave no reason. The codes do not
/// overlap the `errno` values that `IBV_WC_RETRY_EXC_ERR` carries there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum NakReason {
    /// The rkey names no memory region of the responder's device (nor one deregistered
    /// recently).
    UnknownRkey = 0x101,
    /// The rkey named a memory region that has been deregistered (`ibv_dereg_mr`), or a
    /// memory window deallocated (`ibv_dealloc_mw`): the device remembers the last 1024
    /// such keys.
    DeregisteredRkey = 0x102,
    /// The memory region belongs to another protection domain than the responder QP.
    WrongPd = 0x103,
    /// The responder QP's `qp_access_flags` do not allow the operation
    /// (`IBV_ACCESS_REMOTE_WRITE`, `_REMOTE_READ` or `_REMOTE_ATOMIC`).
    QpAccess = 0x104,
    /// The memory region was registered without the right the operation needs
    /// (`IBV_ACCESS_REMOTE_WRITE` for WRITE, `_REMOTE_READ` for READ, `_REMOTE_ATOMIC`
    /// for atomics).
    MrAccess = 0x105,
    /// The address range leaves the memory region.
    OutOfBounds = 0x106,
    /// The rkey names a memory window that is not bound (never bound, unbound, or
    /// invalidated).
    UnboundWindow = 0x107,
    /// The rkey names a memory window whose rkey has another tag now: it was bound again
    /// since the rkey was handed out (`ibv_inc_rkey`).
    StaleWindowKey = 0x108,
    /// The rkey names a type 2 memory window bound to another QP than the one the
    /// request arrived on.
    WindowOfOtherQp = 0x109,
    /// The memory window does not grant the operation (its `mw_access_flags`).
    WindowAccess = 0x10a,
    /// The address range leaves the memory window.
    OutsideWindow = 0x10b,
    /// An atomic on an address that is not 8-byte aligned.
    MisalignedAtomic = 0x201,
    /// An RDMA READ or atomic to a QP with no responder resources for them
    /// (`max_dest_rd_atomic` 0).
    NoRdAtomicResources = 0x202,
    /// A SEND longer than the receive buffers posted for it (the responder's receive
    /// completes with `IBV_WC_LOC_LEN_ERR`).
    RecvTooShort = 0x203,
    /// An RDMA READ or atomic sent while the requester had more of them outstanding than
    /// the responder QP's `max_dest_rd_atomic` (its responder resources).
    RdAtomicOverLimit = 0x204,
}

impl NakReason {
    /// Every reason, in code order.
    pub const ALL: [NakReason; 15] = [
        NakReason::UnknownRkey,
        NakReason::DeregisteredRkey,
        NakReason::WrongPd,
        NakReason::QpAccess,
        NakReason::MrAccess,
        NakReason::OutOfBounds,
        NakReason::UnboundWindow,
        NakReason::StaleWindowKey,
        NakReason::WindowOfOtherQp,
        NakReason::WindowAccess,
        NakReason::OutsideWindow,
        NakReason::MisalignedAtomic,
        NakReason::NoRdAtomicResources,
        NakReason::RecvTooShort,
        NakReason::RdAtomicOverLimit,
    ];

    /// The code, as a work completion's `vendor_err` carries it.
    pub fn vendor_err(self) -> u32 {
        self as u32
    }

    /// The reason a `vendor_err` of an `IBV_WC_REM_ACCESS_ERR` or `IBV_WC_REM_INV_REQ_ERR`
    /// completion names (`None`: no reason given, or not a code of this table).
    pub fn from_vendor_err(code: u32) -> Option<NakReason> {
        NakReason::ALL.into_iter().find(|r| r.vendor_err() == code)
    }

    /// Whether a NAK with syndrome `code` may give this reason: its own [`code`](Self::code),
    /// or for [`NakReason::QpAccess`] also an invalid request, which a device whose
    /// profile refuses those as invalid requests sends
    /// (`switches::Switches::qp_access_invalid_request`, rxe's choice).
    pub fn may_carry(self, code: NakCode) -> bool {
        self.code() == code || (self == NakReason::QpAccess && code == NakCode::InvalidRequest)
    }

    /// The syndrome a NAK with this reason carries.
    pub fn code(self) -> NakCode {
        match self {
            NakReason::MisalignedAtomic
            | NakReason::NoRdAtomicResources
            | NakReason::RecvTooShort
            | NakReason::RdAtomicOverLimit => NakCode::InvalidRequest,
            _ => NakCode::RemoteAccess,
        }
    }
}

impl fmt::Display for NakReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NakReason::UnknownRkey => "the rkey names no memory region",
            NakReason::DeregisteredRkey => {
                "the rkey names a deregistered memory region (or a deallocated memory window)"
            }
            NakReason::WrongPd => "the memory region belongs to another protection domain than the QP",
            NakReason::QpAccess => "the QP's qp_access_flags do not allow the operation",
            NakReason::MrAccess => "the memory region's access flags do not allow the operation",
            NakReason::OutOfBounds => "the address range leaves the memory region",
            NakReason::UnboundWindow => "the rkey names a memory window that is not bound",
            NakReason::StaleWindowKey => {
                "the rkey names a memory window that was bound again since (its tag changed)"
            }
            NakReason::WindowOfOtherQp => "the rkey names a type 2 memory window bound to another QP",
            NakReason::WindowAccess => "the memory window does not grant the operation",
            NakReason::OutsideWindow => "the address range leaves the memory window",
            NakReason::MisalignedAtomic => "the atomic's address is not 8-byte aligned",
            NakReason::NoRdAtomicResources => {
                "the QP has no responder resources for RDMA READ and atomics (max_dest_rd_atomic 0)"
            }
            NakReason::RecvTooShort => "the message is longer than the receive buffers",
            NakReason::RdAtomicOverLimit => {
                "more RDMA READ and atomic requests outstanding than the QP's max_dest_rd_atomic"
            }
        })
    }
}
