//! rping: rdma-core's `rping` (librdmacm/examples/rping.c) over verbs-api's connection
//! manager, on either backend, speaking rping's protocol so that a C `rping` can be the
//! other side (`src/bin/rping.rs` is the program; backend-sim-cabi's tests/rping.rs runs
//! it against the C one on the sim, both ways).
//!
//! The connection is made the rdma_cm way (`verbs_api::rdmacm`: an event channel, an id,
//! address and route resolution, connect / listen and accept, with the QP's transitions
//! from `rdma_init_qp_attr`). Each ping: the client fills its start buffer with rping's
//! pattern (`rdma-ping-N: ` and a rotating alphabet) and SENDs its address, rkey and
//! size (16 bytes: `__be64 buf, __be32 rkey, __be32 size`); the server RDMA READs the
//! buffer and SENDs a go-ahead; the client SENDs its second buffer's address; the server
//! RDMA WRITEs what it read there and SENDs a go-ahead; the client compares the two
//! buffers when asked to (`-V`). After its pings the client disconnects, and the server,
//! seeing DISCONNECTED, disconnects too and returns.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _};
use verbs_api::rdmacm::{
    qp as cmqp, CmBackend, CmEventChannel, CmEventType as E, CmId, CmIdOf, ConnParam, EventChannelOf,
    PortSpace,
};
use verbs_api::{
    AccessFlags as A, CompletionQueue, Context, CqOf, MemoryRegion, MrOf, PdOf, ProtectionDomain, QpCap,
    QpInitAttr, QpOf, QpType, QueuePair, RecvWr, RemoteAddr, SendWr, WcStatus, WorkCompletion,
};

use crate::Res;

/// What a run does (rping's options).
#[derive(Clone, Debug)]
pub struct Opts {
    /// The server's address to bind, the client's to connect to (`-a`, `-p`).
    pub addr: SocketAddr,
    /// Pings (the client's `-C`; 0: for ever).
    pub count: u64,
    /// Buffer size (`-S`, at least 32; rping's default is 64).
    pub size: u32,
    /// Print the ping data (`-v`).
    pub verbose: bool,
    /// Check the ping data (the client's `-V`).
    pub validate: bool,
    /// Bound on every wait but the server's for the next ping.
    pub wait: Duration,
}

/// The work request ids: one outstanding receive, sends, the RDMA operation.
const RECV: u64 = 1;
const SEND: u64 = 2;
const RDMA: u64 = 3;
/// `struct rping_rdma_info`.
const INFO: usize = 16;

/// One side of rping: its QP, CQ and the four buffers rping registers.
struct Rping<B: CmBackend> {
    _pd: PdOf<B>,
    cq: CqOf<B>,
    qp: QpOf<B>,
    recv: MrOf<B>,
    send: MrOf<B>,
    start: MrOf<B>,
    rdma: MrOf<B>,
    /// Completions taken while waiting for another.
    early: Vec<WorkCompletion>,
    /// A receive is posted and not yet completed.
    recv_posted: bool,
    /// The peer disconnected (the QP is in ERR).
    disconnected: bool,
}

