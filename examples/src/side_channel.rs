//! The TCP side channel that `verbs_api::cm` leaves open after connection setup
//! (`Peer::stream`), for small out-of-band messages: a start signal, "I am done", a final
//! result. Messages are length-prefixed; every read is bounded.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::de::DeserializeOwned;
use serde::Serialize;
use verbs_api::cm::Peer;

use crate::wait::Waiter;
use crate::Res;

/// Writes a length-prefixed message on the side channel.
pub fn send_msg(stream: &mut TcpStream, msg: &[u8]) -> Res<()> {
    let mut b = (msg.len() as u32).to_be_bytes().to_vec();
    b.extend_from_slice(msg);
    stream.write_all(&b).context("writing to the side channel")
}

/// Reads a length-prefixed message from the side channel, waiting at most `timeout`.
pub fn recv_msg(stream: &mut TcpStream, timeout: Duration) -> Res<Vec<u8>> {
    let deadline = Instant::now() + timeout;
    let mut len = [0u8; 4];
    read_exact_by(stream, &mut len, deadline)?;
    let len = u32::from_be_bytes(len) as usize;
    if len > 1 << 20 {
        anyhow::bail!("side channel: a {len}-byte message is not from this program");
    }
    let mut msg = vec![0u8; len];
    read_exact_by(stream, &mut msg, deadline)?;
    Ok(msg)
}

fn read_exact_by(stream: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> Res<()> {
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    stream.set_read_timeout(Some(left)).context("setsockopt")?;
    stream.read_exact(buf).map_err(|e| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            anyhow::anyhow!("timed out waiting for the peer on the side channel")
        }
        std::io::ErrorKind::UnexpectedEof => anyhow::anyhow!("the peer closed the side channel"),
        _ => anyhow::anyhow!("side channel: {e}"),
    })
}

/// Writes `v` as a JSON message on the side channel.
pub fn send_json<T: Serialize>(stream: &mut TcpStream, v: &T) -> Res<()> {
    send_msg(stream, &serde_json::to_vec(v)?)
}

/// Reads a JSON message from the side channel, waiting at most `timeout`.
pub fn recv_json<T: DeserializeOwned>(stream: &mut TcpStream, timeout: Duration) -> Res<T> {
    let m = recv_msg(stream, timeout)?;
    serde_json::from_slice(&m)
        .with_context(|| format!("bad control message {:?}", String::from_utf8_lossy(&m)))
}

/// Whether the peer has closed the side channel (or sent anything: both mean "done"),
/// without blocking.
pub fn peer_done(stream: &mut TcpStream) -> Res<bool> {
    stream.set_nonblocking(true).context("fcntl")?;
    let mut b = [0u8; 64];
    let r = stream.read(&mut b);
    stream.set_nonblocking(false).context("fcntl")?;
    match r {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(true),
        Err(e) => Err(anyhow::anyhow!("side channel: {e}")),
    }
}

/// Whether a message (or the peer's hang-up) waits on the side channel, without reading
/// it and without blocking.
pub fn readable(stream: &TcpStream) -> Res<bool> {
    stream.set_nonblocking(true).context("fcntl")?;
    let r = stream.peek(&mut [0u8; 1]);
    stream.set_nonblocking(false).context("fcntl")?;
    match r {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(true),
        Err(e) => Err(anyhow::anyhow!("side channel: {e}")),
    }
}

/// Waits until every peer has said it is done ([`peer_done`]), looking every `nap`; fails
/// once `timeout` passes without news from any of them. `what` names them in that error
/// ("the clients").
pub fn wait_all_done(peers: &mut [Peer], nap: Duration, timeout: Duration, what: &str) -> Res<()> {
    let mut done = vec![false; peers.len()];
    let mut w = Waiter::new(timeout);
    while !done.iter().all(|&d| d) {
        for (d, p) in done.iter_mut().zip(peers.iter_mut()) {
            if !*d && peer_done(&mut p.stream)? {
                *d = true;
                w.progress();
            }
        }
        std::thread::sleep(nap);
        w.idle(&|| format!("{what} to finish"))?;
    }
    Ok(())
}
