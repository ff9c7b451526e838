//! Drives the sans-IO halves of a QP from buffered bytes: decodes frames from a
//! [`Reader`], hands requests to the QP's [`Responder`] and responses to its
//! [`Requester`], and tells the reader where payloads go. One connection carries both
//! directions of an RC connection (the peer's requests and the responses to ours), as the
//! two halves of an IB RC connection share one path; acknowledgements for the peer thus
//! leave in the same write as our next request, and pass the requests queued before them
//! (see [`tx`](crate::tx)).
//!
//! Used by the progress engine and, byte for byte the same, by the in-memory test link.

use std::time::Instant;

use verbs_api::{WcStatus, WorkCompletion};

use crate::faults::ForcedRnr;
use crate::memory::{MrTable, Seg};
use crate::requester::{ReadSink, Requester};
use crate::responder::{Incoming, Responder};
use crate::rx::{Event, Reader};
use crate::tx::TxQueue;
use crate::wire::Frame;

/// Why driving stopped early.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The QP must go to ERR (a completion with this status was produced). Call again
    /// afterwards (the responder with `accepting = false`) to keep the stream in sync.
    Fatal(WcStatus),
    /// The peer broke the protocol (malformed frame, a frame its role cannot send, too
    /// many requests without reading the responses): close the connection and move the
    /// QP to ERR.
    Protocol(String),
}

/// Whose payload the reader is filling between calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PayloadOwner {
    /// A request's payload (SEND, WRITE) for the responder.
    Responder,
    /// A READ response's payload for the requester, with the READ's PSN.
    Requester(u32),
    /// Nobody's: it is dropped.
    Nobody,
}

/// The halves of a QP a connection serves, and the state kept between calls.
pub struct Sides<'a> {
    /// The requester (reads responses), if this end sends requests.
    pub req: Option<&'a mut Requester>,
    /// The responder (reads requests), if this end answers them.
    pub resp: Option<&'a mut Responder>,
    /// Whether the QP accepts requests (RTR, RTS, SQD); otherwise they are dropped
    /// silently, as an HCA drops packets for a QP in another state.
    pub accepting: bool,
    /// Completions of the requester.
    pub send_wc: &'a mut Vec<WorkCompletion>,
    /// Completions of the responder (with the solicited bit).
    pub recv_wc: &'a mut Vec<(WorkCompletion, bool)>,
    /// Fault injection's RNR for SEND / WRITE_WITH_IMM requests, whatever the receive
    /// queue holds (see [`Responder::on_request_rnr`]).
    pub forced_rnr: &'a mut ForcedRnr,
}

/// State of one connection's reader between calls.
#[derive(Debug, Default)]
pub struct DriveState {
    owner: Option<PayloadOwner>,
}

