//! The connection: the peer's bytes through the reader and the engine's passes, as
//! `progress.rs` runs them ([`Harness::deliver`], [`Harness::pass`]); what the QP queues
//! for the peer, read and decoded ([`Harness::peer_reads`]); a fatal error moving the QP
//! to ERR ([`Harness::enter_error`]).

use backend_sim_proto::engine::{drive, Sides, Stop};
use backend_sim_proto::faults::ForcedRnr;
use backend_sim_proto::responder::DatagramSource;
use backend_sim_proto::wire::{Frame, MAX_DATAGRAM};
use verbs_api::WcStatus;

use crate::harness::Harness;
use crate::limits::MAX_UNSENT_READS;

impl Harness {
    /// Our side transmits (as `process` does for a QP in RTS), and the peer reads
    /// everything queued for it; what it reads must be well-formed.
    pub(crate) fn peer_reads(&mut self) {
        if self.ud {
            return self.peer_reads_datagrams();
        }
        if !self.err
            && self
                .req
                .poll_transmit(&self.mrs, self.now, &mut self.tx, 128, &mut self.send_wc)
                .is_err()
        {
            self.enter_error();
        }
        self.check_completions();
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        self.tx.drain_into(&mut out);
        let mut b = &out[..];
        while !b.is_empty() {
            let (f, n) = match Frame::decode(b) {
                Ok(Some(x)) => x,
                other => panic!("the QP sent a malformed or cut frame: {other:?}"),
            };
            assert!(f.is_request() || f.is_response(), "the QP sent {f}");
            if f.is_request() {
                if self.sent.len() == 64 {
                    self.sent.pop_front();
                }
                self.sent.push_back(f);
            }
            let skip = n + f.payload_len() as usize;
            assert!(skip <= b.len(), "the QP sent {f} without all of its payload");
            b = &b[skip..];
        }
        self.out = out;
        if self.err {
            self.err_pending = 0;
        }
    }

    /// UD: our side hands its datagrams on (as the sim's `Datagrams::transmit` does, all
    /// into the one link), and the peer reads them: each a well-formed datagram from QP
    /// 1, with its payload, at most the MTU.
    fn peer_reads_datagrams(&mut self) {
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        if !self.err {
            let mut from = 0;
            let mut fatal = false;
            while let Some((idx, _)) = self.req.ud_next(from) {
                from = idx + 1;
                if self.req.ud_emit(idx, &self.mrs, &mut out).is_err() {
                    fatal = true;
                    break;
                }
            }
            self.req.take_done(&mut self.send_wc);
            if fatal {
                self.enter_error();
            }
        }
        self.check_completions();
        let mut b = &out[..];
        while !b.is_empty() {
            let (f, n) = match Frame::decode(b) {
                Ok(Some(x)) => x,
                other => panic!("the QP sent a malformed or cut datagram: {other:?}"),
            };
            let Frame::Datagram { src_qpn, len, .. } = f else {
                panic!("a UD QP sent {f}");
            };
            assert_eq!(src_qpn, 1, "a datagram from another QP");
            assert!(len <= MAX_DATAGRAM, "a datagram above the MTU: {len}");
            let skip = n + len as usize;
            assert!(skip <= b.len(), "the QP sent {f} without all of its payload");
            b = &b[skip..];
        }
        self.out = out;
    }

    /// UD: the peer's bytes arrive on the link; each whole datagram for the QP goes to its
    /// responder (unless the QP is in ERR: dropped, as for a QP in a state that does not
    /// receive), others are dropped; anything else closes the link.
    fn deliver_datagrams(&mut self, bytes: &[u8]) {
        let mut off = 0;
        while off < bytes.len() && !self.closed {
            let end = off.saturating_add(self.chunk).min(bytes.len());
            while off < end && !self.closed {
                let n = self.link.feed(&bytes[off..end]);
                assert!(n > 0, "the link takes no bytes after a complete pass");
                off += n;
                loop {
                    match self.link.next_datagram() {
                        Ok(Some((f, payload))) => {
                            let Frame::Datagram { dst_qpn: 2, .. } = f else {
                                continue;
                            };
                            if self.err {
                                continue;
                            }
                            let src = DatagramSource { gid: [7; 16], lid: 7 };
                            let r = self
                                .resp
                                .on_datagram(&f, payload, &src, &self.mrs, &mut self.recv_wc);
                            if r.is_err() {
                                self.check_completions();
                                self.enter_error();
                            }
                            self.check_completions();
                        }
                        Ok(None) => break,
                        Err(_) => {
                            self.closed = true;
                            break;
                        }
                    }
                }
            }
        }
    }

    /// The peer's bytes arrive, `chunk` bytes at a time, each piece fully processed.
    pub(crate) fn deliver(&mut self, bytes: &[u8]) {
        self.streamed += bytes.len();
        if self.ud {
            return self.deliver_datagrams(bytes);
        }
        let mut off = 0;
        while off < bytes.len() && !self.closed {
            let end = off.saturating_add(self.chunk).min(bytes.len());
            while off < end && !self.closed {
                let n = self.rx.feed(&bytes[off..end]);
                assert!(n > 0, "the reader takes no bytes after a complete pass");
                off += n;
                self.pass();
            }
        }
    }

    /// One pass of the engine over the buffered bytes, as `progress.rs` runs it.
    pub(crate) fn pass(&mut self) {
        for _ in 0..8 {
            let mut sides = Sides {
                req: Some(&mut self.req),
                resp: Some(&mut self.resp),
                accepting: !self.err,
                send_wc: &mut self.send_wc,
                recv_wc: &mut self.recv_wc,
                forced_rnr: &mut ForcedRnr::default(),
            };
            let r = drive(
                &mut sides,
                &mut self.rx,
                &self.mrs,
                &mut self.tx,
                self.now,
                &mut self.st,
                MAX_UNSENT_READS,
                0,
            );
            match r {
                Ok(()) => {
                    self.check_completions();
                    self.check_bounds();
                    return;
                }
                Err(Stop::Fatal(status)) => {
                    assert_ne!(status, WcStatus::Success);
                    self.check_completions();
                    self.enter_error();
                }
                Err(Stop::Protocol(_)) => {
                    // The connection is closed and the QP goes to ERR.
                    self.check_completions();
                    self.enter_error();
                    self.closed = true;
                    self.check_bounds();
                    return;
                }
            }
        }
        panic!("drive keeps stopping with Fatal on a QP in ERR");
    }

    /// The QP goes to ERR: both queues flushed, nothing left outstanding.
    pub(crate) fn enter_error(&mut self) {
        if self.err {
            return;
        }
        self.err = true;
        self.req.flush(&mut self.send_wc);
        self.resp.flush(&mut self.recv_wc);
        self.check_completions();
        assert!(
            self.recvs.is_empty(),
            "receives left after the flush: {:?}",
            self.recvs
        );
        assert_eq!(self.resp.posted(), 0);
        assert_eq!(self.req.outstanding(), 0, "send WQEs left after the flush");
        self.send_ids_done = true;
        self.err_pending = self.tx.pending();
    }
}
