//! The same-host path: two devices on one host (one network namespace) connect their
//! QPs, and their links for UD datagrams, over a unix stream socket (`unix(7)`) instead
//! of TCP loopback. The stream carries
//! the same frames as TCP, byte for byte, through the same data path (see
//! [`stream`](crate::stream)), so RNR, PSNs, NAKs, flushes and every access check stay
//! as they are; only the kernel's TCP stack is skipped.
//!
//! Discovery is exact:
//! - a device publishes a unix socket beside its TCP listener, in a directory of the
//!   user's closed to everyone else (checked as the control sockets' is), named after its network namespace (the
//!   device and inode of `/proc/self/ns/net`) and the address its TCP listener is bound
//!   to (a wildcard bind included). Holding the TCP port makes any older file of that
//!   name stale (its device is gone), so the newcomer replaces it. A process that exits
//!   without closing its devices (most do) leaves its files behind: the first device a
//!   process publishes sweeps the directory of files of its namespace nobody listens on;
//! - a connector looks up (its own namespace, the peer's IP, the peer's port): the exact
//!   address, else a wildcard bind of that port if the IP is one of this namespace's own
//!   (loopback, or an interface's). Found: the peer is on this host, in this namespace.
//!   Not found (another namespace is another "host": the two-namespace tests), or the
//!   socket refuses (a process that was killed left its file, which is removed): TCP, as
//!   ever.
//!
//! The acceptor checks the connecting process's credentials (`SO_PEERCRED`): the same
//! user only, unless `RDMA_SIM_SHM_PEERS=any`. Then the hello and its token check run
//! exactly as on TCP ([`transport`](crate::transport), [`verify`](crate::verify)), so a
//! stranger on the unix socket is refused as on TCP. At most
//! [`MAX_UNPROVEN`](crate::listener::MAX_UNPROVEN) connections are in setup at once; one
//! beyond is closed at once (the connector retries, as over TCP).
//!
//! `RDMA_SIM_TRANSPORT=tcp` (or [`SimConfig::transport`](crate::SimConfig::transport))
//! turns the path off: nothing is published and every connection runs over TCP.
//! `RDMA_SIM_LINK_DIR` moves the directory.

use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};

use crate::addressing::canonical;

/// The setting that chooses the transport (`auto`, the default, or `tcp`).
pub const TRANSPORT_SETTING: &str = "RDMA_SIM_TRANSPORT";
/// The setting that widens who may connect on the unix socket (`user`, the default, or
/// `any`).
pub const PEERS_SETTING: &str = "RDMA_SIM_SHM_PEERS";
/// The setting that moves the directory of the unix sockets.
pub const DIR_SETTING: &str = "RDMA_SIM_LINK_DIR";

/// Bound on connecting to a peer's unix socket.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How a device's connections run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Transport {
    /// Over a unix socket to a device on the same host (same network namespace), over
    /// TCP to any other.
    #[default]
    Auto,
    /// Over TCP always.
    Tcp,
}

impl std::str::FromStr for Transport {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "auto" => Ok(Transport::Auto),
            "tcp" => Ok(Transport::Tcp),
            other => Err(format!("{other:?} is not a transport (auto or tcp)")),
        }
    }
}

/// Whose processes may connect on a device's unix socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Peers {
    /// Processes of the device's effective user.
    User,
    /// Any process that reaches the socket.
    Any,
}

fn peers() -> Peers {
    match std::env::var(PEERS_SETTING) {
        Ok(v) if v.trim() == "any" => Peers::Any,
        Ok(v) if !v.trim().is_empty() && v.trim() != "user" => {
            tracing::warn!(
                "{PEERS_SETTING}={v:?} is neither user nor any: only this user's processes may connect"
            );
            Peers::User
        }
        _ => Peers::User,
    }
}

/// The directory of the unix sockets: `RDMA_SIM_LINK_DIR`, else
/// `$XDG_RUNTIME_DIR/rdma-sim-link`, else `/tmp/rdma-sim-link-<uid>`.
fn dir() -> PathBuf {
    match std::env::var_os(DIR_SETTING) {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => match std::env::var_os("XDG_RUNTIME_DIR") {
            Some(run) if !run.is_empty() => Path::new(&run).join("rdma-sim-link"),
            _ => PathBuf::from(format!(
                "/tmp/rdma-sim-link-{}",
                rustix::process::geteuid().as_raw()
            )),
        },
    }
}

/// This process's network namespace: the device and inode of `/proc/self/ns/net`.
fn netns() -> io::Result<(u64, u64)> {
    let m = std::fs::metadata("/proc/self/ns/net")?;
    Ok((m.dev(), m.ino()))
}

