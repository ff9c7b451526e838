//! Raw TCP carrying the QP rows' traffic (perf-compare's reference for "64 QPs against one").
//!
//! Whether 64 connections cost the kernel more than one is a question about TCP, not
//! about the sim. This measures it with the sim's traffic and none of the sim: `conns`
//! loopback connections in this process, each with at most `depth` messages unanswered
//! (a 48-byte header and a `size`-byte payload, as a WRITE), one sending thread and one
//! receiving thread (as the QP rows have one application thread and the peer device's
//! progress thread), both non-blocking and busy, reading every socket in turn. The
//! receiver answers with a 16-byte cumulative count (as an ACK) every half window and
//! whenever a socket runs dry, as the sim's responder does with the AckReq bit; the
//! sender puts up to 16 messages (`BATCH`) in one `writev`, as the sim puts several WQEs in
//! one `sendmsg`.

use std::io::{ErrorKind, IoSlice, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::bail;
use anyhow::Context as _;

use crate::Res;

/// Bytes of a message's header (the sim's WRITE header).
const HDR: usize = 48;
/// Messages in one `writev` at most.
const BATCH: usize = 16;
/// Bytes of an answer: the count of messages received so far (u64) and padding.
const ANSWER: usize = 16;
/// A run that has not finished by then has failed.
const LIMIT: Duration = Duration::from_secs(120);

/// Aggregate MB/s of `total` bytes of `size`-byte messages over `conns` connections,
/// `depth` unanswered per connection.
pub fn write_bw(conns: usize, depth: usize, size: usize, total: u64) -> Res<f64> {
    let listener = TcpListener::bind("127.0.0.1:0").context("bind the raw TCP listener")?;
    let addr = listener.local_addr()?;
    let (mut tx, mut rx) = (Vec::with_capacity(conns), Vec::with_capacity(conns));
    for _ in 0..conns {
        let c = TcpStream::connect(addr).context("connect a raw TCP stream")?;
        let (r, _) = listener.accept()?;
        for s in [&c, &r] {
            s.set_nodelay(true)?;
            s.set_nonblocking(true)?;
            if let Some(algo) = backend_sim::sockopt::congestion() {
                // As the sim's data connections (and perf-compare's other baselines).
                let _ = backend_sim::sockopt::set_congestion(s, &algo);
            }
        }
        tx.push(c);
        rx.push(r);
    }
    let msgs = (total / size as u64).max(conns as u64);
    let every = (depth / 2).max(1) as u64;
    let receiver = std::thread::spawn(move || receive(rx, size, msgs, every));
    let t0 = Instant::now();
    let sent = send(&mut tx, depth, size, msgs);
    let secs = t0.elapsed().as_secs_f64();
    // The receiver ends once everything arrived; a sending error ends it by closing.
    drop(tx);
    let Ok(received) = receiver.join() else {
        bail!("the raw TCP receiver panicked");
    };
    sent?;
    received?;
    Ok(msgs as f64 * size as f64 / secs / 1e6)
}

/// The sending side: keeps `depth` messages unanswered per connection until `msgs` are
/// answered.
fn send(tx: &mut [TcpStream], depth: usize, size: usize, msgs: u64) -> Res<()> {
    let header = [0x5au8; HDR];
    let payload = vec![0xa5u8; size];
    let msg = (HDR + size) as u64;
    let n = tx.len();
    // Per connection: messages handed out, answered, and bytes of them not yet written.
    let (mut sent, mut answered, mut unwritten) = (vec![0u64; n], vec![0u64; n], vec![0u64; n]);
    let mut partial = vec![[0u8; ANSWER]; n];
    let mut have = vec![0usize; n];
    let (mut handed, mut done) = (0u64, 0u64);
    // Reused for every call: no allocation per `writev`.
    let mut iov: Vec<IoSlice> = Vec::with_capacity(2 * BATCH);
    let t0 = Instant::now();
    while done < msgs {
        for i in 0..n {
            // Answers: the last complete one counts.
            loop {
                match tx[i].read(&mut partial[i][have[i]..]) {
                    Ok(0) => bail!("the raw TCP receiver closed connection {i}"),
                    Ok(k) => {
                        have[i] += k;
                        if have[i] == ANSWER {
                            let count = u64::from_le_bytes(partial[i][..8].try_into().expect("8 bytes"));
                            done += count.saturating_sub(answered[i]);
                            answered[i] = answered[i].max(count);
                            have[i] = 0;
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Err(e).context("read an answer"),
                }
            }
            // New messages while the window has room.
            while sent[i] - answered[i] < depth as u64 && handed < msgs {
                sent[i] += 1;
                handed += 1;
                unwritten[i] += msg;
            }
            // Write what is queued, up to BATCH messages per call.
            while unwritten[i] > 0 {
                // Offset into the first unwritten message.
                let skip = ((msg - unwritten[i] % msg) % msg) as usize;
                iov.clear();
                let mut left = unwritten[i];
                while left > 0 && iov.len() < 2 * BATCH {
                    let from = if iov.is_empty() { skip } else { 0 };
                    if from < HDR {
                        iov.push(IoSlice::new(&header[from..]));
                        iov.push(IoSlice::new(&payload));
                    } else {
                        iov.push(IoSlice::new(&payload[from - HDR..]));
                    }
                    left -= (HDR + size - from) as u64;
                }
                match tx[i].write_vectored(&iov) {
                    Ok(k) => unwritten[i] -= k as u64,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Err(e).context("write messages"),
                }
            }
        }
        if t0.elapsed() > LIMIT {
            bail!("raw TCP: {done} of {msgs} messages answered after {LIMIT:?}");
        }
    }
    Ok(())
}

/// The receiving side: reads messages into one buffer (as the sim reads payloads into the
/// target region) and answers every `every` messages and whenever a socket runs dry.
fn receive(mut rx: Vec<TcpStream>, size: usize, msgs: u64, every: u64) -> Res<()> {
    let n = rx.len();
    let mut buf = vec![0u8; HDR + size];
    let msg = HDR + size;
    let mut left = vec![msg; n];
    let (mut count, mut unanswered) = (vec![0u64; n], vec![0u64; n]);
    let mut total = 0u64;
    let t0 = Instant::now();
    while total < msgs {
        for i in 0..n {
            loop {
                match rx[i].read(&mut buf[..left[i]]) {
                    Ok(0) => return Ok(()),
                    Ok(k) => {
                        left[i] -= k;
                        if left[i] == 0 {
                            left[i] = msg;
                            count[i] += 1;
                            total += 1;
                            unanswered[i] += 1;
                            if unanswered[i] >= every {
                                answer(&mut rx[i], count[i])?;
                                unanswered[i] = 0;
                            }
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        if unanswered[i] > 0 {
                            answer(&mut rx[i], count[i])?;
                            unanswered[i] = 0;
                        }
                        break;
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Err(e).context("read messages"),
                }
            }
        }
        if t0.elapsed() > LIMIT {
            bail!("raw TCP: {total} of {msgs} messages received after {LIMIT:?}");
        }
    }
    // Every socket was read until it ran dry, so every message is answered. Hold the
    // sockets until the sender has read the answers and closed its side: closing first
    // would show it an end of stream on a connection it still reads.
    for s in &mut rx {
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                    if t0.elapsed() > LIMIT {
                        bail!("raw TCP: the sender did not close after {LIMIT:?}");
                    }
                    std::thread::yield_now();
                }
                Err(_) => break,
            }
        }
    }
    Ok(())
}

/// Writes one answer (a few bytes: the socket has room unless the sender stopped
/// reading, which it does not while it runs).
fn answer(s: &mut TcpStream, count: u64) -> Res<()> {
    let mut a = [0u8; ANSWER];
    a[..8].copy_from_slice(&count.to_le_bytes());
    let mut off = 0;
    let t0 = Instant::now();
    while off < ANSWER {
        match s.write(&a[off..]) {
            Ok(k) => off += k,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                if t0.elapsed() > LIMIT {
                    bail!("raw TCP: an answer could not be written for {LIMIT:?}");
                }
                std::thread::yield_now();
            }
            Err(e) => return Err(e).context("write an answer"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_arrives_and_is_answered() {
        // Uneven sizes: writes end mid-header and mid-payload. 13 messages over 2
        // connections answered every 4: the last ones when their socket runs dry.
        for (conns, depth, size, total) in [
            (1, 16, 65536, 8 << 20),
            (8, 3, 1000, 2 << 20),
            (3, 1, 7, 7 << 10),
            (2, 8, 1000, 13_000),
        ] {
            let bw = write_bw(conns, depth, size, total).unwrap();
            assert!(bw.is_finite() && bw > 0.0, "{conns} x {depth} x {size}: {bw}");
        }
    }
}
