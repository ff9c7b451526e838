//! Posting to the send queue: what `ibv_post_send` checks at post time (capacity,
//! SGE count, inline size and source, opcodes the transport refuses), inline data
//! copied as the WR is queued.

use super::*;

/// Where a send WR's inline data comes from, as [`Requester::post_wqe`] reads it.
trait InlineSource {
    /// The WR's SGE count, as the post-time check counts it.
    fn sges(&self, wr: &SendWr<'_>) -> usize;
    /// The WR's data length.
    fn len(&self, wr: &SendWr<'_>) -> u64;
    /// Appends the data to `out`; false if the data cannot be read (an SGE outside the
    /// region its lkey names).
    fn gather(&self, wr: &SendWr<'_>, out: &mut Vec<u8>) -> bool;
}

/// Inline data named by the WR's SGEs, in registered memory (the verbs API's rule).
struct FromSges<'m>(&'m MrTable);

impl InlineSource for FromSges<'_> {
    #[inline(always)]
    fn sges(&self, wr: &SendWr<'_>) -> usize {
        wr.sg_list.len()
    }
    #[inline(always)]
    fn len(&self, wr: &SendWr<'_>) -> u64 {
        wr.total_len()
    }
    #[inline(always)]
    fn gather(&self, wr: &SendWr<'_>, out: &mut Vec<u8>) -> bool {
        // Inline SGEs are read now, by the CPU; they must lie in registered memory of
        // this device (the lkey names the region, of any PD: an HCA does not check an
        // inline lkey) so that no stray pointer is read. (`Ok(false)`: deregistered
        // between the check and the copy.)
        self.0.gather_inline(wr.sg_list, out) == Ok(true)
    }
}

/// Inline data the caller read itself, in pieces (see [`Requester::post_with`]).
struct Pieces<'p>(&'p [&'p [u8]]);

impl InlineSource for Pieces<'_> {
    fn sges(&self, _: &SendWr<'_>) -> usize {
        self.0.len()
    }
    fn len(&self, _: &SendWr<'_>) -> u64 {
        self.0.iter().map(|b| b.len() as u64).sum()
    }
    fn gather(&self, _: &SendWr<'_>, out: &mut Vec<u8>) -> bool {
        for p in self.0 {
            out.extend_from_slice(p);
        }
        true
    }
}

/// The SGE count and length of a send WR as the post-time checks count them: of
/// `pieces` when its inline data comes as pieces (see [`Requester::post_with`]), else of
/// its gather list.
pub fn gather_shape(wr: &SendWr<'_>, pieces: Option<&[&[u8]]>) -> (usize, u64) {
    match pieces {
        Some(p) if wr.send_flags.contains(SendFlags::INLINE) => (Pieces(p).sges(wr), Pieces(p).len(wr)),
        _ => (wr.sg_list.len(), wr.total_len()),
    }
}

/// The status of a SEND or WRITE (any transport) whose gather list was refused for `e`:
/// a key that names no region of the QP's PD (none at all, or another PD's) takes the
/// profile's status (`Switches::send_bad_lkey`: rxe's `lookup_mr()` refuses both alike);
/// an SGE that leaves its region is a local protection error everywhere.
pub(crate) fn gather_status(sw: &Switches, e: LocalAccessError) -> WcStatus {
    match e {
        LocalAccessError::BadKey | LocalAccessError::WrongPd => sw.send_bad_lkey,
        LocalAccessError::NoLocalWrite | LocalAccessError::OutOfBounds => WcStatus::LocProtErr,
    }
}

impl Requester {
    /// Queues a WQE. Checks what `ibv_post_send` checks at post time: capacity (ENOMEM),
    /// SGE count and inline size (EINVAL). Inline data is copied now. A WR that names a
    /// UD destination (`wr.ud`) is refused here ([`PostCheck::UdDestination`]): UD sends
    /// go through [`Requester::post_ud`].
    #[cfg(any(test, feature = "internals"))]
    pub fn post(&mut self, wr: &SendWr<'_>, mrs: &MrTable) -> Result<(), PostCheck> {
        self.connected_dest(wr)?;
        self.post_wqe(wr, None, FromSges(mrs))
    }

    /// Queues an `IBV_WR_BIND_MW` whose window and region the driver resolved into
    /// `bind` (the checks of [`Requester::post`]; the bind itself runs in its turn).
    pub fn post_bind(&mut self, wr: &SendWr<'_>, bind: BindReq) -> Result<(), PostCheck> {
        self.connected_dest(wr)?;
        self.post_wqe(wr, None, Pieces(&[]))?;
        self.sq.back_mut().expect("just queued").bind = Some(bind);
        Ok(())
    }

