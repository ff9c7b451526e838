//! A port whose address changes while it is up, as a real port's does (`man
//! ibv_get_async_event`: `IBV_EVENT_LID_CHANGE`, `IBV_EVENT_GID_CHANGE`; `man
//! ibv_query_port`, `man ibv_query_gid`):
//!
//! - **InfiniBand port, a new LID** ([`DeviceShared::change_lid`]), as when the subnet
//!   manager assigns the port another LID (IBA 14.4.11): the sim's LID is its listener's
//!   TCP port ([`addressing`](crate::addressing)), so the listener moves to a new port
//!   and the old one closes; `IBV_EVENT_LID_CHANGE`, and `ibv_query_port` reads the new
//!   LID. The device stays a member of its multicast groups (a switch forwards a group
//!   to a port, whatever its LID).
//! - **Ethernet (RoCE) port, an address added or removed** ([`DeviceShared::add_gid`],
//!   [`DeviceShared::remove_gid`]), as `ip addr add|del` on an rxe netdev makes the
//!   kernel add or empty a GID table entry: the entry after the populated ones (or the
//!   first emptied one) gets the address's GID (`::ffff:a.b.c.d`, RoCE v2) and the
//!   device listens there too; removed, the entry reads as the zero GID and nothing
//!   listens there. `IBV_EVENT_GID_CHANGE` either way.
//!
//! What named the old address reaches nothing, as on a fabric whose routes to it are
//! gone, and nothing sent to it succeeds silently: on a LID change or a removed GID every
//! connection and UD link of the device closes (those set up through an address that
//! still holds come back at once, losing nothing, as after a port that came back in
//! time). A connected QP's peer still names the old LID: the QP's hellos, which name the
//! new one, are refused, and the peer's reach the old TCP port, where no one listens, so
//! RC requests on both sides are retried per `retry_cnt` and end in
//! `IBV_WC_RETRY_EXC_ERR` (UC's are lost); a QP whose source GID entry was removed names
//! the zero GID, which its peer refuses alike. Datagrams to the old address are lost
//! (their WRs complete SUCCESS, as UD's do). An RC QP past RTR cannot take a new address
//! vector (only path migration could, which the sim does not serve), so an application
//! sets new QPs up, as on an HCA after its port's address changed. An added GID changes
//! nothing for what is connected.
//!
//! C programs schedule a change with [`SCHEDULE_SETTING`]; `rdma-sim addr DEV change`
//! makes one through the device's control socket.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use verbs_api::{AsyncElement, AsyncEvent, AsyncEventType, Error, Gid, Result};

use crate::device::DeviceShared;
use crate::port::Schedule;

/// The environment variable that schedules an address change for C programs:
/// `AFTER[:FOR]` in milliseconds. `AFTER` ms after a device opens, its address changes
/// ([`DeviceShared::change_address`]); with `FOR`, `FOR` ms later it changes again (an
/// InfiniBand port gets another LID, a RoCE port loses the GID it gained).
pub const SCHEDULE_SETTING: &str = "RDMA_SIM_ADDR_CHANGE";

/// What [`DeviceShared::change_address`] changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Changed {
    /// The port's new LID.
    Lid(u16),
    /// The GID table entry that was added.
    GidAdded(u32),
}

fn refused(why: String) -> Error {
    Error::invalid("faults", why)
}

fn os(call: &'static str) -> impl Fn(std::io::Error) -> Error {
    move |source| Error::Os { call, source }
}

impl DeviceShared {
    /// The port's address changes as its link layer's does: an InfiniBand port gets a new
    /// LID ([`change_lid`](Self::change_lid)), a RoCE port a new GID at a loopback
    /// address drawn for it ([`add_gid`](Self::add_gid)).
    pub fn change_address(&self) -> Result<Changed> {
        match self.addr.roce {
            true => self.add_gid(None).map(Changed::GidAdded),
            false => self.change_lid().map(Changed::Lid),
        }
    }

    /// The InfiniBand port gets a new LID (see the module docs); it is returned.
    pub fn change_lid(&self) -> Result<u16> {
        if self.addr.roce {
            return Err(refused(format!(
                "{}'s port is Ethernet (RoCE): its LID is 0 and its addresses are GIDs (add_gid, remove_gid)",
                self.name
            )));
        }
        let mut listeners = self.listeners.lock();
        let old = self.addr.listen_addr();
        // Bound while the old port is still held, so the kernel gives another one.
        let sock = crate::lid_port::bind(SocketAddr::new(old.ip(), 0), &self.choices)
            .map_err(os("bind (sim device listener, new LID)"))?;
        let new = self.listen_on(sock)?;
        let listening = crate::transport::spawn_listener(&self.setup, new.1)?;
        let lid = new.0.port();
        self.addr.set_port(lid);
        // The old listener and its same-host socket close with the entry.
        listeners.retain(|(at, _)| *at != old);
        listeners.push((new.0, listening));
        drop(listeners);
        tracing::debug!(device = %self.name, old = old.port(), new = lid, "port 1: LID changed");
        self.drop_connections();
        self.mcast.moved(self.addr.advertise_addr());
        self.raise(AsyncEventType::LidChange);
        Ok(lid)
    }

