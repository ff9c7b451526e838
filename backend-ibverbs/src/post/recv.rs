//! Receives: `ibv_post_recv` and `ibv_post_srq_recv` (`man ibv_post_recv`,
//! `man ibv_post_srq_recv`), one code path for a QP's receive queue and an SRQ
//! ([`RecvQueue`]), with the provider call and the error's wording as the only differences.

use super::*;

/// Where receive WRs go: a QP's receive queue (`ibv_post_recv`) or an SRQ
/// (`ibv_post_srq_recv`).
pub(crate) trait RecvQueue {
    /// The provider's post call.
    ///
    /// # Safety
    ///
    /// `wr` heads a NULL-terminated list of fully initialized WRs whose SGE arrays stay
    /// valid for the call; `bad` is writable.
    unsafe fn post_raw(&self, wr: *mut ibv_recv_wr, bad: *mut *mut ibv_recv_wr) -> c_int;

    /// The error of a post the provider refused with `errno` at WR `index`.
    fn post_error(&self, errno: i32, index: usize, wr_id: u64) -> PostError;
}

impl RecvQueue for IbvQp {
    #[inline(always)]
    unsafe fn post_raw(&self, wr: *mut ibv_recv_wr, bad: *mut *mut ibv_recv_wr) -> c_int {
        // SAFETY: the QP is live; the caller passes a valid WR list and out-pointer.
        unsafe { ibv_post_recv(self.raw, wr, bad) }
    }

    #[inline(always)]
    fn post_error(&self, errno: i32, index: usize, wr_id: u64) -> PostError {
        post_error(self, QueueKind::Recv, errno, index, wr_id)
    }
}

/// `ibv_post_recv` / `ibv_post_srq_recv` for `wrs`.
#[inline]
pub(crate) fn post_recv<Q: RecvQueue>(q: &Q, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
    if let [wr] = wrs {
        if wr.sg_list.len() <= ONE_WR_SGES {
            return post_one_recv(q, wr);
        }
    }
    post_recv_list(q, wrs)
}

/// One receive WR of at most [`ONE_WR_SGES`] SGEs, built on the stack and posted.
#[inline(always)]
fn post_one_recv<Q: RecvQueue>(q: &Q, wr: &RecvWr<'_>) -> Result<(), PostError> {
    let mut sges = [const { MaybeUninit::<ibv_sge>::uninit() }; ONE_WR_SGES];
    for (d, s) in sges.iter_mut().zip(wr.sg_list) {
        d.write(sge_to_raw(s));
    }
    let mut raw = ibv_recv_wr {
        wr_id: wr.wr_id,
        next: null_mut(),
        sg_list: if wr.sg_list.is_empty() {
            null_mut()
        } else {
            sges.as_mut_ptr().cast::<ibv_sge>()
        },
        // fits: at most ONE_WR_SGES
        num_sge: wr.sg_list.len() as c_int,
    };
    let mut bad: *mut ibv_recv_wr = null_mut();
    // SAFETY: `raw` is a fully initialized WR whose `num_sge` SGEs are initialized in
    // `sges`; both outlive the call. Receive buffers are written by the HCA only after it
    // checked them through their lkey.
    let rc = unsafe { q.post_raw(&mut raw, &mut bad) };
    if rc == 0 {
        return Ok(());
    }
    Err(q.post_error(rc_errno(rc), 0, wr.wr_id))
}

/// `ibv_post_recv` / `ibv_post_srq_recv` for a list, or a WR with many SGEs.
#[inline(never)]
fn post_recv_list<Q: RecvQueue>(q: &Q, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
    if wrs.is_empty() {
        return Ok(());
    }
    if let Some((i, wr)) = wrs
        .iter()
        .enumerate()
        .find(|(_, w)| c_int::try_from(w.sg_list.len()).is_err())
    {
        if i > 0 {
            post_recv_list(q, &wrs[..i])?;
        }
        return Err(PostError {
            index: i,
            wr_id: wr.wr_id,
            error: Error::invalid(
                "ibv_post_recv",
                format!("{} SGEs exceed INT_MAX", wr.sg_list.len()),
            ),
        });
    }
    let nsge: usize = wrs.iter().map(|w| w.sg_list.len()).sum();
    with_scratch::<ibv_sge, STACK_SGES, _>(nsge, |sges| {
        with_scratch::<ibv_recv_wr, STACK_WRS, _>(wrs.len(), |raw_wrs| {
            let sge_base = sges.as_mut_ptr().cast::<ibv_sge>();
            let wr_base = raw_wrs.as_mut_ptr().cast::<ibv_recv_wr>();
            let mut off = 0;
            for (i, wr) in wrs.iter().enumerate() {
                for (j, s) in wr.sg_list.iter().enumerate() {
                    // SAFETY: off + j < nsge, the length of `sges`.
                    unsafe { sge_base.add(off + j).write(sge_to_raw(s)) };
                }
                let raw = ibv_recv_wr {
                    wr_id: wr.wr_id,
                    next: if i + 1 < wrs.len() {
                        // SAFETY: i + 1 < wrs.len(), the length of `raw_wrs`.
                        unsafe { wr_base.add(i + 1) }
                    } else {
                        null_mut()
                    },
                    sg_list: if wr.sg_list.is_empty() {
                        null_mut()
                    } else {
                        // SAFETY: off < nsge.
                        unsafe { sge_base.add(off) }
                    },
                    num_sge: wr.sg_list.len() as c_int,
                };
                // SAFETY: i < wrs.len(), the length of `raw_wrs`.
                unsafe { wr_base.add(i).write(raw) };
                off += wr.sg_list.len();
            }
            let mut bad: *mut ibv_recv_wr = null_mut();
            // SAFETY: `wr_base` heads a NULL-terminated list of fully initialized WRs
            // whose SGE arrays live in `sges`. Receive buffers are written by the HCA only
            // after it checked them through their lkey.
            let rc = unsafe { q.post_raw(wr_base, &mut bad) };
            if rc == 0 {
                return Ok(());
            }
            let index = bad_index(wr_base, bad, wrs.len());
            Err(q.post_error(rc_errno(rc), index, wrs[index].wr_id))
        })
    })
}
