//! Turning WQEs into request frames: the PSN window and `max_rd_atomic` limits, fences,
//! the AckReq bit, local operations (binds, invalidations) executed in their turn, and
//! the gather checks a request's local memory meets as it is built (IBA 9.7.1, 10.8.3.3).

use super::*;

impl Requester {
    /// Whether the SEND or WRITE about to be sent asks for an ACK (the AckReq bit, IBA
    /// 9.2; the responder acknowledges it at once instead of coalescing: see
    /// [`wire::F_ACK_REQ`](crate::wire::F_ACK_REQ)). One in every half of the WQEs
    /// outstanding (posted, not complete) asks, every one when at most two are
    /// outstanding: an ACK comes back while half of the window is still on its way, so
    /// the send queue never runs dry waiting for it, and a deep stream is not answered
    /// with one ACK per message (each a `sendmsg` on the responder and a segment for this
    /// side to take in). The responder also acknowledges whenever the stream pauses
    /// (the requester ran out of WQEs or of room), so nothing waits on a request that
    /// did not ask.
    pub(super) fn ack_req_due(&mut self) -> bool {
        self.since_ack_req += 1;
        let due = self.since_ack_req >= (self.sq.len() / 2).max(1);
        if due {
            self.since_ack_req = 0;
        }
        due
    }

    /// Builds request frames for as many WQEs as may go now, into `tx`. Local errors
    /// complete the WQE and return [`Fatal`]. Notices of executed WQEs built meanwhile
    /// leave coalesced ([`run`]), all of them before this returns.
    pub fn poll_transmit(
        &mut self,
        mrs: &MrTable,
        now: Instant,
        tx: &mut TxQueue,
        budget: usize,
        out: &mut Vec<WorkCompletion>,
    ) -> Result<usize, Fatal> {
        let sent = self.transmit(mrs, now, tx, budget, out);
        self.flush_notices(tx);
        sent
    }

    fn transmit(
        &mut self,
        mrs: &MrTable,
        now: Instant,
        tx: &mut TxQueue,
        budget: usize,
        out: &mut Vec<WorkCompletion>,
    ) -> Result<usize, Fatal> {
        if let Some(t) = self.rnr_wait {
            if now < t {
                return Ok(0);
            }
            self.end_rnr_wait();
        }
        let mut sent = 0;
        let max_rd = self.attrs.max_rd_atomic.max(1) as u32;
        while self.next < self.sq.len() && sent < budget && !(self.draining && self.next >= self.started) {
            let idx = self.next;
            if self.sq[idx].op.is_local() {
                if matches!(self.sq[idx].op, WrOp::LocalInv { .. }) && idx > 0 {
                    // The local invalidate fence: every WQE before it completes first.
                    break;
                }
                if self.sq[idx].status.is_none() {
                    if let Err(status) = self.execute_local(idx, mrs) {
                        self.sq[idx].status = Some(status);
                        self.retire(out);
                        return Err(Fatal(status));
                    }
                }
                // (Executed once: a rewind passes over it.)
                let w = &mut self.sq[idx];
                w.sent = true;
                w.psn = self.psn;
                self.next += 1;
                self.started = self.started.max(self.next);
                self.retire(out);
                continue;
            }
            let (is_rd, fence) = {
                let w = &self.sq[idx];
                (w.op.is_read_or_atomic() && !w.placed, w.fence)
            };
            if fence && self.rd_inflight > 0 {
                break;
            }
            if is_rd && self.rd_inflight >= max_rd {
                break;
            }
            let psn = self.psn;
            let packets = self.packets_of(idx);
            if !self.uc && !self.within_psn_window(psn, packets) {
                break;
            }
            if self.uc {
                // (Called with a connection: nothing waits for one any more.)
                self.link_wait = None;
            }
            match self.build(idx, psn, mrs, tx) {
                Ok(()) => {}
                Err(status) => {
                    self.sq[idx].status = Some(status);
                    self.retire(out);
                    return Err(Fatal(status));
                }
            }
            let w = &mut self.sq[idx];
            w.psn = psn;
            w.pkts = packets;
            w.sent = true;
            self.psn = psn::add(psn, packets);
            if w.holds_rd_atomic() {
                self.rd_inflight += 1;
            } else if w.executed() && !w.reported {
                // Executed by the driver: it completes now, or once those before it have.
                self.retire(out);
            }
            self.next += 1;
            self.started = self.started.max(self.next);
            sent += 1;
            if self.ack_deadline.is_none() && !self.uc {
                self.ack_deadline = self.attrs.timeout.map(|t| now + t);
            }
        }
        Ok(sent)
    }

