//! Drives the sans-IO halves of a QP from buffered bytes: decodes frames from a
//! [`Reader`], hands each to the [`Requester`] or [`Responder`], and tells the reader where
//! payloads go. Used by the TCP transport and, byte for byte the same, by the in-memory
//! test link, so that what the tests exercise is what runs on the wire.

use std::time::Instant;

use verbs_api::{WcStatus, WorkCompletion};

use crate::memory::MrTable;
use crate::requester::{ReadSink, Requester};
use crate::responder::{Incoming, Responder};
use crate::rx::{Event, Reader};
use crate::tx::TxQueue;

/// Why driving stopped early.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The QP must go to ERR (a completion with this status was produced); call again
    /// afterwards with `accepting = false` (responder) to keep the stream in sync.
    Fatal(WcStatus),
    /// The peer broke the protocol (malformed frame, frame for the wrong direction): the
    /// connection must be closed and the QP moved to ERR.
    Protocol(String),
}

/// Processes buffered requests until the reader needs more bytes, `tx` holds more than
/// `tx_high` bytes, or an error stops it. When `accepting` is false (the QP is not in
/// RTR/RTS/SQD), requests are dropped silently, as an HCA drops packets for such a QP.
pub fn drive_responder(
    resp: &mut Responder,
    accepting: bool,
    reader: &mut Reader,
    mrs: &MrTable,
    tx: &mut TxQueue,
    out: &mut Vec<(WorkCompletion, bool)>,
    tx_high: usize,
) -> Result<(), Stop> {
    while tx.pending() <= tx_high {
        let ev = match reader.next_event() {
            Ok(Some(ev)) => ev,
            Ok(None) => break,
            Err(e) => return Err(Stop::Protocol(format!("malformed request: {e}"))),
        };
        match ev {
            Event::Frame(f) => {
                if !f.is_request() {
                    return Err(Stop::Protocol(format!(
                        "unexpected frame on a responder connection: {f}"
                    )));
                }
                let len = f.payload_len() as usize;
                let (incoming, fatal) = if accepting {
                    match resp.on_request(&f, mrs, tx, out) {
                        Ok(i) => (i, None),
                        Err(fatal) => (Incoming::Discard, Some(fatal.0)),
                    }
                } else {
                    (Incoming::Discard, None)
                };
                match incoming {
                    Incoming::Sink(segs) if len > 0 => reader.expect_payload(len, Some(segs)),
                    Incoming::Sink(segs) => resp.payload_done(segs, out),
                    Incoming::Discard if len > 0 => reader.expect_payload(len, None),
                    Incoming::Discard => {}
                }
                if let Some(status) = fatal {
                    return Err(Stop::Fatal(status));
                }
            }
            Event::PayloadDone(segs) => {
                if accepting {
                    resp.payload_done(segs, out);
                }
            }
        }
    }
    if accepting {
        resp.flush_ack(tx);
    }
    Ok(())
}

/// Processes buffered responses until the reader needs more bytes or an error stops it.
/// `read_psn` carries the READ whose payload is arriving between calls.
pub fn drive_requester(
    req: &mut Requester,
    reader: &mut Reader,
    now: Instant,
    out: &mut Vec<WorkCompletion>,
    read_psn: &mut Option<u32>,
) -> Result<(), Stop> {
    loop {
        let ev = match reader.next_event() {
            Ok(Some(ev)) => ev,
            Ok(None) => return Ok(()),
            Err(e) => return Err(Stop::Protocol(format!("malformed response: {e}"))),
        };
        match ev {
            Event::Frame(f) => {
                if !f.is_response() {
                    return Err(Stop::Protocol(format!(
                        "unexpected frame on a requester connection: {f}"
                    )));
                }
                let len = f.payload_len() as usize;
                match req.on_response(&f, now, out) {
                    Ok(ReadSink::Into { psn, segs }) if len > 0 => {
                        reader.expect_payload(len, Some(segs));
                        *read_psn = Some(psn);
                    }
                    Ok(ReadSink::Into { psn, segs }) => req.read_done(psn, segs, now, out),
                    Ok(ReadSink::Discard) => {
                        if len > 0 {
                            reader.expect_payload(len, None);
                            *read_psn = None;
                        }
                    }
                    Err(fatal) => {
                        if len > 0 {
                            reader.expect_payload(len, None);
                        }
                        return Err(Stop::Fatal(fatal.0));
                    }
                }
            }
            Event::PayloadDone(segs) => {
                if let Some(psn) = read_psn.take() {
                    req.read_done(psn, segs, now, out);
                }
            }
        }
    }
}
