//! # backend-sim: a simulated RDMA HCA over TCP
//!
//! A verbs device that behaves like a real one, including what hurts: a SEND that meets
//! an empty receive queue gets an RNR NAK and is retried per `rnr_retry` /
//! `min_rnr_timer` until it fails with `IBV_WC_RNR_RETRY_EXC_ERR`; every remote access is
//! checked against the rkey, PD, access flags and bounds; atomics are truly atomic, 64-bit
//! and 8-byte aligned, and return the old value; errors move the QP to ERR and flush what
//! is outstanding.
//!
//! ```
//! use verbs_api::*;
//! let sim = backend_sim::SimBackend::default();
//! let ctx = sim.open("sim0")?;
//! let pd = ctx.alloc_pd()?;
//! let cq = ctx.create_cq(16, None)?;
//! let mr = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
//! // A QP connected to itself: an RDMA WRITE from the region into the region.
//! let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq, QpCap::new(4, 4)))?;
//! let p = RcParams::default();
//! let me = local_endpoint(&ctx, &qp, &p, 7)?;
//! connect_rc(&qp, &p, me.psn, &me)?;
//! mr.write(0, b"hello")?;
//! qp.post_send(&[SendWr::write(1, &[mr.sge(0, 5)?], mr.remote().at(64)).signaled()])?;
//! let wc = poll_n(&cq, 1, std::time::Duration::from_secs(5))?;
//! assert_eq!(wc[0].status, WcStatus::Success);
//! let mut b = [0u8; 5];
//! mr.read(64, &mut b)?;
//! assert_eq!(&b, b"hello");
//! # Ok::<(), verbs_api::Error>(())
//! ```
//!
//! ## Layers
//!
//! The protocol is the sans-IO crate `backend-sim-proto` (wire format, registered memory
//! and its access check, requester, responder, the connection's ACK policy); this crate
//! is its driver, in layers that import only downwards:
//!
//! - the verbs handles ([`SimBackend`], [`SimContext`], [`SimPd`], [`SimMr`], [`SimMw`],
//!   [`SimCq`], [`SimChannel`], [`SimQp`], [`SimSrq`], [`SimAh`]) and the fault-injection API
//!   ([`faults`]);
//! - the device (its attributes, tables, threads), which implements what a QP asks of it;
//! - the links between devices that carry UD datagrams (set up and checked as a hello
//!   is, served by tasks on the setup runtime), and the multicast groups whose datagrams
//!   they fan out;
//! - connection setup (tokio + socket2: the listener, the hello and its check);
//! - the data path (one progress thread per device and the application's own threads:
//!   epoll, timers, delayed ACKs, the driving window, a fault layer);
//! - the QP (state machine, post verbs), the CQs, an established connection, the
//!   device's counters of silent drops ([`counters`]);
//! - system calls, socket options, addresses.
//!
//! ## Addressing and configuration
//!
//! Each opened device listens on its own TCP address (loopback and an ephemeral port by
//! default). Its LID is that port and its GID the IP it advertises, so the usual
//! out-of-band exchange of (GID, LID, QPN, PSN) is all a peer needs, in the same process,
//! another process or another host. [`SimConfig`] (or the environment, see
//! [`SimBackend::from_env`]) chooses the listen address, the advertised address and the
//! number of devices, and [`Profile`] the kind of HCA they play (`portable`, `rxe`,
//! `mlx5`; see [`profile`]). The data connections use CUBIC congestion control whatever the
//! host's default (`RDMA_SIM_TCP_CC` chooses another, or `system`; see [`sockopt`] for
//! why).

#![warn(missing_docs)]

mod addressing;
pub mod capture;
mod channel_signal;
pub mod choices;
mod comp_channel;
pub mod control;
pub mod counters;
mod cpu_share;
mod cq;
mod datagram;
mod device;
mod epoll;
#[cfg(test)]
mod event_tests;
mod fault_state;
pub mod faults;
mod fd_pass;
mod host_addrs;
mod lid_port;
mod link;
mod listener;
pub mod mapping;
mod mcast;
pub mod onesided;
mod port;
mod port_addr;
pub mod profile;
mod progress;
mod qp;
pub mod rdmacm;
mod ring_setup;
pub mod same_host;
pub mod shm_ring;
mod shm_segment;
mod signal_restart;
pub mod sockopt;
mod stream;
mod sys;
mod transport;
mod verbs;
mod verify;
#[cfg(test)]
mod waiter_tests;

pub use backend_sim_proto::NakReason;
pub use counters::Counters;
pub use profile::Profile;
pub use transport::NOT_READY_WAIT;
pub use verbs::ah::SimAh;
pub use verbs::backend::{CaptureConfig, SimBackend, SimConfig};
pub use verbs::context::SimContext;
pub use verbs::cq::{SimChannel, SimCq};
pub use verbs::mw::SimMw;
pub use verbs::pd::{SimMr, SimPd};
pub use verbs::qp::SimQp;
pub use verbs::srq::SimSrq;
