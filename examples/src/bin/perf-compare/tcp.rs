//! The raw TCP baselines over loopback: the peer process ([`tcp_server`], started by
//! [`spawn_tcp_server`]) answers 8-byte pings or swallows a stream, and this side
//! measures an 8-byte ping-pong ([`tcp_pingpong`]) and one stream of 1 MiB writes
//! ([`tcp_stream`]). Their sockets get the sim's data connections' options
//! (`backend_sim::sockopt::tune`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};
use examples::Res;

const MODE_PINGPONG: u8 = 1;
const MODE_STREAM: u8 = 2;

/// The peer of the baselines: answers 8-byte pings, or swallows a stream.
pub fn tcp_server() -> Res<()> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    println!("listening on {}", l.local_addr()?);
    std::io::stdout().flush()?;
    loop {
        let (mut s, _) = l.accept()?;
        backend_sim::sockopt::tune(&s)?;
        let mut mode = [0u8; 2];
        if s.read_exact(&mut mode).is_err() {
            return Ok(());
        }
        match mode[0] {
            MODE_PINGPONG => {
                let busy = mode[1] == 1;
                s.set_nonblocking(busy)?;
                let mut b = [0u8; 8];
                while read_full(&mut s, &mut b, busy).is_ok() {
                    if write_full(&mut s, &b).is_err() {
                        break;
                    }
                }
            }
            MODE_STREAM => {
                let busy = mode[1] == 1;
                s.set_nonblocking(busy)?;
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    match s.read(&mut buf) {
                        Ok(0) => break,
                        Ok(_) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
                        Err(_) => break,
                    }
                }
                s.set_nonblocking(false)?;
                let _ = s.write_all(b"k");
            }
            _ => return Ok(()),
        }
    }
}

/// Reads exactly `b.len()` bytes; when busy, spins on a non-blocking socket (yielding
/// every 64 tries, as the `perf` tool's waits do).
fn read_full(s: &mut TcpStream, b: &mut [u8], busy: bool) -> std::io::Result<()> {
    let mut got = 0;
    let mut tries = 0u32;
    while got < b.len() {
        match s.read(&mut b[got..]) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if busy && e.kind() == std::io::ErrorKind::WouldBlock => {
                tries += 1;
                if tries % 64 == 0 {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes all of `b`, spinning while a non-blocking socket is full.
fn write_full(s: &mut TcpStream, b: &[u8]) -> std::io::Result<()> {
    let mut off = 0;
    while off < b.len() {
        match s.write(&b[off..]) {
            Ok(n) => off += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The TCP peer process of the baselines; killed when dropped.
pub struct Peer {
    child: Child,
    addr: String,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the TCP peer (this program's `tcp-server` subcommand).
pub fn spawn_tcp_server() -> Res<Peer> {
    let mut child = Command::new(std::env::current_exe()?)
        .arg("tcp-server")
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the TCP peer")?;
    let out = child
        .stdout
        .take()
        .ok_or_else(|| anyhow!("no stdout from the TCP peer"))?;
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line)?;
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .ok_or_else(|| anyhow!("the TCP peer did not say where it listens"))?
        .to_string();
    Ok(Peer { child, addr })
}

/// One-way latencies (µs) of an 8-byte TCP ping-pong.
pub fn tcp_pingpong(peer: &Peer, iters: u64, busy: bool) -> Res<Vec<f64>> {
    let mut s = TcpStream::connect(&peer.addr)?;
    backend_sim::sockopt::tune(&s)?;
    s.write_all(&[MODE_PINGPONG, busy as u8])?;
    s.set_nonblocking(busy)?;
    let mut b = [7u8; 8];
    let mut lat = Vec::with_capacity(iters as usize);
    for i in 0..iters + 100 {
        let t0 = Instant::now();
        write_full(&mut s, &b)?;
        read_full(&mut s, &mut b, busy)?;
        if i >= 100 {
            lat.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
        }
    }
    Ok(lat)
}

/// MB/s of one TCP stream of 1 MiB writes: 0.5 s of warm-up (the window opens), then
/// `secs` measured, as iperf3 does. `busy`: both ends poll non-blocking sockets instead
/// of sleeping in the kernel (as the sim's progress threads do).
pub fn tcp_stream(peer: &Peer, secs: f64, busy: bool) -> Res<f64> {
    let mut s = TcpStream::connect(&peer.addr)?;
    backend_sim::sockopt::tune(&s)?;
    s.write_all(&[MODE_STREAM, busy as u8])?;
    s.set_nonblocking(busy)?;
    let buf = vec![1u8; 1 << 20];
    let warm = Instant::now() + Duration::from_millis(500);
    while Instant::now() < warm {
        write_full(&mut s, &buf)?;
    }
    let t0 = Instant::now();
    let mut sent = 0u64;
    while t0.elapsed().as_secs_f64() < secs {
        write_full(&mut s, &buf)?;
        sent += buf.len() as u64;
    }
    let elapsed = t0.elapsed().as_secs_f64();
    s.set_nonblocking(false)?;
    s.shutdown(std::net::Shutdown::Write)?;
    let mut k = [0u8; 1];
    s.read_exact(&mut k)?;
    Ok(sent as f64 / elapsed / 1e6)
}
