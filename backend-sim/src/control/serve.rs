//! A device's side: its socket in the control directory and the task (on the device's
//! setup runtime) that answers every connection with one snapshot and closes it.
//!
//! A client may first send one request, ended by shutting its side down: nothing (the
//! snapshot alone), [`PORT_DOWN`], [`PORT_UP`] or [`PORT_ADDR`] (the port faults of
//! `rdma-sim port`, done before the snapshot is taken). Anything else is refused: the connection closes
//! unanswered. Connections are answered one at a time, the request read and the answer
//! written each bounded by [`WRITE_TIMEOUT`] and the request by [`REQUEST_MAX`] bytes, so
//! a client that connects and never reads or never ends its request, or a flood of
//! connections, holds one socket and one snapshot at most.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
#[cfg(test)]
use std::sync::Arc;
use std::sync::Weak;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixListener;

use super::status::{DeviceStatus, PORT_ADDR, PORT_DOWN, PORT_UP};

/// How long one client may take to send its request, and to read a snapshot.
const WRITE_TIMEOUT: Duration = Duration::from_secs(1);
/// The longest request read.
const REQUEST_MAX: u64 = 64;

/// What a device shows of itself, and the fault a client may ask of it.
pub trait Source: Send + Sync {
    /// Its state now.
    fn status(&self) -> DeviceStatus;
    /// Takes its port down (`up` false) or brings it back.
    fn set_port(&self, up: bool);
    /// Changes its port's address as its link layer's changes.
    fn change_address(&self);
}

/// A device's control socket; dropping it removes the file.
pub struct Endpoint {
    path: PathBuf,
}

impl Endpoint {
    /// Where it listens.
    #[cfg(test)]
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Devices opened by this process so far: keeps the socket names of two devices of the
/// same name (two backends in one process) apart.
static OPENED: AtomicU32 = AtomicU32::new(0);

/// Opens the control socket of the device `name` and serves `src` on `rt`. `None` when
/// the endpoints are off or the directory cannot be used (said once, as a warning).
pub fn open(name: &str, rt: &tokio::runtime::Handle, src: Weak<dyn Source>) -> Option<Endpoint> {
    open_in(&super::dir::resolve()?, name, rt, src)
}

fn open_in(
    dir: &std::path::Path,
    name: &str,
    rt: &tokio::runtime::Handle,
    src: Weak<dyn Source>,
) -> Option<Endpoint> {
    let seq = OPENED.fetch_add(1, Ordering::Relaxed);
    let path = dir.join(format!("{}-{seq}-{name}.sock", std::process::id()));
    match bind(dir, &path, rt) {
        Ok(listener) => {
            rt.spawn(serve(listener, src));
            Some(Endpoint { path })
        }
        Err(e) => {
            warn_once(&path, &e);
            None
        }
    }
}

fn bind(
    dir: &std::path::Path,
    path: &std::path::Path,
    rt: &tokio::runtime::Handle,
) -> io::Result<UnixListener> {
    super::dir::ensure(dir)?;
    // A socket of an earlier process with this pid (the number was reused).
    let _ = std::fs::remove_file(path);
    let std_listener = std::os::unix::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    std_listener.set_nonblocking(true)?;
    let _guard = rt.enter();
    UnixListener::from_std(std_listener)
}

fn warn_once(path: &std::path::Path, e: &io::Error) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| {
        tracing::warn!(
            "the sim's control socket {} cannot be opened ({e}): `rdma-sim status` will not list \
             this process's devices (set {}=off to silence this, or to a directory of your own)",
            path.display(),
            super::dir::SETTING
        );
    });
}

async fn serve(listener: UnixListener, src: Weak<dyn Source>) {
    let me = rustix::process::geteuid().as_raw();
    loop {
        let mut stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(_) => {
                // Out of descriptors, most likely: the device's other work comes first.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if stream.peer_cred().map(|c| c.uid()).ok() != Some(me) {
            continue;
        }
        let mut request = Vec::new();
        let mut limited = (&mut stream).take(REQUEST_MAX);
        let read = limited.read_to_end(&mut request);
        if !matches!(tokio::time::timeout(WRITE_TIMEOUT, read).await, Ok(Ok(_))) {
            continue;
        }
        let Some(dev) = src.upgrade() else { return };
        match std::str::from_utf8(&request) {
            Ok("") => {}
            Ok(PORT_DOWN) => dev.set_port(false),
            Ok(PORT_UP) => dev.set_port(true),
            Ok(PORT_ADDR) => dev.change_address(),
            _ => {
                tracing::debug!(
                    "control: refused the request {:?}",
                    String::from_utf8_lossy(&request)
                );
                continue;
            }
        }
        let status = dev.status();
        drop(dev);
        let Ok(mut line) = serde_json::to_vec(&status) else {
            continue;
        };
        line.push(b'\n');
        let _ = tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(&line)).await;
    }
}

/// Serves a fixed status (for the tests of the client).
#[cfg(test)]
pub(crate) fn serve_fixed(
    dir: &std::path::Path,
    name: &str,
    rt: &tokio::runtime::Handle,
    status: DeviceStatus,
) -> Option<(Endpoint, Arc<dyn Source>)> {
    struct Fixed(DeviceStatus);
    impl Source for Fixed {
        fn status(&self) -> DeviceStatus {
            self.0.clone()
        }
        fn set_port(&self, _up: bool) {}
        fn change_address(&self) {}
    }
    let src: Arc<dyn Source> = Arc::new(Fixed(status));
    let ep = open_in(dir, name, rt, Arc::downgrade(&src))?;
    Some((ep, src))
}