/// The file name of the socket of a device listening at `listen` in namespace `ns`.
fn entry_name(ns: (u64, u64), listen: SocketAddr) -> String {
    let a = canonical(listen);
    format!("{:x}-{}-{}-{}.sock", ns.0, ns.1, a.ip(), a.port())
}

/// Where a device of this process's network namespace listening on TCP at `listen`
/// publishes its same-host socket (whether or not one is there).
pub fn published_path(listen: SocketAddr) -> Option<PathBuf> {
    Some(dir().join(entry_name(netns().ok()?, listen)))
}

/// A device's published socket; dropping it removes the file (if it is still this
/// device's, and in the process that published it: a forked child's copy leaves it).
pub struct Published {
    path: PathBuf,
    ino: u64,
    pid: u32,
}

impl Drop for Published {
    fn drop(&mut self) {
        if std::process::id() == self.pid
            && std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.ino)
        {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Published {
    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Publishes the unix socket of a device whose TCP listener is bound to `bound`. The
/// listener is non-blocking, for the setup runtime.
pub(crate) fn publish(bound: SocketAddr) -> io::Result<(std::os::unix::net::UnixListener, Published)> {
    let d = dir();
    crate::control::dir::ensure(&d)?;
    let ns = netns()?;
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| sweep(&d, ns));
    let path = d.join(entry_name(ns, bound));
    // This device holds the TCP port: a file of its name is a dead device's.
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let l = std::os::unix::net::UnixListener::bind(&path)?;
    // Whom the directory lets through, and `SO_PEERCRED`, decide who connects; the
    // socket itself is open (connecting needs write permission on it).
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
    l.set_nonblocking(true)?;
    let ino = std::fs::symlink_metadata(&path)?.ino();
    Ok((
        l,
        Published {
            path,
            ino,
            pid: std::process::id(),
        },
    ))
}

/// Removes the files of namespace `ns` in `d` that nobody listens on any more.
fn sweep(d: &Path, ns: (u64, u64)) {
    let prefix = format!("{:x}-{}-", ns.0, ns.1);
    let Ok(entries) = std::fs::read_dir(d) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            remove_if_stale(&e.path());
        }
    }
}

/// Removes the socket at `path` if nobody listens on it (unless another device
/// replaced it meanwhile); whether it was stale.
fn remove_if_stale(path: &Path) -> bool {
    let Ok(m) = std::fs::symlink_metadata(path) else {
        return false;
    };
    if !m.file_type().is_socket() {
        return false;
    }
    let refused = matches!(
        std::os::unix::net::UnixStream::connect(path),
        Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED)
    );
    if refused && std::fs::symlink_metadata(path).is_ok_and(|n| n.ino() == m.ino()) {
        let _ = std::fs::remove_file(path);
        tracing::debug!(path = %path.display(), "removed a same-host socket nobody listens on");
    }
    refused
}

/// The send buffer a same-host connection asks for: what TCP's autotuning gives a loopback
/// connection (`tcp_wmem`'s maximum). A unix stream socket's writer may have at most its
/// send buffer in flight (`man 7 unix`), and the default (`wmem_default`, about 208 KiB)
/// makes a 1 MiB message a dozen wake-ups of the reader; the kernel caps the request at
/// `net.core.wmem_max`.
const SNDBUF: usize = 4 << 20;

/// The socket options of a same-host data connection.
pub(crate) fn tune(s: &impl std::os::fd::AsFd) -> io::Result<()> {
    socket2::SockRef::from(s).set_send_buffer_size(SNDBUF)
}

/// Whether `ip` is an address of this network namespace (a wildcard listener of this
/// namespace accepts connections to it).
fn is_own(ip: IpAddr) -> bool {
    ip.is_loopback() || crate::host_addrs::host_addrs().contains(&ip)
}

/// The listen addresses a device reached at `remote` may have published under, most
/// specific first.
fn candidates(remote: SocketAddr) -> Vec<SocketAddr> {
    let remote = canonical(remote);
    let mut out = vec![remote];
    let port = remote.port();
    if !remote.ip().is_unspecified() && is_own(remote.ip()) {
        if remote.is_ipv4() {
            out.push(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), port));
        }
        // A listener bound to `::` accepts both families.
        out.push(SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port));
    }
    out
}

