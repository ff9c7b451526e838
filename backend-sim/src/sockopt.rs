//! The TCP options of the sim's data connections (`tcp(7)`): no Nagle delay, and a
//! congestion control chosen for the sim rather than inherited from the host.
//!
//! The congestion control matters on loopback. With BBR (the default of some
//! distributions) the sending side paces at its own estimate of the path's bandwidth;
//! the sim's traffic is application-limited in bursts (an application thread polls,
//! posts, and is descheduled), and that estimate often settles far below what the host
//! can copy (see docs/performance.md, "Congestion control"). So the sim asks for CUBIC
//! (Linux's default), unless `RDMA_SIM_TCP_CC` names another algorithm
//! (`reno`, `bbr`, ...) or says `system` to keep the host's choice. An algorithm the host
//! does not offer or allow (`net.ipv4.tcp_allowed_congestion_control`) is not an error:
//! the connection keeps the host's default, and the sim logs it at debug level.

use std::io;
use std::os::fd::AsFd;

/// The congestion control the sim asks for unless `RDMA_SIM_TCP_CC` says otherwise.
pub const DEFAULT_CONGESTION: &str = "cubic";

/// The congestion control the sim's data connections ask for, or `None` to keep the
/// host's default (`RDMA_SIM_TCP_CC=system`, or empty).
pub fn congestion() -> Option<String> {
    match std::env::var("RDMA_SIM_TCP_CC") {
        Ok(v) if v.is_empty() || v == "system" => None,
        Ok(v) => Some(v),
        Err(_) => Some(DEFAULT_CONGESTION.to_string()),
    }
}

/// Sets `TCP_CONGESTION` on `sock` to `algo`.
pub fn set_congestion(sock: &impl AsFd, algo: &str) -> io::Result<()> {
    socket2::SockRef::from(sock).set_tcp_congestion(algo.as_bytes())
}

/// The congestion control `sock` uses (`TCP_CONGESTION` as the kernel reports it).
pub fn congestion_of(sock: &impl AsFd) -> io::Result<String> {
    let mut v = socket2::SockRef::from(sock).tcp_congestion()?;
    // The kernel pads the name with NULs.
    v.retain(|&b| b != 0);
    Ok(String::from_utf8_lossy(&v).into_owned())
}

/// The options of a data connection: `TCP_NODELAY`, and the congestion control of
/// [`congestion`] if the host allows it (else it keeps the host's default).
pub fn tune(sock: &impl AsFd) -> io::Result<()> {
    let s = socket2::SockRef::from(sock);
    s.set_tcp_nodelay(true)?;
    if let Some(algo) = congestion() {
        if let Err(e) = s.set_tcp_congestion(algo.as_bytes()) {
            tracing::debug!("TCP congestion control {algo:?} not available ({e}); keeping the host's");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_connection_gets_nodelay_and_the_chosen_congestion_control() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        // Reno is built into every Linux kernel, so the host always offers it.
        set_congestion(&c, "reno").unwrap();
        assert_eq!(congestion_of(&c).unwrap(), "reno");
        tune(&c).unwrap();
        assert!(socket2::SockRef::from(&c).tcp_nodelay().unwrap());
        if let Some(algo) = congestion() {
            let offered = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
                .unwrap_or_default();
            let got = congestion_of(&c).unwrap();
            if offered.split_whitespace().any(|a| a == algo) {
                assert_eq!(got, algo);
            } else {
                // Not offered here: the connection keeps what it had.
                assert_eq!(got, "reno");
            }
        }
        // An algorithm nobody has is an error from the kernel, not a panic.
        assert!(set_congestion(&c, "no-such-algorithm").is_err());
    }
}
