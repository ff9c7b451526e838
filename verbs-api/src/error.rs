//! The one error type of the verbs API.
//!
//! Variants are grouped by who is at fault, in the spirit of rustls' `Error`: the caller
//! (API misuse: a bad state transition, a wrong attribute mask, an argument out of range),
//! resources (a full queue: `ENOMEM`), the backend (an operation it does not support) and
//! the operating system or transport underneath. Every variant maps to the `errno` that
//! libibverbs would return for the same mistake ([`Error::errno`]), so results of the two
//! backends can be compared value by value.
//!
//! Verbs failures that a real HCA reports through a work completion (a remote access
//! error, an exhausted RNR retry count, ...) are *not* errors here: they arrive as
//! [`WorkCompletion`](crate::WorkCompletion)s with a non-success status.

use crate::flags::QpAttrMask;
use crate::qp::QpState;

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Which queue a [`Error::QueueFull`] refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueKind {
    /// The send queue of a QP.
    Send,
    /// The receive queue of a QP.
    Recv,
}

impl std::fmt::Display for QueueKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            QueueKind::Send => "send queue",
            QueueKind::Recv => "receive queue",
        })
    }
}

/// Everything that can go wrong in a verbs call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ---- the caller's mistakes (EINVAL) ----
    /// `ibv_modify_qp` asked for a transition the QP state machine does not have.
    #[error("invalid QP state transition: the QP is in {current:?}, {requested:?} cannot be reached from there (EINVAL)")]
    InvalidTransition {
        /// The state the QP is in.
        current: QpState,
        /// The state the caller asked for.
        requested: QpState,
    },
    /// The attribute mask of `ibv_modify_qp` lacks a required attribute or carries one the
    /// transition does not accept.
    #[error("wrong attribute mask for {current:?} -> {requested:?}: missing {missing:?}, not allowed {not_allowed:?} (EINVAL)")]
    InvalidAttrMask {
        /// The state the QP is in.
        current: QpState,
        /// The state the caller asked for.
        requested: QpState,
        /// Attributes the transition requires that the mask lacks.
        missing: QpAttrMask,
        /// Attributes in the mask that the transition does not accept.
        not_allowed: QpAttrMask,
    },
    /// An attribute value is out of range (a port that does not exist, an MTU above the
    /// port's, more outstanding reads than the device allows, ...).
    #[error("invalid attribute {name}: {reason} (EINVAL)")]
    InvalidAttr {
        /// The attribute's libibverbs name.
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// Any other invalid argument (EINVAL), with the verb that refused it.
    #[error("{call}: invalid argument: {reason} (EINVAL)")]
    InvalidArgument {
        /// The verb, e.g. `ibv_reg_mr`.
        call: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A post to a QP whose state does not allow it (e.g. `post_send` before RTS).
    #[error("{call}: QP {qpn:#x} is in {state:?}: {reason} (EINVAL)")]
    InvalidQpState {
        /// The verb.
        call: &'static str,
        /// The QP number.
        qpn: u32,
        /// The QP's state.
        state: QpState,
        /// What the verb needs.
        reason: &'static str,
    },
    /// A memory-region accessor was asked for bytes outside the region.
    #[error("range {offset}..{end} is outside the memory region of {len} bytes")]
    OutOfBounds {
        /// Start of the requested range.
        offset: usize,
        /// End of the requested range.
        end: usize,
        /// Length of the region.
        len: usize,
    },

    /// Memory the call was given is not the caller's to give: a range that is not mapped,
    /// not readable, or not writable where write access is asked (EFAULT, as the kernel
    /// answers when it cannot pin the pages of a region).
    #[error("{call}: bad address: {reason} (EFAULT)")]
    BadAddress {
        /// The verb, e.g. `ibv_reg_mr`.
        call: &'static str,
        /// Which part of the range, and what is wrong with it.
        reason: String,
    },

    // ---- resources (ENOMEM) ----
    /// Posting past the capacity of a queue (ENOMEM).
    #[error("{queue} of QP {qpn:#x} is full: {capacity} work requests outstanding (ENOMEM)")]
    QueueFull {
        /// Which queue.
        queue: QueueKind,
        /// The QP number.
        qpn: u32,
        /// The queue's capacity.
        capacity: u32,
    },
    /// A resource could not be allocated (ENOMEM).
    #[error("{call}: out of resources: {reason} (ENOMEM)")]
    NoMemory {
        /// The verb.
        call: &'static str,
        /// What ran out.
        reason: String,
    },
    /// The completion queue overflowed: completions were lost, the CQ is in error.
    #[error("completion queue {cq} overflowed: {lost} completion(s) lost; the CQ is in error and must be destroyed")]
    CqOverflow {
        /// The CQ's handle.
        cq: u32,
        /// How many completions could not be queued, as far as the backend knows: exact
        /// on the sim; a lower bound (at least 1) on libibverbs, which only reports that
        /// the CQ overran.
        lost: u64,
    },

    // ---- the backend ----
    /// The backend or device does not support this (EOPNOTSUPP).
    #[error("{backend}: not supported: {what} (EOPNOTSUPP)")]
    Unsupported {
        /// Backend name.
        backend: &'static str,
        /// What is not supported.
        what: String,
    },
    /// No RDMA device is present at all.
    #[error("no RDMA device found: {hint}")]
    NoDevice {
        /// What the user can do about it.
        hint: String,
    },
    /// The named device does not exist.
    #[error("RDMA device {name:?} not found; available: {available:?} (ENODEV)")]
    DeviceNotFound {
        /// The name asked for.
        name: String,
        /// The names that exist.
        available: Vec<String>,
    },

    // ---- the OS and the transport ----
    /// A verb failed with an errno from the OS or provider library.
    #[error("{call} failed: {source}")]
    Os {
        /// The verb or system call.
        call: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The process (`EMFILE`) or the whole system (`ENFILE`) ran out of file
    /// descriptors; the text names the process's open-file limit (`ulimit -n`).
    #[error("{call}: {}", out_of_files_text(*errno, *limit))]
    OutOfFiles {
        /// The system call that needed a descriptor (`accept`, `connect`, `socket`, ...).
        call: &'static str,
        /// `EMFILE` or `ENFILE`.
        errno: i32,
        /// The soft `RLIMIT_NOFILE` when the error was made, if it could be read.
        limit: Option<u64>,
    },
    /// A transport-level failure (the simulated wire, an out-of-band exchange).
    #[error("transport: {0}")]
    Transport(String),
    /// A `post_send` / `post_recv` that failed, as `?` converts a [`PostError`]: the
    /// index and `wr_id` of the first work request that was not posted (libibverbs'
    /// `bad_wr`), and why. Work requests before `index` were posted and will complete.
    #[error("work request #{index} (wr_id {wr_id:#x}) was not posted: {source}")]
    Post {
        /// Position of the failing WR in the list passed to the post call.
        index: usize,
        /// Its `wr_id`.
        wr_id: u64,
        /// Why it failed.
        #[source]
        source: Box<Error>,
    },
    /// A connection-manager call refused (`man rdma_cm`): the errno the kernel's rdma_cm
    /// answers with (EINVAL for a call the id's state does not allow, EADDRINUSE,
    /// EADDRNOTAVAIL, ENODEV, ...), and why.
    #[error("{call}: {reason} ({})", std::io::Error::from_raw_os_error(*errno))]
    Cm {
        /// The call, e.g. `rdma_bind_addr`.
        call: &'static str,
        /// Its errno.
        errno: i32,
        /// What is wrong.
        reason: String,
    },
    /// A wait did not finish within its bound.
    #[error("timed out after {after:?}{}", if what.is_empty() { String::new() } else { format!(": {what}") })]
    Timeout {
        /// The bound.
        after: std::time::Duration,
        /// What was being waited for, and how far it got.
        what: String,
    },
}

impl Error {
    /// The `errno` libibverbs returns for this error (EINVAL, ENOMEM, EOPNOTSUPP, ...), so
    /// that two backends' failures can be compared value by value.
    pub fn errno(&self) -> i32 {
        match self {
            Error::InvalidTransition { .. }
            | Error::InvalidAttrMask { .. }
            | Error::InvalidAttr { .. }
            | Error::InvalidArgument { .. }
            | Error::InvalidQpState { .. }
            | Error::OutOfBounds { .. } => libc::EINVAL,
            Error::BadAddress { .. } => libc::EFAULT,
            Error::QueueFull { .. } | Error::NoMemory { .. } => libc::ENOMEM,
            Error::CqOverflow { .. } => libc::EOVERFLOW,
            Error::Unsupported { .. } => libc::EOPNOTSUPP,
            Error::NoDevice { .. } | Error::DeviceNotFound { .. } => libc::ENODEV,
            Error::Os { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            Error::OutOfFiles { errno, .. } | Error::Cm { errno, .. } => *errno,
            Error::Transport(_) => libc::EIO,
            Error::Timeout { .. } => libc::ETIMEDOUT,
            Error::Post { source, .. } => source.errno(),
        }
    }

    /// Builds [`Error::Os`] from an errno value.
    pub fn from_errno(call: &'static str, errno: i32) -> Self {
        Error::Os {
            call,
            source: std::io::Error::from_raw_os_error(errno),
        }
    }

    /// [`Error::Os`] for an I/O error of `call`, or [`Error::OutOfFiles`] (naming the
    /// open-file limit) when it is `EMFILE` or `ENFILE`.
    pub fn from_io(call: &'static str, source: std::io::Error) -> Self {
        match source.raw_os_error() {
            Some(errno @ (libc::EMFILE | libc::ENFILE)) => Error::OutOfFiles {
                call,
                errno,
                limit: open_file_limit(),
            },
            _ => Error::Os { call, source },
        }
    }

    /// Shorthand for [`Error::Timeout`].
    pub fn timeout(after: std::time::Duration, what: impl Into<String>) -> Self {
        Error::Timeout {
            after,
            what: what.into(),
        }
    }

    /// Shorthand for [`Error::Cm`].
    pub fn cm(call: &'static str, errno: i32, reason: impl Into<String>) -> Self {
        Error::Cm {
            call,
            errno,
            reason: reason.into(),
        }
    }

    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(call: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            call,
            reason: reason.into(),
        }
    }
}

/// This process's open-file limit: the soft `RLIMIT_NOFILE` (what `ulimit -n` shows), or
/// `None` if it cannot be read or is unlimited.
pub fn open_file_limit() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the live struct it is given.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) };
    (rc == 0 && r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

/// The text of [`Error::OutOfFiles`]: which limit ran out, and its value.
fn out_of_files_text(errno: i32, limit: Option<u64>) -> String {
    let limit = match limit {
        Some(n) => format!("the open-file limit is {n} (ulimit -n)"),
        None => "the open-file limit could not be read (ulimit -n)".to_string(),
    };
    if errno == libc::ENFILE {
        format!(
            "out of file descriptors (ENFILE): the system-wide table of open files is full \
             (sysctl fs.file-max); this process's {limit}"
        )
    } else {
        format!("out of file descriptors (EMFILE): {limit}")
    }
}

/// A failed `post_send` / `post_recv`: the index and `wr_id` of the first work request
/// that was not posted (libibverbs' `bad_wr`), and why. Work requests before `index` were
/// posted and will complete; those from `index` on were not.
#[derive(Debug, thiserror::Error)]
#[error("work request #{index} (wr_id {wr_id:#x}) was not posted: {error}")]
pub struct PostError {
    /// Position of the failing WR in the list passed to the post call.
    pub index: usize,
    /// Its `wr_id`.
    pub wr_id: u64,
    /// Why it failed.
    #[source]
    pub error: Error,
}

impl PostError {
    /// The `errno` of the underlying error.
    pub fn errno(&self) -> i32 {
        self.error.errno()
    }
}

impl From<PostError> for Error {
    /// Keeps the failing WR's index and `wr_id` ([`Error::Post`]), so that `?` in a
    /// function returning [`Result`] still says which work request was refused.
    fn from(e: PostError) -> Self {
        Error::Post {
            index: e.index,
            wr_id: e.wr_id,
            source: Box::new(e.error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_mapping_matches_libibverbs() {
        let e = Error::QueueFull {
            queue: QueueKind::Send,
            qpn: 5,
            capacity: 4,
        };
        assert_eq!(e.errno(), libc::ENOMEM);
        let e = Error::InvalidTransition {
            current: QpState::Reset,
            requested: QpState::Rts,
        };
        assert_eq!(e.errno(), libc::EINVAL);
        assert!(e.to_string().contains("Reset"));
        assert!(e.to_string().contains("Rts"));
        assert_eq!(Error::from_errno("x", libc::EBUSY).errno(), libc::EBUSY);
    }

    #[test]
    fn out_of_files_names_the_errno_and_the_limit() {
        let e = Error::from_io("accept", std::io::Error::from_raw_os_error(libc::EMFILE));
        assert_eq!(e.errno(), libc::EMFILE);
        let want = match open_file_limit() {
            Some(n) => {
                format!("accept: out of file descriptors (EMFILE): the open-file limit is {n} (ulimit -n)")
            }
            None => {
                "accept: out of file descriptors (EMFILE): the open-file limit could not be read (ulimit -n)"
                    .to_string()
            }
        };
        assert_eq!(e.to_string(), want);
        let e = Error::from_io("socket", std::io::Error::from_raw_os_error(libc::ENFILE));
        assert_eq!(e.errno(), libc::ENFILE);
        assert!(
            e.to_string().contains("(ENFILE)") && e.to_string().contains("ulimit -n"),
            "{e}"
        );
        let e = Error::from_io("connect", std::io::Error::from_raw_os_error(libc::ECONNREFUSED));
        assert!(matches!(e, Error::Os { call: "connect", .. }), "{e:?}");
    }

    /// `?` turns a failed post into an [`Error`] that still names the refused WR.
    #[test]
    fn question_mark_converts_a_post_error_keeping_index_and_wr_id() {
        fn post() -> std::result::Result<(), PostError> {
            Err(PostError {
                index: 3,
                wr_id: 0xbeef,
                error: Error::QueueFull {
                    queue: QueueKind::Send,
                    qpn: 7,
                    capacity: 4,
                },
            })
        }
        fn caller() -> Result<()> {
            post()?;
            Ok(())
        }
        let e = caller().unwrap_err();
        let Error::Post { index, wr_id, source } = &e else {
            panic!("expected Error::Post, got {e:?}");
        };
        assert_eq!((*index, *wr_id), (3, 0xbeef));
        assert!(matches!(**source, Error::QueueFull { qpn: 7, .. }), "{source:?}");
        assert_eq!(e.errno(), libc::ENOMEM);
        let text = e.to_string();
        assert!(text.contains("#3") && text.contains("wr_id 0xbeef"), "{text}");
        assert!(text.contains("send queue of QP 0x7 is full"), "{text}");
    }
}