    /// The PSNs WQE `idx` takes: atomics one, a READ those of its response's packets,
    /// a SEND or WRITE one per packet of the path MTU.
    fn packets_of(&self, idx: usize) -> u32 {
        let w = &self.sq[idx];
        if w.op.is_atomic() {
            1
        } else {
            psn::packets(w.len, self.path_mtu)
        }
    }

    /// Whether a message of `packets` PSNs from `psn` keeps every PSN outstanding within
    /// [`PSN_WINDOW`] of the oldest unacknowledged one: beyond, an ACK or a NAK could no
    /// longer be told from one of the PSN space's other half, so the requester waits for
    /// ACKs first, as an HCA stops at its window. The first message outstanding always
    /// goes, however long.
    fn within_psn_window(&self, psn: u32, packets: u32) -> bool {
        let oldest = self
            .sq
            .iter()
            .take(self.next)
            .find(|w| w.sent && w.status.is_none());
        match oldest {
            None => true,
            Some(w) => (psn::diff(psn, w.psn).max(0) as u64 + packets as u64) <= PSN_WINDOW as u64,
        }
    }

    /// Executes the local operation WQE `idx` (a bind or a local invalidation), which is
    /// then complete; an error is its completion's status.
    fn execute_local(&mut self, idx: usize, mrs: &MrTable) -> Result<(), WcStatus> {
        let on = OnQp {
            pd: self.pd,
            qpn: self.qpn,
        };
        let owner_checks = self.sw.mw_owner_checks;
        let w = &mut self.sq[idx];
        match w.op {
            WrOp::BindMw => {
                let bind = w.bind.as_ref().expect("a BIND_MW WQE carries its bind");
                if let Err(e) = mrs.bind_window(bind, on, owner_checks) {
                    tracing::debug!(
                        qpn = on.qpn,
                        wr_id = w.wr_id,
                        "BIND_MW failed: {e}: IBV_WC_MW_BIND_ERR"
                    );
                    return Err(WcStatus::MwBindErr);
                }
            }
            WrOp::LocalInv { rkey } => {
                if self.uc && !self.sw.opcode_checked_at_post {
                    // rxe has no LOCAL_INV on UC (rxe_opcode.c): the QP has no such
                    // operation, as for a READ (see `build`).
                    return Err(WcStatus::LocQpOpErr);
                }
                if let Err(e) = mrs.invalidate(rkey, Invalidator::Local(on), owner_checks, true) {
                    tracing::debug!(
                        qpn = on.qpn,
                        wr_id = w.wr_id,
                        rkey = %format_args!("{rkey:#x}"),
                        "LOCAL_INV failed: {e}: IBV_WC_LOC_QP_OP_ERR"
                    );
                    return Err(WcStatus::LocQpOpErr);
                }
            }
            _ => unreachable!("only BIND_MW and LOCAL_INV are local operations"),
        }
        w.status = Some(WcStatus::Success);
        Ok(())
    }