    /// A WR posted to an RC or UC QP has no UD destination, and a UD QP's needs one.
    fn connected_dest(&self, wr: &SendWr<'_>) -> Result<(), PostCheck> {
        if self.ud {
            return Err(PostCheck::NoUdDestination);
        }
        if wr.ud.is_some() {
            return Err(PostCheck::UdDestination);
        }
        Ok(())
    }

    /// [`Requester::post`], with an inline WR's data (`IBV_SEND_INLINE` set) given as
    /// `pieces` the caller read itself instead of through `wr.sg_list` (which is then
    /// ignored): a C program's inline data may lie in memory that is not registered.
    /// `None` reads the SGEs, which must name registered memory.
    #[inline]
    pub fn post_with(
        &mut self,
        wr: &SendWr<'_>,
        mrs: &MrTable,
        pieces: Option<&[&[u8]]>,
    ) -> Result<(), PostCheck> {
        self.connected_dest(wr)?;
        self.post_from(wr, mrs, None, pieces)
    }

    /// [`Requester::post_wqe`] with the inline data's source.
    #[inline]
    pub(super) fn post_from(
        &mut self,
        wr: &SendWr<'_>,
        mrs: &MrTable,
        route: Option<UdRoute>,
        pieces: Option<&[&[u8]]>,
    ) -> Result<(), PostCheck> {
        match pieces {
            Some(p) if wr.send_flags.contains(SendFlags::INLINE) => self.post_wqe(wr, route, Pieces(p)),
            _ => self.post_wqe(wr, route, FromSges(mrs)),
        }
    }

    // One copy per source of inline data: the verbs API's path (`FromSges`) is as if the
    // other did not exist.
    fn post_wqe(
        &mut self,
        wr: &SendWr<'_>,
        route: Option<UdRoute>,
        data: impl InlineSource,
    ) -> Result<(), PostCheck> {
        if self.pending() >= self.cap {
            return Err(PostCheck::Full);
        }
        if self.pending() as u64 + self.held_unpolled() >= self.cap as u64 {
            return Err(PostCheck::FullUnpolled);
        }
        if data.sges(wr) > self.max_sge as usize {
            return Err(PostCheck::TooManySge);
        }
        let row = opcode_table::row(wr.op.opcode());
        if self.uc && self.sw.opcode_checked_at_post && !row.allowed_on(QpType::Uc) {
            return Err(PostCheck::NotUc);
        }
        if let WrOp::AtomicCmpAndSwp { remote, .. } | WrOp::AtomicFetchAndAdd { remote, .. } = wr.op {
            if self.sw.misaligned_atomic_einval && remote.addr % 8 != 0 {
                return Err(PostCheck::MisalignedAtomic);
            }
        }
        if wr.op == WrOp::BindMw && (wr.bind.is_none() || !wr.sg_list.is_empty()) {
            return Err(PostCheck::BadBind);
        }
        let inline = wr.send_flags.contains(SendFlags::INLINE);
        let mut w = self.spare.pop().unwrap_or_else(|| Box::new(SendWqe::blank()));
        w.inline_data.clear();
        w.bind = None;
        if inline {
            if !row.gathers {
                self.spare.push(w);
                return Err(PostCheck::InlineNotAllowed);
            }
            if data.len(wr) > self.max_inline as u64 {
                self.spare.push(w);
                return Err(PostCheck::InlineTooLong);
            }
            if !data.gather(wr, &mut w.inline_data) {
                self.spare.push(w);
                return Err(PostCheck::BadInlineSge);
            }
        }
        w.wr_id = wr.wr_id;
        w.op = wr.op;
        w.fence = wr.send_flags.contains(SendFlags::FENCE);
        w.solicited = wr.send_flags.contains(SendFlags::SOLICITED);
        w.signaled = self.sig_all || wr.send_flags.contains(SendFlags::SIGNALED);
        w.inline = inline;
        w.sges.clear();
        if !inline {
            // (Inline data was copied above: its SGEs are not read again.)
            w.sges.extend_from_slice(wr.sg_list);
        }
        w.local.clear();
        w.len = data.len(wr);
        w.psn = 0;
        w.pkts = 1;
        w.done = 0;
        w.sent = false;
        w.built_once = false;
        w.placed = false;
        w.reported = false;
        w.status = None;
        w.vendor_err = 0;
        w.route = route;
        self.sq.push_back(w);
        Ok(())
    }
}