/// Connects to the same-host socket of the device reached at `remote`, if it is on this
/// host, in this network namespace: the stream and the address that device's TCP
/// listener is bound to (which names it, as the address a TCP connection arrives at
/// does); `None`: connect over TCP. A socket nobody listens on any more (its process
/// died) is removed.
pub(crate) async fn connect(remote: SocketAddr) -> Option<(UnixStream, SocketAddr)> {
    let d = dir();
    // A directory someone else could have filled is not looked in.
    crate::control::dir::check(&d).ok()?;
    let ns = netns().ok()?;
    for listen in candidates(remote) {
        let path = d.join(entry_name(ns, listen));
        if !std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_socket()) {
            continue;
        }
        match tokio::time::timeout(CONNECT_TIMEOUT, UnixStream::connect(&path)).await {
            Ok(Ok(s)) => return Some((s, listen)),
            Ok(Err(e)) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
                // Stale (its process died): removed unless a new device replaced it.
                remove_if_stale(&path);
            }
            Ok(Err(e)) => {
                tracing::debug!(path = %path.display(), "cannot connect to a same-host socket: {e}")
            }
            Err(_) => tracing::debug!(path = %path.display(), "connecting to a same-host socket timed out"),
        }
    }
    None
}

/// Why the process that connected on the unix socket may not, if it may not.
fn refuse_cred(s: &UnixStream, peers: Peers) -> Option<String> {
    let uid = s.peer_cred().map(|c| c.uid());
    refusal(uid, rustix::process::geteuid().as_raw(), peers)
}

/// Why a process of effective user `uid` (as `SO_PEERCRED` read it) may not connect to a
/// device of user `me`, if it may not.
fn refusal(uid: io::Result<u32>, me: u32, peers: Peers) -> Option<String> {
    match uid {
        _ if peers == Peers::Any => None,
        Ok(uid) if uid == me => None,
        Ok(uid) => Some(format!(
            "uid {uid} is not this user ({me}; {PEERS_SETTING}=any lets other users in)"
        )),
        Err(e) => Some(format!("cannot read its credentials: {e}")),
    }
}

/// Decrements the count of connections in setup when dropped.
struct InSetup(Arc<AtomicUsize>);

impl Drop for InSetup {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Accepts connections on `listener` forever, running `serve` for each that passes the
/// credentials check, bounded as the module docs say.
pub(crate) async fn accept_loop<F, Fut>(name: String, listener: UnixListener, serve: F)
where
    F: Fn(UnixStream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let peers = peers();
    let in_setup = Arc::new(AtomicUsize::new(0));
    let mut backoff = Duration::from_millis(1);
    loop {
        let s = match listener.accept().await {
            Ok((s, _)) => {
                backoff = Duration::from_millis(1);
                s
            }
            Err(e) => {
                // Out of descriptors, mostly: wait for some to be freed.
                tracing::debug!(device = %name, "same-host accept failed: {e}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(100));
                continue;
            }
        };
        if let Some(why) = refuse_cred(&s, peers) {
            tracing::debug!(device = %name, "refused a same-host connection: {why}");
            continue;
        }
        if in_setup.fetch_add(1, Ordering::AcqRel) >= crate::listener::MAX_UNPROVEN {
            in_setup.fetch_sub(1, Ordering::AcqRel);
            tracing::debug!(device = %name, "refused a same-host connection: too many in setup");
            continue;
        }
        let guard = InSetup(in_setup.clone());
        let fut = serve(s);
        tokio::spawn(async move {
            let _guard = guard;
            fut.await
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transports_parse() {
        assert_eq!("tcp".parse::<Transport>(), Ok(Transport::Tcp));
        assert_eq!("auto".parse::<Transport>(), Ok(Transport::Auto));
        assert!("shm-ish"
            .parse::<Transport>()
            .unwrap_err()
            .contains("auto or tcp"));
    }

    /// Another user is refused unless the setting lets any in; credentials that cannot be
    /// read are a refusal.
    #[test]
    fn only_this_user_unless_any() {
        assert_eq!(refusal(Ok(1000), 1000, Peers::User), None);
        let why = refusal(Ok(1001), 1000, Peers::User).unwrap();
        assert!(why.contains("uid 1001") && why.contains("=any"), "{why}");
        assert_eq!(refusal(Ok(1001), 1000, Peers::Any), None);
        let broken = || Err(io::Error::from_raw_os_error(libc::ENOTCONN));
        assert!(refusal(broken(), 1000, Peers::User).is_some());
    }

    /// The exact address first; a wildcard bind of the port only for this namespace's
    /// own addresses; IPv4 in one spelling.
    #[test]
    fn lookup_is_exact() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        let lo = a("127.0.0.1:5000");
        assert_eq!(candidates(lo), [lo, a("0.0.0.0:5000"), a("[::]:5000")]);
        assert_eq!(candidates(a("[::ffff:127.0.0.1]:5000")), candidates(lo));
        // An address of no interface here (TEST-NET-3): another host's.
        let far = a("203.0.113.7:5000");
        assert_eq!(candidates(far), [far]);
        assert_eq!(entry_name((1, 2), lo), "1-2-127.0.0.1-5000.sock");
        assert_eq!(entry_name((1, 2), a("[::]:5000")), "1-2-::-5000.sock");
    }
}
