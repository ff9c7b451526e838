//! One side of a perf connection ([`Side`]): the QP (and its SRQ, with `--use_srq`), its
//! [receive | send] region, the peer's region and side channel (and, on UD, its address:
//! [`UdPeer`]), and the primitives both ends' measurement loops are made of: post
//! receives, post one ping-pong message, wait for the peer's message or the last byte of
//! its RDMA WRITE, reap send completions.

use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use serde::{Deserialize, Serialize};
use verbs_api::{
    Backend, CompletionQueue, MemoryRegion, PostError, QueuePair, RecvWr, RemoteMr, SendFlags, SendWr,
    SharedReceiveQueue, WcOpcode, WorkCompletion,
};

use super::params::Cfg;
use crate::transport::QKEY;
use crate::wait::{check_wc, Waiter};
use crate::{conn, side_channel, Res};

/// Everything one side of a test holds.
pub struct Side<B: Backend> {
    /// The QP and its CQ.
    pub rc: conn::RcQp<B>,
    /// [receive area | send area], each `max` bytes.
    pub mr: B::Mr,
    /// The largest message.
    pub max: usize,
    /// The peer's region (the one-sided tests' target).
    pub remote: RemoteMr,
    /// The side channel to the peer.
    pub stream: TcpStream,
    /// Bound on every wait.
    pub timeout: Duration,
    /// The run.
    pub cfg: Cfg,
    /// Receives posted (send tests).
    pub posted: u32,
    /// Sends posted but not yet completed (latency tests signal every send).
    pub sends_out: u32,
    /// Largest message sent inline (as the device granted).
    pub inline: u32,
    /// Cycle-counter ticks per microsecond (`--perftest`'s clock).
    pub mhz: f64,
    /// `timeout` in cycle-counter ticks.
    pub spin_limit: u64,
    /// The shared receive queue the QP takes its receives from (`--use_srq`).
    pub srq: Option<B::Srq>,
    /// On UD, where the sends go.
    pub ud: Option<UdPeer<B>>,
}

/// The peer of a UD side: its address handle and QP number. Cheap to clone, so that a
/// loop holds its own while it changes the [`Side`].
pub struct UdPeer<B: Backend> {
    /// The address handle of the peer's port.
    pub ah: Arc<B::Ah>,
    /// The peer's QP.
    pub qpn: u32,
}

impl<B: Backend> Clone for UdPeer<B> {
    fn clone(&self) -> Self {
        UdPeer {
            ah: self.ah.clone(),
            qpn: self.qpn,
        }
    }
}

/// `wr` addressed to `peer` on UD (unchanged on a connected QP, `peer` `None`).
pub fn to_peer<'a, B: Backend>(wr: SendWr<'a>, peer: Option<&'a UdPeer<B>>) -> SendWr<'a> {
    match peer {
        Some(p) => wr.ud(&*p.ah, p.qpn, QKEY),
        None => wr,
    }
}

/// The `wr_id` of every receive.
const RECV_ID: u64 = u64::MAX;

/// Posts `n` receives of `max` bytes, all into the start of `mr` (they may share it: the
/// contents do not matter), to the QP's receive queue or to `srq`.
pub fn post_recvs_on<Q: QueuePair, S: SharedReceiveQueue, M: MemoryRegion>(
    qp: &Q,
    srq: Option<&S>,
    mr: &M,
    max: usize,
    n: u32,
) -> Res<()> {
    if n == 0 {
        return Ok(());
    }
    let post = |wrs: &[RecvWr<'_>]| -> Result<(), PostError> {
        match srq {
            Some(srq) => srq.post_recv(wrs),
            None => qp.post_recv(wrs),
        }
    };
    let sge = [mr.sge(0, max)?];
    // The latency loop posts one per message, between a completion and the next send:
    // build no more than that (the tool's own time is measured along with the device).
    if n == 1 {
        post(&[RecvWr::new(RECV_ID, &sge)]).context("posting receives")?;
        return Ok(());
    }
    // More in batches from a stack array (no heap allocation in a measured loop).
    let batch = [RecvWr::new(RECV_ID, &sge); 32];
    let mut left = n as usize;
    while left > 0 {
        let k = left.min(batch.len());
        post(&batch[..k]).context("posting receives")?;
        left -= k;
    }
    Ok(())
}