impl<B: CmBackend> Rping<B> {
    /// The QP (in INIT, as `rdma_create_qp` leaves it) and buffers on `id`'s device, with
    /// a receive posted.
    fn new(id: &CmIdOf<B>, size: u32) -> Res<Self> {
        let ctx = id.verbs().context("the id is bound to no device")?;
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq(32, None)?;
        let qp = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, QpCap::new(16, 2)))?;
        cmqp::init(id, &qp)?;
        let remote = A::LOCAL_WRITE | A::REMOTE_READ | A::REMOTE_WRITE;
        let mut r = Rping {
            recv: pd.reg_mr(INFO, A::LOCAL_WRITE)?,
            send: pd.reg_mr(INFO, A::LOCAL_WRITE)?,
            start: pd.reg_mr(size as usize, remote)?,
            rdma: pd.reg_mr(size as usize, remote)?,
            _pd: pd,
            cq,
            qp,
            early: Vec::new(),
            recv_posted: false,
            disconnected: false,
        };
        r.post_recv()?;
        Ok(r)
    }

    fn post_recv(&mut self) -> Res<()> {
        self.qp
            .post_recv(&[RecvWr::new(RECV, &[self.recv.sge(0, INFO)?])])?;
        self.recv_posted = true;
        Ok(())
    }

    /// SENDs `mr`'s address, rkey and size (rping's `rping_format_send`); any 16 bytes
    /// are a go-ahead.
    fn send_info(&self, mr: &MrOf<B>) -> Res<()> {
        let mut info = [0u8; INFO];
        info[..8].copy_from_slice(&mr.addr().to_be_bytes());
        info[8..12].copy_from_slice(&mr.rkey().to_be_bytes());
        info[12..].copy_from_slice(&(mr.len() as u32).to_be_bytes());
        self.send.write(0, &info)?;
        self.qp
            .post_send(&[SendWr::send(SEND, &[self.send.sge(0, INFO)?]).signaled()])?;
        Ok(())
    }

    /// The completion of `wr_id` within `t`, or `None` once the peer disconnected and
    /// the work request was flushed. On DISCONNECTED the QP goes to ERR (as librdmacm
    /// moves an id's own QP), so what is outstanding completes: a SEND the peer already
    /// took with success, the rest flushed.
    fn wait(&mut self, ch: &EventChannelOf<B>, wr_id: u64, t: Duration) -> Res<Option<WorkCompletion>> {
        let deadline = Instant::now().checked_add(t);
        loop {
            if let Some(i) = self.early.iter().position(|w| w.wr_id == wr_id) {
                let wc = self.early.remove(i);
                if wc.wr_id == RECV {
                    self.recv_posted = false;
                }
                if wc.status != WcStatus::Success && self.disconnected {
                    return Ok(None);
                }
                ensure!(
                    wc.status == WcStatus::Success,
                    "work request {wr_id}: {:?}",
                    wc.status
                );
                return Ok(Some(wc));
            }
            let mut wc = [WorkCompletion::default(); 4];
            let n = self.cq.poll(&mut wc)?;
            self.early.extend_from_slice(&wc[..n]);
            if n > 0 {
                continue;
            }
            if !self.disconnected {
                if let Some(ev) = ch.get_event(Some(Duration::ZERO))? {
                    ensure!(
                        ev.event == E::Disconnected,
                        "unexpected {ev} while waiting for work request {wr_id}"
                    );
                    self.disconnected = true;
                    cmqp::to_err(&self.qp)?;
                    continue;
                }
            }
            ensure!(
                deadline.is_none_or(|d| Instant::now() < d),
                "no completion of work request {wr_id} within {t:?}"
            );
            std::thread::yield_now();
        }
    }

    /// After a disconnect: waits (at most `t`) for a receive still posted to complete
    /// flushed, so that no completion is left unpolled when the QP goes.
    fn drain(&mut self, ch: &EventChannelOf<B>, t: Duration) -> Res<()> {
        if self.recv_posted {
            self.disconnected = true;
            self.wait(ch, RECV, t)?;
        }
        Ok(())
    }

    /// The peer's buffer a received `rping_rdma_info` names.
    fn remote(&self) -> Res<(RemoteAddr, u32)> {
        let mut info = [0u8; INFO];
        self.recv.read(0, &mut info)?;
        let addr = u64::from_be_bytes(info[..8].try_into().expect("8 bytes"));
        let rkey = u32::from_be_bytes(info[8..12].try_into().expect("4 bytes"));
        let len = u32::from_be_bytes(info[12..].try_into().expect("4 bytes"));
        Ok((RemoteAddr::new(addr, rkey), len))
    }

    /// The bytes of `mr` up to its first NUL, as text.
    fn text(mr: &MrOf<B>) -> Res<String> {
        let mut b = vec![0u8; mr.len()];
        mr.read(0, &mut b)?;
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        Ok(String::from_utf8_lossy(&b[..end]).into_owned())
    }
}

// README:begin
// Client: resolve the address and the route, connect with the QP, and complete the
// connection on the server's response (RTR, RTS, then rdma_establish).
fn connect<B: CmBackend>(b: &B, dst: SocketAddr, size: u32, t: Duration) -> Res<Conn<B>> {
    let ch = b.create_event_channel()?;
    let id = ch.create_id(0, PortSpace::Tcp, QpType::Rc)?;
    id.resolve_addr(None, dst, t)?;
    cmqp::expect(&ch, E::AddrResolved, t)?;
    id.resolve_route(t)?;
    cmqp::expect(&ch, E::RouteResolved, t)?;
    let r = Rping::new(&id, size)?; // PD, CQ, QP in INIT (rdma_create_qp), buffers
    cmqp::connect(&id, &r.qp, &ConnParam::rc(&[]))?;
    cmqp::expect(&ch, E::ConnectResponse, t)?;
    cmqp::complete_connect(&id, &r.qp)?;
    Ok((ch, id, r, None))
}

