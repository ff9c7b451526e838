//! Connection setup in memory: what `verbs_api::cm` does over a TCP side channel (a
//! listener by host name and port, a client's hello with its QP [`Endpoint`], remote-MR
//! descriptors and private data, the server's answer, both QPs driven to RTS), between
//! tokio tasks of one deterministic world. There is no socket to wait on and nothing the
//! seed does not decide: requests queue at the listener in the order they were made, and
//! the timeouts are virtual time.
//!
//! As with cm, when either [`DetListener::accept`] or [`Det::connect`] returns, both QPs
//! are in RTS; a QP in RESET is moved to INIT first, so receives may be posted before
//! (after [`verbs_api::modify_to_init`]). Errors are cm's: no listener on the port is a
//! refused connection (ECONNREFUSED), a port taken is EADDRINUSE, listening on a host
//! the world does not have EADDRNOTAVAIL, a peer that gives up ECONNRESET, a wait past
//! the offer's timeout ETIMEDOUT. Both calls run on a paused current_thread runtime, as
//! every async wait of the world ([`crate::IDLE_WAIT`]); elsewhere they are refused,
//! saying what to use.
//!
//! Sync code in one thread takes the same exchange in turns, without tokio:
//! [`Det::connect_start`] queues the client's request, [`DetListener::accept_now`]
//! answers it (the server's QP in RTS) and [`DetConnecting::finish`] brings the client's
//! QP up. A step out of turn fails with EAGAIN, saying which step comes first.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use verbs_api::cm::{Offer, Peer, DEFAULT_TIMEOUT, MAX_MRS, MAX_PRIVATE};
use verbs_api::{
    local_endpoint, modify_to_init, modify_to_rtr, modify_to_rts, Context, Endpoint, Error, QpState,
    QueuePair, RcParams, Result,
};

use crate::det::Det;
use crate::listeners::{Answer, Hello, Request};
use crate::paused::attach;
use crate::shared::Shared;

/// A server waiting for [`Det::connect`]s on one host name and port of its world
/// (the in-memory `verbs_api::cm::CmListener`). Dropping it closes the port: requests
/// not yet accepted are refused.
pub struct DetListener {
    shared: Arc<Shared>,
    addr: (String, u16),
    requests: tokio::sync::Mutex<mpsc::UnboundedReceiver<Request>>,
}

fn hello(endpoint: Endpoint, offer: &Offer) -> Hello {
    Hello {
        endpoint,
        mrs: offer.mrs.clone(),
        private_data: offer.private_data.clone(),
    }
}

fn peer(local: Endpoint, h: Hello) -> Peer<()> {
    Peer {
        local,
        endpoint: h.endpoint,
        mrs: h.mrs,
        private_data: h.private_data,
        stream: (),
    }
}

fn check_offer(call: &'static str, offer: &Offer) -> Result<()> {
    if offer.mrs.len() > MAX_MRS || offer.private_data.len() > MAX_PRIVATE {
        return Err(Error::invalid(
            call,
            format!("at most {MAX_MRS} MRs and {MAX_PRIVATE} bytes of private data"),
        ));
    }
    Ok(())
}

/// This side's endpoint, its first PSN derived from its QPN (which the seed chose), as
/// cm draws one at random.
fn me<C: Context, Q: QueuePair>(ctx: &C, qp: &Q, params: &RcParams) -> Result<Endpoint> {
    let psn = qp.qp_num().wrapping_mul(0x9e37_79b1).rotate_left(7);
    local_endpoint(ctx, qp, params, psn)
}

/// INIT (if still in RESET) → RTR towards `peer` → RTS sending from `psn`.
fn bring_up<Q: QueuePair>(qp: &Q, params: &RcParams, peer: &Endpoint, psn: u32) -> Result<()> {
    if qp.state()? == QpState::Reset {
        modify_to_init(qp, params)?;
    }
    modify_to_rtr(qp, params, peer)?;
    modify_to_rts(qp, params, psn)
}

/// `fut` within the offer's timeout (virtual time).
async fn within<T>(
    offer: &Offer,
    what: &str,
    fut: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    let t = offer.timeout.unwrap_or(DEFAULT_TIMEOUT);
    tokio::time::timeout(t, fut)
        .await
        .map_err(|_| Error::timeout(t, what.to_string()))?
}