impl<B: Backend> Side<B> {
    /// Sends a control message to the peer.
    pub fn send_json<T: Serialize>(&mut self, v: &T) -> Res<()> {
        side_channel::send_json(&mut self.stream, v)
    }

    /// Waits for a control message from the peer (at least 30 s).
    pub fn recv_json<T: for<'de> Deserialize<'de>>(&mut self) -> Res<T> {
        side_channel::recv_json(&mut self.stream, self.timeout.max(Duration::from_secs(30)))
    }

    /// Waits for the control message `want` (a string) from the peer.
    pub fn expect(&mut self, want: &str) -> Res<()> {
        let got: String = self.recv_json()?;
        if got != want {
            bail!("unexpected control message {got:?}");
        }
        Ok(())
    }

    /// Posts `n` receives into the receive area (of the SRQ, with one).
    pub fn post_recvs(&mut self, n: u32) -> Res<()> {
        post_recvs_on(&self.rc.qp, self.srq.as_ref(), &self.mr, self.max, n)?;
        self.posted += n;
        Ok(())
    }

    /// One signaled send-side WR of a ping-pong from the send area (inline when small).
    pub fn post_pingpong(&mut self, size: usize, write: bool) -> Res<()> {
        // Keep the send queue from filling with completions not yet reaped.
        if self.sends_out >= self.rc.cap.max_send_wr {
            self.wait_recv_or_send(false)?;
        }
        let sge = [self.mr.sge(self.max, size)?];
        let mut wr = if write {
            SendWr::write(1, &sge, self.remote.at(0))
        } else {
            to_peer(SendWr::send(1, &sge), self.ud.as_ref())
        }
        .signaled();
        if size as u32 <= self.inline {
            wr.send_flags |= SendFlags::INLINE;
        }
        self.rc.qp.post_send(&[wr]).context("posting")?;
        self.sends_out += 1;
        Ok(())
    }

    /// Polls until a receive completes (`want_recv`) or a send completes; reaps send
    /// completions along the way.
    pub fn wait_recv_or_send(&mut self, want_recv: bool) -> Res<()> {
        let mut wcs = [WorkCompletion::default(); 8];
        let mut w = Waiter::new(self.timeout);
        loop {
            let n = self.rc.cq.poll(&mut wcs)?;
            let mut hit = false;
            for wc in &wcs[..n] {
                check_wc(wc, &|| format!("{} message", self.cfg.test.name()))?;
                if wc.opcode == WcOpcode::Recv {
                    self.posted -= 1;
                    hit |= want_recv;
                } else {
                    self.sends_out -= 1;
                    hit |= !want_recv;
                }
            }
            if hit {
                return Ok(());
            }
            if n == 0 {
                w.idle(&|| format!("the peer's {} message", self.cfg.test.name()))?;
            }
        }
    }

    /// Waits until the last byte of a `size`-byte message in the receive area is `v`,
    /// reaping send completions meanwhile (polling the CQ is also what drives a
    /// software HCA's progress on this thread).
    pub fn wait_byte(&mut self, size: usize, v: u8) -> Res<()> {
        let at = size - 1;
        let word = at & !7;
        let shift = at - word;
        let mut w = Waiter::new(self.timeout);
        let mut wcs = [WorkCompletion::default(); 8];
        loop {
            let x = self.mr.read_u64(word)?.to_ne_bytes()[shift];
            if x == v {
                return Ok(());
            }
            let n = self.rc.cq.poll(&mut wcs)?;
            for wc in &wcs[..n] {
                check_wc(wc, &|| format!("{} message", self.cfg.test.name()))?;
                self.sends_out -= 1;
            }
            if self.mr.read_u64(word)?.to_ne_bytes()[shift] == v {
                return Ok(());
            }
            w.idle(&|| format!("the peer's RDMA WRITE (byte {at} to become {v})"))?;
        }
    }

    /// Reaps the remaining send completions (end of a latency row).
    pub fn drain_sends(&mut self) -> Res<()> {
        while self.sends_out > 0 {
            self.wait_recv_or_send(false)?;
        }
        Ok(())
    }
}
