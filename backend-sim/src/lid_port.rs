//! The TCP port a device listens on, which is its port's LID ([`addressing`](crate::addressing)).
//!
//! A LID is a unicast LID only below 0xC000 (IBA 4.1.3; 0xC000..=0xFFFE are multicast),
//! and programs that exchange LIDs alone (`ibv_rc_pingpong` without `-g`, perftest on an
//! InfiniBand port) pass them through 16-bit unicast fields. The kernel's ephemeral ports
//! (`net.ipv4.ip_local_port_range`, 32768..=60999 by default) straddle 0xC000, so a
//! device whose port is not configured binds an ephemeral port and keeps it only if it is
//! below 0xC000: refused ports stay bound until one is found, so the kernel does not
//! offer them again, and are then closed. If the ephemeral range offers none (a range set
//! entirely above 0xC000), the device tries random ports in 1024..0xC000 itself, as it
//! does from the start under a seed ([`crate::choices`]). A
//! configured port is used as given; one at or above 0xC000 gets a warning, since its LID
//! is not a unicast LID.

use std::io;
use std::net::SocketAddr;

use crate::choices::{Choice, Choices};

/// The first LID that is not a unicast LID.
pub const MULTICAST_LID_BASE: u16 = 0xc000;

/// Ephemeral ports tried before picking ports ourselves.
const EPHEMERAL_TRIES: usize = 64;
/// Random ports tried after that.
const RANDOM_TRIES: usize = 256;

fn socket(listen: SocketAddr) -> io::Result<socket2::Socket> {
    socket2::Socket::new(
        socket2::Domain::for_address(listen),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )
}

/// A socket bound to `listen` (not yet listening) whose port is a unicast LID, unless
/// `listen` names a port. Seeded `choices` skip the kernel's ephemeral ports and draw
/// the port from the seed, so that the LID repeats from run to run.
pub fn bind(listen: SocketAddr, choices: &Choices) -> io::Result<socket2::Socket> {
    if listen.port() != 0 {
        if listen.port() >= MULTICAST_LID_BASE {
            tracing::warn!(
                %listen,
                "the sim device's LID is its TCP port, and {:#x} is not a unicast LID (below 0xc000): \
                 programs that exchange LIDs may refuse it, and a UD address handle needs the GRH to \
                 reach it (without it the LID names a multicast group)",
                listen.port()
            );
        }
        let sock = socket(listen)?;
        // A fixed port is reused at once after a restart, despite TIME_WAIT.
        sock.set_reuse_address(true)?;
        sock.bind(&listen.into())?;
        return Ok(sock);
    }
    // Without SO_REUSEADDR, so that a port held here is not offered again.
    let mut refused = Vec::new();
    let ephemeral_tries = if choices.seeded() { 0 } else { EPHEMERAL_TRIES };
    for _ in 0..ephemeral_tries {
        let sock = socket(listen)?;
        sock.bind(&listen.into())?;
        let port = sock.local_addr()?.as_socket().map_or(0, |a| a.port());
        if port != 0 && port < MULTICAST_LID_BASE {
            return Ok(sock);
        }
        refused.push(sock);
    }
    drop(refused);
    let mut last = io::Error::from(io::ErrorKind::AddrInUse);
    for _ in 0..RANDOM_TRIES {
        let mut addr = listen;
        addr.set_port(choices.in_range(Choice::Address, 1024..MULTICAST_LID_BASE));
        let sock = socket(addr)?;
        match sock.bind(&addr.into()) {
            Ok(()) => return Ok(sock),
            Err(e) => last = e,
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unconfigured_ports_are_unicast_lids() {
        let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
        // Enough devices that an ephemeral port above 0xc000 is all but certain to come up.
        let socks: Vec<_> = (0..32)
            .map(|_| bind(listen, &Choices::new(None, "test")).unwrap())
            .collect();
        for s in &socks {
            let port = s.local_addr().unwrap().as_socket().unwrap().port();
            assert!(port > 0 && port < MULTICAST_LID_BASE, "port {port:#x}");
        }
    }

    #[test]
    fn a_configured_port_is_used_as_given() {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = probe.local_addr().unwrap().port();
        drop(probe);
        let s = bind(
            SocketAddr::from(([127, 0, 0, 1], port)),
            &Choices::new(None, "test"),
        )
        .unwrap();
        assert_eq!(s.local_addr().unwrap().as_socket().unwrap().port(), port);
    }
}
