//! Each open sim device's read-only control endpoint, and the client that reads them:
//! what `rdma-sim status` shows of the sim devices live on this host (their QPs, states,
//! peers and counters), as `rdma resource show qp` and `ibv_devinfo` show a real HCA's.
//!
//! A device serves a snapshot of its state ([`DeviceStatus`], one JSON line) to whoever
//! connects to its unix socket. The one thing a client can change is the port: its state
//! or its address (`rdma-sim port DEV down|up|addr`, [`set_port`]: fault injection for programs that have no
//! [`Faults`](crate::faults::Faults) handle, C programs under `rdma-sim`). The sockets live in one directory per user
//! ([`dir::resolve`]: `RDMA_SIM_CONTROL`, else `$XDG_RUNTIME_DIR/rdma-sim`, else
//! `/tmp/rdma-sim-<uid>`), which must be the user's own with no access for anyone else;
//! a connection from another user is closed unanswered. The snapshot shows no memory
//! contents and no keys. `RDMA_SIM_CONTROL=off` turns the endpoints off.

pub(crate) mod dir;
mod serve;
mod status;

pub(crate) use dir::ensure as ensure_directory;
pub use dir::resolve as directory;
pub(crate) use serve::{open, Endpoint, Source};
pub use status::{list, set_port, DeviceStatus, Found, PortRequest, QpStatus};
