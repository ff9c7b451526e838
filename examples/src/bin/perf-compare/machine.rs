//! What the report says about where it was measured ([`machine`], [`date`]), and the
//! open-file limit the many-QP rows need ([`raise_fd_limit`]).

use std::net::{TcpListener, TcpStream};
use std::process::Command;

/// The machine: CPUs, kernel, and the congestion control a data connection gets.
pub fn machine() -> String {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let host_cc = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control").unwrap_or_default();
    // What a data connection really gets (the host may not offer what the sim asks for).
    let cc = loopback_congestion().unwrap_or_else(|e| format!("unknown ({e})"));
    format!(
        "{cpus} x {model}, Linux {}; TCP congestion control {cc} (host default {})",
        kernel.trim(),
        host_cc.trim()
    )
}

/// The congestion control of a loopback connection with the sim's socket options.
fn loopback_congestion() -> std::io::Result<String> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let c = TcpStream::connect(l.local_addr()?)?;
    backend_sim::sockopt::tune(&c)?;
    backend_sim::sockopt::congestion_of(&c)
}

/// Raises the open-file limit to its hard limit (each QP of the QP rows holds a socket).
pub fn raise_fd_limit() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit write/read a live rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

/// Today (UTC), as `date -u +%Y-%m-%d` prints it.
pub fn date() -> String {
    Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}