impl Det {
    /// Listens on `host`'s `port` for [`Det::connect`]s (the in-memory
    /// `CmListener::bind`). `host` is a device of the world, by name.
    pub fn listen(&self, host: &str, port: u16) -> Result<DetListener> {
        let w = self.shared.enter("rdma_listen")?;
        if !w.devices.iter().any(|d| d.name == host) {
            return Err(Error::cm(
                "bind",
                libc::EADDRNOTAVAIL,
                format!(
                    "no host named {host:?} in this world (its hosts: {})",
                    w.devices
                        .iter()
                        .map(|d| d.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        drop(w);
        let addr = (host.to_string(), port);
        let mut l = self.shared.listeners.lock();
        if l.by_addr.contains_key(&addr) {
            return Err(Error::cm(
                "bind",
                libc::EADDRINUSE,
                format!("{host}:{port} already has a listener in this world"),
            ));
        }
        let (tx, rx) = mpsc::unbounded_channel();
        l.by_addr.insert(addr.clone(), tx);
        Ok(DetListener {
            shared: self.shared.clone(),
            addr,
            requests: tokio::sync::Mutex::new(rx),
        })
    }

    /// Connects `qp` to the listener on `host`'s `port`: sends this side's endpoint and
    /// offer, takes the server's, brings `qp` to RTS towards the server's QP (the
    /// in-memory `verbs_api::cm::connect_async`). Bounded by the offer's timeout, in
    /// virtual time.
    pub async fn connect<C: Context, Q: QueuePair>(
        &self,
        host: &str,
        port: u16,
        ctx: &C,
        qp: &Q,
        params: &RcParams,
        offer: &Offer,
    ) -> Result<Peer<()>> {
        attach(&self.shared, "Det::connect")?;
        let mut c = self.connect_start(host, port, ctx, qp, params, offer)?;
        let to = c.to.clone();
        let a = within(offer, "the server's answer to a det connection request", async {
            (&mut c.answered).await.map_err(|_| refused(&to, UNANSWERED))
        })
        .await?;
        c.come_up(a, qp, params)
    }

    /// The first of the two steps of a connection set up in one thread without tokio
    /// (sync code): queues this side's request at the listener on `host`'s `port`,
    /// which [`DetListener::accept_now`] answers; then [`DetConnecting::finish`] brings
    /// `qp` to RTS. The steps are the in-memory `cm::connect`, taken in turn as a sync
    /// client and server take theirs.
    pub fn connect_start<C: Context, Q: QueuePair>(
        &self,
        host: &str,
        port: u16,
        ctx: &C,
        qp: &Q,
        params: &RcParams,
        offer: &Offer,
    ) -> Result<DetConnecting> {
        self.shared.check("rdma_connect")?;
        check_offer("connect", offer)?;
        let me = me(ctx, qp, params)?;
        let to = format!("{host}:{port}");
        let tx = {
            let l = self.shared.listeners.lock();
            match l.by_addr.get(&(host.to_string(), port)) {
                Some(tx) => tx.clone(),
                None => {
                    return Err(refused(
                        &to,
                        "nothing listens there in this world (Det::listen on that host and port first)",
                    ))
                }
            }
        };
        let (answer, answered) = oneshot::channel();
        tx.send(Request {
            hello: hello(me, offer),
            answer,
        })
        .map_err(|_| refused(&to, "the listener was dropped"))?;
        Ok(DetConnecting { me, answered, to })
    }
}

/// A client's connection request on its way ([`Det::connect_start`]).
pub struct DetConnecting {
    me: Endpoint,
    answered: oneshot::Receiver<Answer>,
    /// Where to: `host:port`.
    to: String,
}

/// Why a connection whose listener went without answering failed.
const UNANSWERED: &str = "the listener was dropped before it accepted";

/// The refusal of a connection to `to`.
fn refused(to: &str, why: &str) -> Error {
    Error::cm(
        "connect",
        libc::ECONNREFUSED,
        format!("connection to {to} refused: {why}"),
    )
}

impl DetConnecting {
    /// The second step: takes the server's answer (given by [`DetListener::accept_now`]
    /// before) and brings `qp` to RTS towards the server's QP. With no answer yet it
    /// fails (EAGAIN), saying to accept first; a listener dropped unanswered refuses.
    pub fn finish<Q: QueuePair>(mut self, qp: &Q, params: &RcParams) -> Result<Peer<()>> {
        match self.answered.try_recv() {
            Ok(a) => self.come_up(a, qp, params),
            Err(oneshot::error::TryRecvError::Empty) => Err(Error::cm(
                "connect",
                libc::EAGAIN,
                "the server has not answered yet: call DetListener::accept_now before finish \
                 (in one thread the server takes its step between the client's two)",
            )),
            Err(oneshot::error::TryRecvError::Closed) => Err(refused(&self.to, UNANSWERED)),
        }
    }

    fn come_up<Q: QueuePair>(self, a: Answer, qp: &Q, params: &RcParams) -> Result<Peer<()>> {
        let up = bring_up(qp, params, &a.hello.endpoint, self.me.psn);
        // The server waits for this; it fails too if this side could not come up.
        let _ = a.ready.send(up.as_ref().map(drop).map_err(ToString::to_string));
        up?;
        Ok(peer(self.me, a.hello))
    }
}

impl std::fmt::Debug for DetConnecting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DetConnecting").field("me", &self.me).finish()
    }
}

impl DetListener {
    /// The host name and port it listens on.
    pub fn addr(&self) -> (&str, u16) {
        (&self.addr.0, self.addr.1)
    }

    /// Waits for one client's request, answers with this side's endpoint and offer,
    /// brings `qp` to RTS towards the client's QP and waits until the client's is too
    /// (the in-memory `AsyncCmListener::accept`). Bounded by the offer's timeout, in
    /// virtual time.
    pub async fn accept<C: Context, Q: QueuePair>(
        &self,
        ctx: &C,
        qp: &Q,
        params: &RcParams,
        offer: &Offer,
    ) -> Result<Peer<()>> {
        attach(&self.shared, "DetListener::accept")?;
        check_offer("accept", offer)?;
        within(offer, "a det connection request and its exchange", async {
            let req = self
                .requests
                .lock()
                .await
                .recv()
                .await
                .ok_or_else(|| Error::cm("accept", libc::EBADF, "the listener's port was closed"))?;
            let me = me(ctx, qp, params)?;
            bring_up(qp, params, &req.hello.endpoint, me.psn)?;
            let (ready, came_up) = oneshot::channel();
            let reset = |why: String| Error::cm("accept", libc::ECONNRESET, why);
            req.answer
                .send(Answer {
                    hello: hello(me, offer),
                    ready,
                })
                .map_err(|_| reset("the client gave up before the answer".into()))?;
            match came_up.await {
                Ok(Ok(())) => Ok(peer(me, req.hello)),
                Ok(Err(why)) => Err(reset(format!("the client's QP did not come up: {why}"))),
                Err(_) => Err(reset("the client went away before its QP came up".into())),
            }
        })
        .await
    }
}

impl DetListener {
    /// The server's step of a connection set up in one thread without tokio: takes the
    /// request a [`Det::connect_start`] queued, answers it and brings `qp` to RTS
    /// towards the client's QP, which comes up at [`DetConnecting::finish`]. With no
    /// request queued it fails (EAGAIN), saying to start the client's first.
    pub fn accept_now<C: Context, Q: QueuePair>(
        &self,
        ctx: &C,
        qp: &Q,
        params: &RcParams,
        offer: &Offer,
    ) -> Result<Peer<()>> {
        self.shared.check("rdma_accept")?;
        check_offer("accept", offer)?;
        let none = || {
            Error::cm(
                "accept",
                libc::EAGAIN,
                "no connection request is queued: call Det::connect_start first (in one \
                 thread the client asks before the server answers)",
            )
        };
        let req = self
            .requests
            .try_lock()
            .map_err(|_| none())?
            .try_recv()
            .map_err(|_| none())?;
        let me = me(ctx, qp, params)?;
        bring_up(qp, params, &req.hello.endpoint, me.psn)?;
        let (ready, _) = oneshot::channel();
        req.answer
            .send(Answer {
                hello: hello(me, offer),
                ready,
            })
            .map_err(|_| Error::cm("accept", libc::ECONNRESET, "the client gave up before the answer"))?;
        Ok(peer(me, req.hello))
    }
}

impl std::fmt::Debug for DetListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DetListener").field("addr", &self.addr).finish()
    }
}

impl Drop for DetListener {
    fn drop(&mut self) {
        self.shared.listeners.lock().by_addr.remove(&self.addr);
    }
}
