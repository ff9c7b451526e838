//! What ud-echo prints: each client's datagrams and what became of them
//! ([`ClientReport`], [`print_clients`]), and the server's view of each client, told
//! apart by the source QP of its datagrams ([`Sender`]), with its receive queue's empty
//! spells.

use std::time::Duration;

use super::tracker::Counts;
use crate::stats::{per_sec, si, Latencies};

/// One client's outcome.
#[derive(Debug, Default)]
pub struct ClientReport {
    /// The client's number.
    pub id: u32,
    /// Its UD QP.
    pub qpn: u32,
    /// What became of its datagrams.
    pub counts: Counts,
    /// Each echo's time from send.
    pub lat: Latencies,
    /// From the first send to the end.
    pub wall: Duration,
}

impl ClientReport {
    /// Whether every datagram is accounted for (echoed or lost) and every echo was one
    /// of this client's datagrams, intact.
    pub fn consistent(&self) -> bool {
        let c = &self.counts;
        c.sent == c.echoed + c.lost && c.damaged == 0 && c.unexpected == 0
    }
}

/// The line a client's outcome starts with (the demo reads it back).
pub fn client_prefix(id: u32) -> String {
    format!("client {id}: ")
}

/// Prints each client and the total; returns whether every client is
/// [`consistent`](ClientReport::consistent).
pub fn print_clients(reports: &[ClientReport]) -> bool {
    let mut all = Latencies::default();
    let (mut total, mut wall, mut ok) = (Counts::default(), Duration::ZERO, true);
    for r in reports {
        let c = &r.counts;
        println!(
            "{}QP {:#x}: sent {}, echoed {}, lost {} (no echo within the loss timeout), late {}, damaged {}, \
             unexpected {}; {}datagrams/s echoed; round trip {}",
            client_prefix(r.id),
            r.qpn,
            c.sent,
            c.echoed,
            c.lost,
            c.late,
            c.damaged,
            c.unexpected,
            si(per_sec(c.echoed as f64, r.wall)),
            r.lat.summary()
        );
        ok &= r.consistent();
        all.merge(&r.lat);
        wall = wall.max(r.wall);
        total.sent += c.sent;
        total.echoed += c.echoed;
        total.lost += c.lost;
        total.late += c.late;
        total.damaged += c.damaged;
        total.unexpected += c.unexpected;
    }
    println!(
        "total: {} clients sent {} datagrams, {} echoed intact, {} lost, {} late, {} damaged, {} unexpected in {:.3} s; round trip {}",
        reports.len(),
        total.sent,
        total.echoed,
        total.lost,
        total.late,
        total.damaged,
        total.unexpected,
        wall.as_secs_f64(),
        all.summary()
    );
    ok
}

/// What the server saw of one client.
#[derive(Clone, Debug, Default)]
pub struct Sender {
    /// The client's number, as it registered.
    pub id: u32,
    /// Its UD QP: the `src_qp` of its datagrams.
    pub qpn: u32,
    /// Datagrams received from it (and checked).
    pub received: u64,
    /// Of those, echoed back.
    pub echoed: u64,
    /// The highest sequence number received.
    pub max_seq: Option<u64>,
    /// Datagrams from its QP that did not decode intact.
    pub damaged: u64,
    /// Intact datagrams from its QP that name another client.
    pub foreign: u64,
}

impl Sender {
    /// Sequence numbers below the highest received that never arrived (the dropped
    /// datagrams the server can see; those after the last one it cannot).
    pub fn missing(&self) -> u64 {
        self.max_seq.map_or(0, |m| (m + 1).saturating_sub(self.received))
    }
}

/// The line of the server's view of client `id` (the demo reads it back).
pub fn sender_prefix(id: u32) -> String {
    format!("server: client {id}: ")
}

/// Prints the server's view of each client.
pub fn print_senders(senders: &[Sender]) {
    for s in senders {
        println!(
            "{}QP {:#x}: received {}, echoed {}, damaged {}, naming another client {}; missing sequence numbers \
             below the highest received: {}",
            sender_prefix(s.id),
            s.qpn,
            s.received,
            s.echoed,
            s.damaged,
            s.foreign,
            s.missing()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_counts_the_gaps_below_the_highest_sequence_number() {
        let mut s = Sender::default();
        assert_eq!(s.missing(), 0);
        s.max_seq = Some(9);
        s.received = 7;
        assert_eq!(s.missing(), 3);
    }
}
