//! perftest's address walk in its bandwidth loops (`increase_loc_addr` and
//! `increase_rem_addr` in `perftest_resources.h`): when one WR goes per post and a
//! message fits in half of perftest's cycle buffer (a page), each post's local address
//! and, but for SEND, its remote address move on by the message size rounded up to a
//! cache line (`INC`), and return to the buffer's start after a page's worth of posts.
//! perftest's WRITEs of 8 bytes land on 64 different cache lines in turn, not on one.

use verbs_api::{RemoteAddr, WrOp};

/// perftest's `cycle_buffer`: `DEF_PAGE_SIZE`, what both sides use unless told otherwise.
pub const CYCLE_BUFFER: u64 = 4096;
/// perftest's `cache_line_size`: the L1 data cache's line (`sysconf`), 64 bytes on the
/// machines perftest runs on, and its `DEF_CACHE_LINE_SIZE`.
pub const CACHE_LINE: u64 = 64;

/// The offsets of successive posts from the buffer's start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Walk {
    step: u64,
    steps: u64,
    next: u64,
}

impl Walk {
    /// The walk of messages of `size` bytes, or `None` where perftest does not walk (a
    /// message larger than half the cycle buffer).
    pub fn new(size: u64) -> Option<Walk> {
        if size > CYCLE_BUFFER / 2 {
            return None;
        }
        // `INC(size, cache_line_size)`.
        let step = size.max(1).next_multiple_of(CACHE_LINE);
        Some(Walk {
            step,
            steps: CYCLE_BUFFER / step,
            next: 0,
        })
    }

    /// The offset of the next post (then the walk moves on).
    pub fn advance(&mut self) -> u64 {
        let at = self.next * self.step;
        self.next += 1;
        if self.next == self.steps {
            self.next = 0;
        }
        at
    }
}

/// `op` with its remote address moved on by `off` (`increase_rem_addr`); a SEND has
/// none.
pub fn shifted(op: WrOp, off: u64) -> WrOp {
    let at = |r: RemoteAddr| RemoteAddr::new(r.addr + off, r.rkey);
    match op {
        WrOp::Send
        | WrOp::SendWithImm { .. }
        | WrOp::SendWithInv { .. }
        | WrOp::LocalInv { .. }
        | WrOp::BindMw => op,
        WrOp::RdmaWrite { remote } => WrOp::RdmaWrite { remote: at(remote) },
        WrOp::RdmaWriteWithImm { remote, imm_data } => WrOp::RdmaWriteWithImm {
            remote: at(remote),
            imm_data,
        },
        WrOp::RdmaRead { remote } => WrOp::RdmaRead { remote: at(remote) },
        WrOp::AtomicCmpAndSwp {
            remote,
            compare,
            swap,
        } => WrOp::AtomicCmpAndSwp {
            remote: at(remote),
            compare,
            swap,
        },
        WrOp::AtomicFetchAndAdd { remote, add } => WrOp::AtomicFetchAndAdd {
            remote: at(remote),
            add,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// perftest's own arithmetic, post by post: the address after post `scnt` is the
    /// address before it plus `INC`, or the start when `(scnt + 1) % (cycle_buffer /
    /// INC) == 0`.
    fn perftest_offsets(size: u64, posts: u64) -> Vec<u64> {
        let inc = if size > CACHE_LINE {
            size.div_ceil(CACHE_LINE) * CACHE_LINE
        } else {
            CACHE_LINE
        };
        let mut addr = 0;
        (0..posts)
            .map(|scnt| {
                let used = addr;
                addr += inc;
                if (scnt + 1) % (CYCLE_BUFFER / inc) == 0 {
                    addr = 0;
                }
                used
            })
            .collect()
    }

    #[test]
    fn the_walk_is_perftests() {
        for size in [1, 8, 63, 64, 65, 100, 1000, 2048] {
            let mut w = Walk::new(size).unwrap();
            let ours: Vec<u64> = (0..200).map(|_| w.advance()).collect();
            assert_eq!(ours, perftest_offsets(size, 200), "size {size}");
            assert!(ours.iter().all(|&o| o + size <= CYCLE_BUFFER), "size {size}");
        }
    }

    #[test]
    fn eight_bytes_visit_64_cache_lines() {
        let mut w = Walk::new(8).unwrap();
        let offs: Vec<u64> = (0..65).map(|_| w.advance()).collect();
        assert_eq!(offs[1], 64);
        assert_eq!(offs[63], 4032);
        assert_eq!(offs[64], 0);
    }

    #[test]
    fn no_walk_above_half_a_page() {
        assert_eq!(Walk::new(2049), None);
        assert_eq!(Walk::new(65536), None);
    }

    #[test]
    fn a_send_keeps_its_op_the_others_move_their_remote_address() {
        let r = RemoteAddr::new(0x1000, 7);
        assert_eq!(shifted(WrOp::Send, 64), WrOp::Send);
        assert_eq!(
            shifted(WrOp::RdmaWrite { remote: r }, 64),
            WrOp::RdmaWrite {
                remote: RemoteAddr::new(0x1040, 7)
            }
        );
        assert_eq!(
            shifted(WrOp::AtomicFetchAndAdd { remote: r, add: 1 }, 128),
            WrOp::AtomicFetchAndAdd {
                remote: RemoteAddr::new(0x1080, 7),
                add: 1
            }
        );
    }
}