/// Processes buffered frames until the reader needs more bytes or an error stops it.
/// Responses to the peer's requests are queued in `tx`, followed by one ACK for the
/// requests acknowledged so far once they carried at least `ack_after` bytes of payload
/// or one of them asked for it (AckReq) (0: always; `usize::MAX`: never, the ACK stays
/// owed to the responder, to leave with the next write, AckReq or not; in between: ACKs
/// coalesced over several calls while requests stream in).
/// `max_unsent_reads` bounds the responses
/// (READ and atomic responses, ACKs, NAKs) queued but not yet written: a peer that keeps
/// sending requests without reading the answers exceeds it and is cut off instead of
/// growing this side's memory.
#[allow(clippy::too_many_arguments)]
pub fn drive(
    sides: &mut Sides<'_>,
    reader: &mut Reader,
    mrs: &MrTable,
    tx: &mut TxQueue,
    now: Instant,
    st: &mut DriveState,
    max_unsent_reads: usize,
    ack_after: usize,
) -> Result<(), Stop> {
    loop {
        let ev = match reader.next_event() {
            Ok(Some(ev)) => ev,
            Ok(None) => break,
            Err(e) => return Err(Stop::Protocol(format!("malformed frame: {e}"))),
        };
        match ev {
            Event::Frame(f) if f.is_request() => {
                let Some(resp) = sides.resp.as_deref_mut() else {
                    return Err(Stop::Protocol(format!("unexpected request: {f}")));
                };
                let len = f.payload_len() as usize;
                let (incoming, fatal) = if sides.accepting {
                    match resp.on_request_rnr(&f, mrs, tx, sides.recv_wc, sides.forced_rnr) {
                        Ok(i) => (i, None),
                        Err(fatal) => (Incoming::Discard, Some(fatal.0)),
                    }
                } else {
                    if resp.is_unreliable() {
                        resp.uc_unaccepted(&f);
                    }
                    (Incoming::Discard, None)
                };
                match incoming {
                    Incoming::Sink(segs) if len > 0 => {
                        reader.expect_payload(len, Some(segs));
                        st.owner = Some(PayloadOwner::Responder);
                    }
                    Incoming::Sink(segs) => resp.payload_done(segs, mrs, sides.recv_wc),
                    Incoming::Discard if len > 0 => {
                        reader.expect_payload(len, None);
                        st.owner = Some(PayloadOwner::Nobody);
                    }
                    Incoming::Discard => {}
                }
                if let Some(status) = fatal {
                    return Err(Stop::Fatal(status));
                }
                if tx.unsent_replies() > max_unsent_reads {
                    return Err(Stop::Protocol(format!(
                        "more than {max_unsent_reads} responses queued for a peer that does not read them"
                    )));
                }
            }
            Event::Frame(f) if f.is_response() => {
                let Some(req) = sides.req.as_deref_mut() else {
                    return Err(Stop::Protocol(format!("unexpected response: {f}")));
                };
                if req.is_unreliable() && !matches!(f, Frame::Ack { .. }) {
                    return Err(Stop::Protocol(format!(
                        "{f} on a UC connection (a UC responder sends ACKs only)"
                    )));
                }
                let len = f.payload_len() as usize;
                match req.on_response(&f, now, sides.send_wc) {
                    Ok(ReadSink::Into { psn, segs }) if len > 0 => {
                        reader.expect_payload(len, Some(segs));
                        st.owner = Some(PayloadOwner::Requester(psn));
                    }
                    Ok(ReadSink::Into { psn, segs }) => req.read_done(psn, segs, now, sides.send_wc),
                    Ok(ReadSink::Discard) => {
                        if len > 0 {
                            reader.expect_payload(len, None);
                            st.owner = Some(PayloadOwner::Nobody);
                        }
                    }
                    Err(fatal) => {
                        if len > 0 {
                            reader.expect_payload(len, None);
                            st.owner = Some(PayloadOwner::Nobody);
                        }
                        return Err(Stop::Fatal(fatal.0));
                    }
                }
            }
            Event::Frame(f) => return Err(Stop::Protocol(format!("unexpected frame: {f}"))),
            Event::PayloadDone(segs) => payload_done(sides, st, segs, mrs, now),
            Event::PayloadLost(segs) => payload_lost(sides, st, segs, tx)?,
        }
    }
    if let Some(resp) = sides.resp.as_deref_mut() {
        // (A UC responder acknowledges in every state: see `responder::uc`.)
        if (sides.accepting || resp.is_unreliable())
            && (resp.owed_bytes() >= ack_after || (resp.ack_asked() && ack_after != usize::MAX))
        {
            resp.flush_ack(tx);
        }
    }
    Ok(())
}

fn payload_done(sides: &mut Sides<'_>, st: &mut DriveState, segs: Vec<Seg>, mrs: &MrTable, now: Instant) {
    match st.owner.take() {
        Some(PayloadOwner::Responder) => {
            if let (true, Some(resp)) = (sides.accepting, sides.resp.as_deref_mut()) {
                resp.payload_done(segs, mrs, sides.recv_wc);
            }
        }
        Some(PayloadOwner::Requester(psn)) => {
            if let Some(req) = sides.req.as_deref_mut() {
                req.read_done(psn, segs, now, sides.send_wc);
            }
        }
        Some(PayloadOwner::Nobody) | None => {}
    }
}