    fn build(&mut self, idx: usize, psn: u32, mrs: &MrTable, tx: &mut TxQueue) -> Result<(), WcStatus> {
        let w = &self.sq[idx];
        if w.executed() {
            // Executed once: every resend is the notice, never the operation again (its
            // own: resends are not coalesced, see [`run`]).
            self.flush_notices(tx);
            self.push_notice(idx, psn, tx);
            return Ok(());
        }
        if w.done > 0 && w.done < w.pkts && w.status.is_none() {
            self.sq[idx].placed = false;
            self.flush_notices(tx);
            return self.build_resumed(idx, psn, mrs, tx);
        }
        let pkts = self.packets_of(idx);
        let direct = self.direct_for(idx);
        let pd = self.pd;
        let ack_req = !self.sq[idx].op.is_read_or_atomic() && self.ack_req_due();
        // This READ/atomic and those already outstanding (see `Frame::Read`).
        let inflight = u16::try_from(self.rd_inflight + 1).unwrap_or(u16::MAX);
        let w = &mut self.sq[idx];
        if w.len > self.max_msg {
            return Err(WcStatus::LocLenErr);
        }
        if self.uc && !opcode_table::row(w.op.opcode()).allowed_on(QpType::Uc) {
            // Accepted at post (`Switches::opcode_checked_at_post` off, as on rxe): UC
            // has no such operation, so it fails as it starts.
            return Err(WcStatus::LocQpOpErr);
        }
        let len = w.len as u32;
        match w.op {
            WrOp::Send
            | WrOp::SendWithImm { .. }
            | WrOp::SendWithInv { .. }
            | WrOp::RdmaWrite { .. }
            | WrOp::RdmaWriteWithImm { .. } => {
                let segs = &mut self.scratch;
                if !w.inline {
                    let sw = &self.sw;
                    mrs.resolve_local(pd, &w.sges, false, segs)
                        .map_err(|e| gather_status(sw, e))?;
                }
                let remote = w.op.remote();
                w.placed = match (&direct, remote) {
                    (Some(d), Some(r)) => d.write(self.dest_qpn, r.rkey, r.addr, segs),
                    _ => false,
                };
                self.flush_notices(tx);
                let w = &mut self.sq[idx];
                let segs = &mut self.scratch;
                let frame = match w.op {
                    WrOp::Send | WrOp::SendWithImm { .. } | WrOp::SendWithInv { .. } => Frame::Send {
                        psn,
                        len,
                        imm: w.op.imm_data(),
                        solicited: w.solicited,
                        ack_req,
                        inv: w.op.invalidate_rkey(),
                    },
                    _ if w.placed => {
                        let r = remote.expect("RDMA op has a remote address");
                        Frame::WritePlaced {
                            psn,
                            len,
                            addr: r.addr,
                            rkey: r.rkey,
                            imm: w.op.imm_data(),
                            solicited: w.solicited,
                            ack_req,
                        }
                    }
                    _ => {
                        let r = remote.expect("RDMA op has a remote address");
                        Frame::Write {
                            psn,
                            len,
                            addr: r.addr,
                            rkey: r.rkey,
                            imm: w.op.imm_data(),
                            solicited: w.solicited,
                            ack_req,
                        }
                    }
                };
                tx.push_frame(&frame);
                if w.placed {
                    segs.clear();
                } else if w.inline {
                    tx.push_bytes(&w.inline_data);
                } else {
                    for s in segs.iter() {
                        tx.push_seg(s);
                    }
                    segs.clear();
                }
            }
            WrOp::RdmaRead { remote } => {
                mrs.resolve_local(pd, &w.sges, true, &mut w.local)
                    .map_err(|_| WcStatus::LocProtErr)?;
                if direct.is_some_and(|d| d.read(self.dest_qpn, remote.rkey, remote.addr, &w.local)) {
                    w.placed = true;
                    let ack_req = self.ack_req_due();
                    self.defer_notice(idx, psn, pkts, ack_req, tx);
                    return Ok(());
                }
                self.flush_notices(tx);
                tx.push_frame(&Frame::Read {
                    psn,
                    len,
                    addr: remote.addr,
                    rkey: remote.rkey,
                    inflight,
                });
            }
            WrOp::AtomicCmpAndSwp { remote, .. } | WrOp::AtomicFetchAndAdd { remote, .. } => {
                let total = mrs
                    .resolve_local(pd, &w.sges, true, &mut w.local)
                    .map_err(|_| WcStatus::LocProtErr)?;
                if total < 8 {
                    return Err(WcStatus::LocLenErr);
                }
                if let Some(d) = direct {
                    if self.place_atomic(idx, &*d, remote)? {
                        let ack_req = self.ack_req_due();
                        self.defer_notice(idx, psn, pkts, ack_req, tx);
                        return Ok(());
                    }
                }
                self.flush_notices(tx);
                let w = &self.sq[idx];
                let frame = match w.op {
                    WrOp::AtomicCmpAndSwp { compare, swap, .. } => Frame::CmpSwap {
                        psn,
                        inflight,
                        addr: remote.addr,
                        rkey: remote.rkey,
                        compare,
                        swap,
                    },
                    WrOp::AtomicFetchAndAdd { add, .. } => Frame::FetchAdd {
                        psn,
                        inflight,
                        addr: remote.addr,
                        rkey: remote.rkey,
                        add,
                    },
                    _ => unreachable!("matched atomics above"),
                };
                tx.push_frame(&frame);
            }
            WrOp::LocalInv { .. } | WrOp::BindMw => unreachable!("local operations build no frame"),
        }
        Ok(())
    }
}