// Server: listen, take a request, accept it with a QP (in RTS before the accept goes).
fn accept<B: CmBackend>(b: &B, at: SocketAddr, size: u32, t: Duration) -> Res<Conn<B>> {
    let ch = b.create_event_channel()?;
    let listener = ch.create_id(0, PortSpace::Tcp, QpType::Rc)?;
    listener.bind_addr(at)?;
    listener.listen(3)?;
    let request = cmqp::expect(&ch, E::ConnectRequest, t)?;
    let id = request.new_id.context("a request without its id")?; // it reports to `ch`
    let r = Rping::new(&id, size)?;
    cmqp::accept(&id, &r.qp, &ConnParam::rc(&[]))?;
    cmqp::expect(&ch, E::Established, t)?;
    Ok((ch, id, r, Some(listener)))
}
// README:end

/// A connection: its channel, its id, rping's side and the server's listener.
type Conn<B> = (EventChannelOf<B>, CmIdOf<B>, Rping<B>, Option<CmIdOf<B>>);

/// rping's client pattern for ping `n`, starting the alphabet at `start`.
fn pattern(n: u64, start: u8, size: usize) -> Vec<u8> {
    let mut b = format!("rdma-ping-{n}: ").into_bytes();
    b.truncate(size - 1);
    let mut c = start;
    while b.len() < size {
        b.push(c);
        c = if c >= b'z' { b'A' } else { c + 1 };
    }
    b[size - 1] = 0;
    b
}

/// The client: `o.count` pings to the server at `o.addr`; how many it made.
pub fn client<B: CmBackend>(b: &B, o: &Opts) -> Res<u64> {
    let dst = o.addr;
    let t = o.wait;
    let (ch, id, mut r, _) = connect(b, dst, o.size, t).with_context(|| format!("connecting to {dst}"))?;
    let size = o.size as usize;
    let mut start = b'A';
    let mut n = 0;
    while o.count == 0 || n < o.count {
        let data = pattern(n, start, size);
        start = if start >= b'z' { b'A' } else { start + 1 };
        r.start.write(0, &data)?;
        r.send_info(&r.start)?;
        for id in [SEND, RECV] {
            r.wait(&ch, id, t)?.context("the server disconnected")?;
        }
        r.post_recv()?;
        r.send_info(&r.rdma)?;
        for id in [SEND, RECV] {
            r.wait(&ch, id, t)?.context("the server disconnected")?;
        }
        r.post_recv()?;
        let mut got = vec![0u8; size];
        r.rdma.read(0, &mut got)?;
        if o.validate {
            ensure!(got == data, "data mismatch in ping {n}");
        }
        if o.verbose {
            println!("ping data: {}", Rping::<B>::text(&r.rdma)?);
        }
        n += 1;
    }
    cmqp::disconnect(&id, &r.qp)?;
    r.drain(&ch, t)?;
    cmqp::expect(&ch, E::Disconnected, t)?;
    Ok(n)
}

/// The server: serves one client at `o.addr` until it disconnects; how many pings it
/// served (a ping is served once its data is written back).
pub fn server<B: CmBackend>(b: &B, o: &Opts) -> Res<u64> {
    let at = o.addr;
    let t = o.wait;
    let (ch, id, mut r, _listener) = accept(b, at, o.size, t).with_context(|| format!("serving at {at}"))?;
    let mut n = 0;
    loop {
        // The client's start buffer, to READ.
        let Some(_) = r.wait(&ch, RECV, Duration::MAX)? else {
            break;
        };
        let (remote, len) = r.remote()?;
        ensure!(
            len <= o.size,
            "the client's buffer ({len} bytes) exceeds -S {}",
            o.size
        );
        r.post_recv()?;
        let sge = [r.rdma.sge(0, len as usize)?];
        r.qp.post_send(&[SendWr::read(RDMA, &sge, remote).signaled()])?;
        let Some(_) = r.wait(&ch, RDMA, t)? else { break };
        let text = Rping::<B>::text(&r.rdma)?;
        if o.verbose {
            println!("server ping data: {text}");
        }
        r.send_info(&r.rdma)?;
        let Some(_) = r.wait(&ch, SEND, t)? else { break };
        // The client's second buffer, to WRITE what was read to.
        let Some(_) = r.wait(&ch, RECV, t)? else { break };
        let (remote, _) = r.remote()?;
        r.post_recv()?;
        let sge = [r.rdma.sge(0, text.len() + 1)?];
        r.qp.post_send(&[SendWr::write(RDMA, &sge, remote).signaled()])?;
        let Some(_) = r.wait(&ch, RDMA, t)? else { break };
        // The ping is done: the client may disconnect before this go-ahead's
        // acknowledgement comes back, which flushes it.
        n += 1;
        r.send_info(&r.rdma)?;
        let Some(_) = r.wait(&ch, SEND, t)? else { break };
    }
    cmqp::disconnect(&id, &r.qp)?;
    r.drain(&ch, t)?;
    Ok(n)
}
