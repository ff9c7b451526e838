//! Whether a blocking `read(2)` would have gone on after the signal that just
//! interrupted a `poll(2)` (`man 7 signal`, "Interruption of system calls and library
//! functions by signal handlers").
//!
//! A thread that waits in `ibv_get_cq_event` on the sim waits in `poll(2)` on the
//! channel's descriptor and its device's sockets (see `progress::waiter`), where
//! libibverbs waits in `read(2)` of the descriptor. The two differ after a signal whose
//! handler ran: `poll(2)` always fails with EINTR, while `read(2)` goes on when the
//! handler was installed with `SA_RESTART`. The kernel does not say which signal
//! interrupted the call, so this asks the handlers of the signals the thread does not
//! block: if every one of them restarts, so would the read; if any does not, the wait
//! fails with EINTR as the read would for it. (A program with both kinds installed and
//! unblocked then sees EINTR for a signal whose handler restarts: an error it handles as
//! any EINTR, where the opposite choice would leave a wait that a program meant to end
//! with a signal, qperf's SIGALRM, waiting on.) The signals of faults (SIGSEGV,
//! SIGBUS, SIGFPE, SIGILL, SIGTRAP) do not count: they arrive for the instruction that
//! faults, never in the middle of a wait, and Rust's runtime installs handlers for two
//! of them without `SA_RESTART`.

use std::mem::MaybeUninit;

/// The signals of faults, which arrive for the instruction that faults and so are never
/// blocked or counted here, and the two that cannot be caught.
fn of_faults(sig: libc::c_int) -> bool {
    matches!(
        sig,
        libc::SIGKILL
            | libc::SIGSTOP
            | libc::SIGSEGV
            | libc::SIGBUS
            | libc::SIGFPE
            | libc::SIGILL
            | libc::SIGTRAP
    )
}

/// Whether a `read(2)` interrupted by a signal now would have been restarted (see the
/// module docs), for a thread whose signal mask is its current one.
pub fn read_would_restart() -> bool {
    let mut blocked = MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: a null new set only reads the mask into `blocked`, which is written in full
    // on success.
    let blocked = unsafe {
        if libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), blocked.as_mut_ptr()) != 0 {
            return false;
        }
        blocked.assume_init()
    };
    read_would_restart_under(&blocked)
}

/// [`read_would_restart`] for a thread whose signal mask is `blocked`.
pub fn read_would_restart_under(blocked: &libc::sigset_t) -> bool {
    for sig in 1..=libc::SIGRTMAX() {
        if of_faults(sig) {
            continue;
        }
        // SAFETY: `blocked` is an initialized set; the signal number is in range.
        if unsafe { libc::sigismember(blocked, sig) } == 1 {
            continue;
        }
        let mut sa = MaybeUninit::<libc::sigaction>::uninit();
        // SAFETY: a null new action only reads the current one into `sa`.
        let sa = unsafe {
            if libc::sigaction(sig, std::ptr::null(), sa.as_mut_ptr()) != 0 {
                continue;
            }
            sa.assume_init()
        };
        let handled = sa.sa_sigaction != libc::SIG_DFL && sa.sa_sigaction != libc::SIG_IGN;
        if handled && sa.sa_flags & libc::SA_RESTART == 0 {
            return false;
        }
    }
    true
}

/// Every signal but those of faults blocked for the life of the value, the thread's own
/// mask put back when it goes: a thread that waits in `ppoll(2)` with [`Deferred::mask`]
/// and does other work between waits meets a signal only inside the wait, which then
/// fails with EINTR (`man 2 pselect`: the race it closes). Unblocked between waits, a
/// signal whose handler ran there would be lost, and the wait after it go on for ever
/// where the `read(2)` it stands for would have failed.
pub struct Deferred {
    own: libc::sigset_t,
}

impl Deferred {
    /// Blocks the signals; `None` if the mask cannot be changed (then nothing is).
    pub fn new() -> Option<Deferred> {
        let mut all = MaybeUninit::<libc::sigset_t>::uninit();
        let mut own = MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: `sigfillset` initializes `all`; `sigdelset` takes a valid set and a
        // signal number in range; `pthread_sigmask` writes the old mask into `own` in
        // full on success, which is checked before `own` is read.
        unsafe {
            libc::sigfillset(all.as_mut_ptr());
            for sig in 1..=libc::SIGRTMAX() {
                if of_faults(sig) {
                    libc::sigdelset(all.as_mut_ptr(), sig);
                }
            }
            if libc::pthread_sigmask(libc::SIG_BLOCK, all.as_ptr(), own.as_mut_ptr()) != 0 {
                return None;
            }
            Some(Deferred {
                own: own.assume_init(),
            })
        }
    }

    /// The thread's own mask, for the wait (`ppoll`'s last argument).
    pub fn mask(&self) -> &libc::sigset_t {
        &self.own
    }
}

impl Drop for Deferred {
    fn drop(&mut self) {
        // SAFETY: `own` is the initialized mask saved by `new`.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.own, std::ptr::null_mut()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    extern "C" fn nothing(_: libc::c_int) {}

    fn install(sig: libc::c_int, flags: libc::c_int) -> libc::sigaction {
        // SAFETY: installs a handler that does nothing; the old action is returned so
        // the test puts it back.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = nothing as extern "C" fn(libc::c_int) as usize;
            sa.sa_flags = flags;
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(sig, &sa, &mut old);
            old
        }
    }

    /// A handler without `SA_RESTART` makes the answer no, one with it yes (the test
    /// harness installs no other handler than Rust's for faults).
    #[test]
    fn a_handler_without_sa_restart_interrupts() {
        let sig = libc::SIGRTMAX() - 3;
        let old = install(sig, libc::SA_RESTART);
        let with = read_would_restart();
        install(sig, 0);
        let without = read_would_restart();
        // SAFETY: puts the original action back.
        unsafe { libc::sigaction(sig, &old, std::ptr::null_mut()) };
        assert!(with, "a handler with SA_RESTART interrupts");
        assert!(!without, "a handler without SA_RESTART restarts");
    }
}
