//! The portability warnings of the `portable` profile: things an application does whose
//! outcome differs between HCAs in a way no single choice of the sim covers, each
//! logged as a `tracing` event that says what happened and what to do.
//!
//! One of them explains a failure (a post refused with ENOMEM) and is a warning, once per
//! QP. The others are advice about calls that succeeded ([`Advice`]): a program that does
//! such a thing usually does it at every run (every `MPI_Finalize` destroys QPs with
//! completions nobody will poll), so each is said once per backend (once per process
//! for the C ABI and for a program with one backend), at the level
//! [`SimConfig::portability_warnings`](crate::SimConfig) chooses (`RDMA_SIM_PORTABILITY_WARNINGS`):
//! a warning by default, a debug event under the C ABI, whose programs did not choose the
//! sim and whose output it should not change.
//!
//! - **Posting past the send queue's depth counting WRs whose CQEs were not polled.**
//!   Under `portable` (as on mlx5) a send queue slot is freed only when the WR's
//!   completion, or a later one of the same queue, is polled; rxe frees it when the WR
//!   completes. A post refused with ENOMEM although fewer than `max_send_wr` WRs are
//!   outstanding would have succeeded on rxe, so the program works on one and not the
//!   other: poll the send CQ, and signal at least one WR in every `max_send_wr`.
//! - **Relying on CQEs of a QP it reset or destroyed.** Under `portable` (as on mlx5)
//!   RESET and destroy remove the QP's completions from its CQs; rxe leaves them to be
//!   polled. When RESET or destroy removes completions the application had not polled,
//!   a program that polls them afterwards (or counts on them not being there) behaves
//!   differently: poll a QP's CQEs before resetting or destroying it. (Advice, once.)
//! - **Giving `srq_limit` to `ibv_create_srq`.** Under `portable` (as on mlx5, and as
//!   `man ibv_create_srq` says) the limit given at creation is ignored; rxe arms it, so a
//!   program that waits for `IBV_EVENT_SRQ_LIMIT_REACHED` without calling
//!   `ibv_modify_srq` gets it on rxe only: arm the limit with `ibv_modify_srq`
//!   (`IBV_SRQ_LIMIT`). (Advice, once.)
//! - **A UC or UD QP that goes to SQE after a send error.** Under `portable` (IBA 10.3.1,
//!   as on mlx5) it goes to SQE: its receive queue keeps working and `ibv_modify_qp` to
//!   RTS resumes sending. rxe moves it to ERR, flushing its receives, and refuses the
//!   move to RTS: a program that recovers by SQE -> RTS must also recover from ERR
//!   (RESET, then INIT, RTR, RTS again). (A warning, once per QP: it follows a failure.)

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};

/// How the advice ([`Advice`]) is logged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Level {
    /// A `tracing` warning (seen with the default filters).
    #[default]
    Warn,
    /// A `tracing` debug event (seen with `RUST_LOG=backend_sim=debug`).
    Debug,
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Level::Warn => "warn",
            Level::Debug => "debug",
        })
    }
}

impl FromStr for Level {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "warn" => Ok(Level::Warn),
            "debug" => Ok(Level::Debug),
            _ => Err(format!("{s:?} is not a level: use warn or debug")),
        }
    }
}

/// The advice of one backend: its level, and what it has said (each piece once).
#[derive(Debug, Default)]
pub struct Advice {
    level: Level,
    cqes_removed: AtomicBool,
    srq_limit: AtomicBool,
}

/// Logs `$($msg)*` at `$level` ([`Level`]).
macro_rules! advise {
    ($level:expr, $($msg:tt)*) => {
        match $level {
            Level::Warn => tracing::warn!($($msg)*),
            Level::Debug => tracing::debug!($($msg)*),
        }
    };
}

impl Advice {
    /// Advice logged at `level`.
    pub fn new(level: Level) -> Advice {
        Advice {
            level,
            ..Advice::default()
        }
    }

    /// RESET or destroy (`what`) of QP `qpn` removed `n` of its completions that the
    /// application had not polled.
    pub fn cqes_removed(&self, qpn: u32, what: &str, n: usize) {
        if !self.cqes_removed.swap(true, Ordering::Relaxed) {
            advise!(
                self.level,
                qpn = %format_args!("{qpn:#x}"),
                removed = n,
                "portability: {what} of the QP removed {n} of its completions that were never \
                 polled. mlx5 removes a QP's CQEs on RESET and destroy, as this profile does; rxe \
                 leaves them in the CQ to be polled. A program that polls them afterwards, or counts \
                 on them being gone, behaves differently on the two: poll a QP's completions before \
                 resetting or destroying it (said once)"
            );
        }
    }

    /// `ibv_create_srq` was given `srq_limit` `limit`, which this profile ignores.
    pub fn srq_limit_at_create(&self, limit: u32) {
        if !self.srq_limit.swap(true, Ordering::Relaxed) {
            advise!(
                self.level,
                srq_limit = limit,
                "portability: ibv_create_srq ignored srq_limit {limit}, as mlx5 does and as man \
                 ibv_create_srq says (the limit is irrelevant at creation); rxe arms it, and would \
                 raise IBV_EVENT_SRQ_LIMIT_REACHED without an ibv_modify_srq. Arm the limit with \
                 ibv_modify_srq(IBV_SRQ_LIMIT) after creating the SRQ (said once)"
            );
        }
    }
}

/// The warnings one QP has given (each at most once).
#[derive(Debug, Default)]
pub struct QpWarnings {
    sq_unpolled: AtomicBool,
    send_error_sqe: AtomicBool,
}

impl QpWarnings {
    /// A post to QP `qpn` was refused with ENOMEM while `held` of its `depth` slots were
    /// held by WRs complete but not polled.
    pub fn sq_full_unpolled(&self, qpn: u32, depth: u32, held: u64) {
        if !self.sq_unpolled.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                qpn = %format_args!("{qpn:#x}"),
                depth,
                held,
                "portability: ibv_post_send refused (ENOMEM): {held} of the send queue's {depth} slots \
                 belong to WRs that completed but whose completions were not polled. An mlx5 HCA \
                 frees a slot only when the CQE of its WR (or of a later one) is polled, as this \
                 profile does; rxe frees it at completion and would have taken the WR. Poll the send \
                 CQ, and signal at least one WR in every max_send_wr"
            );
        }
    }

    /// UC or UD QP `qpn` (of type `qp_type`) went to SQE after a send error.
    pub fn send_error_sqe(&self, qpn: u32, qp_type: verbs_api::QpType) {
        if !self.send_error_sqe.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                qpn = %format_args!("{qpn:#x}"),
                "portability: a send WR of {qp_type:?} QP {qpn:#x} completed in error and the QP went \
                 to SQE, as IBA 10.3.1 and mlx5 have it: its receive queue keeps working, and \
                 ibv_modify_qp to RTS resumes sending. rxe moves the QP to ERR instead, flushes its \
                 receives and refuses the move to RTS. Recover from both: when ibv_query_qp reports \
                 ERR, move the QP to RESET and bring it up again"
            );
        }
    }
}