/// A payload's region was deregistered while the payload arrived: the request (a WRITE or
/// SEND here) or the READ (its local sink) fails instead of completing successfully.
fn payload_lost(
    sides: &mut Sides<'_>,
    st: &mut DriveState,
    segs: Vec<Seg>,
    tx: &mut TxQueue,
) -> Result<(), Stop> {
    let fatal = match st.owner.take() {
        Some(PayloadOwner::Responder) => match (sides.accepting, sides.resp.as_deref_mut()) {
            (true, Some(resp)) => resp.payload_lost(segs, tx, sides.recv_wc),
            _ => None,
        },
        Some(PayloadOwner::Requester(psn)) => sides
            .req
            .as_deref_mut()
            .and_then(|req| req.read_lost(psn, segs, sides.send_wc)),
        Some(PayloadOwner::Nobody) | None => None,
    };
    match fatal {
        Some(f) => Err(Stop::Fatal(f.0)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::responder::RespAttrs;
    use crate::wire::{Frame, NakCode, MAX_HDR_LEN};
    use verbs_api::AccessFlags;

    /// A peer that sends `copies` of `f` and never reads: each 32 KiB the reader takes is
    /// one pass of `drive`. Returns how it ended and what was queued for the peer.
    fn flood(resp: &mut Responder, f: Frame, copies: usize) -> (Result<(), Stop>, TxQueue) {
        let mrs = MrTable::default();
        let mut h = [0u8; MAX_HDR_LEN];
        let n = f.encode(&mut h);
        let bytes: Vec<u8> = h[..n].iter().copied().cycle().take(n * copies).collect();
        let mut reader = Reader::new();
        let mut tx = TxQueue::new();
        let mut st = DriveState::default();
        let (mut swc, mut rwc) = (Vec::new(), Vec::new());
        let mut off = 0;
        while off < bytes.len() {
            off += reader.feed(&bytes[off..]);
            let mut sides = Sides {
                req: None,
                resp: Some(resp),
                accepting: true,
                send_wc: &mut swc,
                recv_wc: &mut rwc,
                forced_rnr: &mut ForcedRnr::default(),
            };
            let r = drive(
                &mut sides,
                &mut reader,
                &mrs,
                &mut tx,
                Instant::now(),
                &mut st,
                1024,
                0,
            );
            if r.is_err() {
                return (r, tx);
            }
        }
        (Ok(()), tx)
    }

    fn responder() -> Responder {
        let mut r = Responder::new(2, 1, 4, 1);
        r.connect(RespAttrs {
            rq_psn: 100,
            min_rnr_timer: 1,
        });
        r.access = AccessFlags::REMOTE;
        r.max_dest_rd_atomic = 16;
        r
    }

    /// Found by the `responder` fuzz target: 64 Ki copies of an already executed SEND
    /// queued 64 Ki ACKs (1 MiB) for a peer that never read them. Now one ACK per pass.
    #[test]
    fn a_flood_of_duplicates_queues_one_ack_per_pass() {
        let mut resp = responder();
        let dup = Frame::Send {
            psn: 99,
            len: 0,
            imm: None,
            solicited: false,
            ack_req: false,
            inv: None,
        };
        let (r, mut tx) = flood(&mut resp, dup, 64 * 1024);
        assert_eq!(r, Ok(()));
        let mut b = Vec::new();
        tx.drain_into(&mut b);
        // 1 MiB arrives in 32 KiB reads: 32 passes, one ACK each.
        assert_eq!(b.len(), 32 * 16, "{} bytes queued", b.len());
        assert_eq!(Frame::decode(&b).unwrap(), Some((Frame::Ack { psn: 99 }, 16)));
    }

    /// Found by the `responder` fuzz target: a SEND resent without pause to a QP with no
    /// receive posted earns an RNR NAK per copy; a peer that never reads them is cut off
    /// once 1024 responses wait, instead of growing this side's memory without bound.
    #[test]
    fn a_peer_that_never_reads_its_naks_is_cut_off() {
        let mut resp = responder();
        let send = Frame::Send {
            psn: 100,
            len: 0,
            imm: None,
            solicited: false,
            ack_req: false,
            inv: None,
        };
        let (r, tx) = flood(&mut resp, send, 64 * 1024);
        assert!(
            matches!(r, Err(Stop::Protocol(ref m)) if m.contains("does not read")),
            "{r:?}"
        );
        assert_eq!(tx.unsent_replies(), 1025);
        assert_eq!(tx.pending(), 1025 * 16);
        let mut tx = tx;
        let mut b = Vec::new();
        tx.drain_into(&mut b);
        assert_eq!(
            Frame::decode(&b).unwrap(),
            Some((
                Frame::Nak {
                    psn: 100,
                    code: NakCode::Rnr { timer: 1 },
                    reason: None
                },
                16
            ))
        );
    }
}