    /// The RoCE port gains the GID of `ip` (with `None` or an IPv4 loopback `ip`, of an
    /// address drawn in 127.0.0.0/8 that no device holds, for a device on loopback), and
    /// the device listens there; the entry's index is returned.
    pub fn add_gid(&self, ip: Option<IpAddr>) -> Result<u32> {
        if !self.addr.roce {
            return Err(refused(format!(
                "{}'s port is InfiniBand: its GID table is fixed, its address is its LID (change_lid)",
                self.name
            )));
        }
        let want = match ip {
            Some(ip) => ip,
            None if self.addr.listen.ip().is_loopback() => Ipv4Addr::LOCALHOST.into(),
            None => {
                return Err(refused(format!(
                    "{} listens at {}, not on loopback: name the address to add",
                    self.name, self.addr.listen
                )))
            }
        };
        let mut listeners = self.listeners.lock();
        let sock = crate::device::bind_roce(SocketAddr::new(want, 0), &self.choices)?;
        let (at, l) = self.listen_on(sock)?;
        let gid = match at.ip() {
            IpAddr::V4(v4) => Gid::from(v4),
            IpAddr::V6(v6) => Gid::from(v6),
        };
        let Some(index) = self.addr.add_gid(gid) else {
            return Err(refused(format!(
                "{}'s GID table is full ({} entries)",
                self.name, self.addr.gid_tbl_len
            )));
        };
        listeners.push((at, crate::transport::spawn_listener(&self.setup, l)?));
        drop(listeners);
        tracing::debug!(device = %self.name, index, %at, "port 1: GID added");
        self.raise(AsyncEventType::GidChange);
        Ok(index)
    }

    /// The RoCE port loses the GID at `index`, one [`add_gid`](Self::add_gid) added: the
    /// entry empties and nothing listens at its address (see the module docs).
    pub fn remove_gid(&self, index: u32) -> Result<()> {
        let mut listeners = self.listeners.lock();
        let Some(gid) = self.addr.remove_gid(index) else {
            return Err(refused(format!(
                "{}'s GID entry {index} is not one that was added (entries 0..{} are the port's own)",
                self.name,
                self.addr.gids.len()
            )));
        };
        let at = crate::addressing::gid_addr(&gid.0, 0);
        // The listener and its same-host socket close as their entry goes.
        listeners.retain(|(a, _)| crate::addressing::canonical(*a) != at);
        drop(listeners);
        tracing::debug!(device = %self.name, index, %at, "port 1: GID removed");
        self.drop_connections();
        self.raise(AsyncEventType::GidChange);
        Ok(())
    }

    /// `sock` listening, as the device's first listener is: its address and listener.
    fn listen_on(&self, sock: socket2::Socket) -> Result<(SocketAddr, std::net::TcpListener)> {
        sock.listen(1024).map_err(os("listen"))?;
        sock.set_nonblocking(true).map_err(os("fcntl(O_NONBLOCK)"))?;
        let l: std::net::TcpListener = sock.into();
        let at = l.local_addr().map_err(os("getsockname"))?;
        Ok((at, l))
    }

    fn raise(&self, event_type: AsyncEventType) {
        self.events.raise(AsyncEvent {
            event_type,
            element: AsyncElement::Port(1),
        });
    }

    /// Changes the address as `s` says, on the setup runtime (`FOR`: changes it again).
    pub(crate) fn schedule_address_change(self: &Arc<Self>, s: Schedule) {
        let weak = Arc::downgrade(self);
        self.setup.rt.spawn(async move {
            tokio::time::sleep(s.after).await;
            let Some(d) = weak.upgrade() else { return };
            let first = d.change_address();
            drop(d);
            let first = match first {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!("{SCHEDULE_SETTING}: the address did not change: {e}");
                    return;
                }
            };
            let Some(f) = s.down_for else { return };
            tokio::time::sleep(f).await;
            let Some(d) = weak.upgrade() else { return };
            let again = match first {
                Changed::Lid(_) => d.change_lid().map(drop),
                Changed::GidAdded(i) => d.remove_gid(i),
            };
            if let Err(e) = again {
                tracing::warn!("{SCHEDULE_SETTING}: the address did not change back: {e}");
            }
        });
    }
}

/// The schedule [`SCHEDULE_SETTING`] asks for (unset or empty: none).
pub fn schedule_from_env() -> Result<Option<Schedule>> {
    crate::port::schedule_from(SCHEDULE_SETTING)
}
