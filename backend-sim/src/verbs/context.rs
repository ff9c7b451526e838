//! An open device (`struct ibv_context`): its attributes (`ibv_query_device`,
//! `ibv_query_port`, `ibv_query_gid`), the objects made from it (PDs, completion channels
//! and CQs) and its asynchronous events (`ibv_get_async_event`, `ibv_ack_async_event`).

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

use verbs_api::{AsyncEvent, Capabilities, Context, DeviceAttr, Error, Gid, PortAttr, Result};

use super::backend::SimBackend;
use super::cq::SimChannel;
use super::cq::SimCq;
use super::pd::SimPd;
use crate::comp_channel::ChannelShared;
use crate::cq::CqShared;
use crate::device::{DeviceShared, PdShared};
use crate::faults;

/// An open simulated device.
pub struct SimContext {
    pub(crate) dev: Arc<DeviceShared>,
}

impl SimContext {
    /// The TCP address this device listens on.
    pub fn listen_addr(&self) -> SocketAddr {
        self.dev.addr.listen_addr()
    }

    /// How many RDMA WRITEs this device's requesters placed in same-host peers' memory
    /// themselves (the one-sided fast path, docs/sim.md); 0 with the path off.
    pub fn onesided_placed(&self) -> u64 {
        self.dev.onesided.as_ref().map_or(0, |o| o.placed())
    }

    /// The TCP address peers reach this device at: [`listen_addr`](Self::listen_addr),
    /// with a wildcard IP replaced by the advertised one (GID index 0).
    pub fn advertised_addr(&self) -> SocketAddr {
        self.dev.addr.advertise_addr()
    }

    /// Fault injection on this device (see [`faults`]).
    pub fn faults(&self) -> faults::Faults {
        faults::Faults::new(&self.dev)
    }

    /// Captures this device's traffic into `w` from now on ([`crate::capture`]): the
    /// RoCE v2 packets its connections set up from now on and its datagrams send, and
    /// the verbs context (QP states, WRs, completions, faults) as events, in pcapng, each
    /// packet kept as `snaplen` says. For tests: the capture it returns flushes what it
    /// buffered ([`Capture::flush`](crate::capture::Capture::flush)) and so does the last
    /// device that holds it when it closes. Fails if the device captures already (to
    /// `RDMA_SIM_PCAP`, the backend's configured file, or an earlier call).
    pub fn capture_to(
        &self,
        w: impl std::io::Write + Send + 'static,
        snaplen: crate::capture::Snaplen,
    ) -> Result<Arc<crate::capture::Capture>> {
        if self.dev.capture.get().is_some() {
            return Err(Error::invalid("capture_to", "the device captures already"));
        }
        let cap = crate::capture::Capture::to_writer(w, snaplen).map_err(|source| Error::Os {
            call: "write (capture header)",
            source,
        })?;
        self.dev
            .capture
            .set(cap.clone())
            .map_err(|_| Error::invalid("capture_to", "the device captures already"))?;
        Ok(cap)
    }

    /// What this device's responders dropped silently so far, and its requesters' local
    /// ACK timeouts (see [`crate::counters`]).
    pub fn counters(&self) -> crate::counters::Counters {
        self.dev.counters.snapshot()
    }
}

impl SimContext {
    /// `ibv_get_async_event` as libibverbs does it, a `read(2)` of the context's
    /// `async_fd` in the calling thread (see [`EventQueue::read`]): what a C program's
    /// signals and `O_NONBLOCK` expect.
    ///
    /// [`EventQueue::read`]: verbs_api::event_queue::EventQueue::read
    pub fn read_async_event(&self) -> Result<AsyncEvent> {
        self.dev.events.read()
    }
}

impl Context for SimContext {
    type Backend = SimBackend;

    fn name(&self) -> &str {
        &self.dev.name
    }

    fn query_device(&self) -> Result<DeviceAttr> {
        Ok(DeviceAttr::clone(&self.dev.attr))
    }

    fn query_port(&self, port_num: u8) -> Result<PortAttr> {
        if port_num != 1 {
            return Err(Error::invalid(
                "ibv_query_port",
                format!("port {port_num} does not exist (ports: 1)"),
            ));
        }
        Ok(self.dev.port_attr())
    }

    fn query_gid(&self, port_num: u8, index: u32) -> Result<Gid> {
        if port_num != 1 {
            return Err(Error::invalid(
                "ibv_query_gid",
                format!("port {port_num} does not exist (ports: 1)"),
            ));
        }
        // An empty entry reads as the zero GID, as `ibv_query_gid` answers for one.
        self.dev.addr.gid_at(index).ok_or_else(|| {
            Error::invalid(
                "ibv_query_gid",
                format!(
                    "index {index} is outside the GID table of {} entries",
                    self.dev.addr.gid_tbl_len
                ),
            )
        })
    }

    fn capabilities(&self) -> Result<Capabilities> {
        Ok(self.dev.capabilities())
    }

    fn alloc_pd(&self) -> Result<SimPd> {
        Ok(SimPd {
            pd: Arc::new(PdShared {
                handle: self.dev.next_handle(),
                dev: self.dev.clone(),
            }),
        })
    }

    fn create_comp_channel(&self) -> Result<SimChannel> {
        Ok(SimChannel {
            ch: Arc::new(ChannelShared::new()?),
            progress: Arc::downgrade(&self.dev.progress),
        })
    }

    fn create_cq(&self, cqe: u32, channel: Option<&SimChannel>) -> Result<SimCq> {
        if cqe == 0 || cqe > self.dev.attr.max_cqe {
            return Err(Error::invalid(
                "ibv_create_cq",
                format!("cqe {cqe} is outside 1..={}", self.dev.attr.max_cqe),
            ));
        }
        // The device may give more than asked (`Switches::queue_sizing`: rxe and mlx5
        // round up to a power of two minus one); the limit is on what was asked.
        let entries = self.dev.profile.switches().queue_sizing.cq_entries(cqe);
        Ok(SimCq {
            cq: Arc::new(CqShared::new(
                self.dev.next_handle(),
                entries,
                channel.map(|c| c.ch.clone()),
            )),
            dev: self.dev.clone(),
        })
    }

    fn get_async_event(&self, timeout: Option<Duration>) -> Result<Option<AsyncEvent>> {
        self.dev.events.get(timeout)
    }

    fn ack_async_event(&self, event: AsyncEvent) {
        self.dev.events.ack(event)
    }

    fn async_fd(&self) -> RawFd {
        self.dev.events.fd()
    }
}
