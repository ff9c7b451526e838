//! What a device's control endpoint says ([`DeviceStatus`], [`QpStatus`]), the requests
//! a client may send it ([`PORT_DOWN`], [`PORT_UP`], [`PORT_ADDR`]), and the client that
//! collects it from every live device of this user ([`list`]). The endpoint's side
//! (`serve`) speaks this format; this module does not name it.

use std::io::{self, BufRead};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How long the client waits for one device's answer.
const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// One open sim device, as its control endpoint describes it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceStatus {
    /// The process that holds the device.
    pub pid: u32,
    /// That process's name (`/proc/<pid>/comm`).
    pub program: String,
    /// The device's name (`sim0`, ...).
    pub device: String,
    /// The kind of HCA it plays (`portable`, `rxe`, `mlx5`).
    pub profile: String,
    /// Its node GUID.
    pub node_guid: u64,
    /// Its port's link layer (`InfiniBand` or `Ethernet`).
    pub link_layer: String,
    /// Its port's LID (its TCP port; 0 on an Ethernet port).
    pub lid: u16,
    /// Where it listens.
    pub listen: String,
    /// Its GID table (the first two entries, and a wildcard listen's other addresses).
    pub gids: Vec<String>,
    /// Registered memory regions.
    pub mrs: usize,
    /// Its port's state: `ACTIVE`, or `DOWN` (a port fault).
    #[serde(default)]
    pub port: String,
    /// Its counters, by name.
    pub counters: std::collections::BTreeMap<String, u64>,
    /// Its QPs, by number.
    pub qps: Vec<QpStatus>,
}

/// One QP of a device.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct QpStatus {
    /// Its number.
    pub qpn: u32,
    /// `RC`, `UC` or `UD`.
    pub qp_type: String,
    /// `RESET`, `INIT`, `RTR`, `RTS`, `SQD`, `SQE` or `ERR`.
    pub state: String,
    /// The destination QP (connected QPs from RTR on).
    pub dest_qpn: Option<u32>,
    /// Where the peer's device is reached (connected QPs from RTR on).
    pub peer: Option<String>,
    /// Whether a connection to the peer is up.
    pub connected: bool,
    /// The next PSN its send queue sends.
    pub sq_psn: u32,
    /// The PSN its receive side expects next.
    pub rq_psn: u32,
    /// Send WRs posted and not yet completed.
    pub sq_outstanding: usize,
    /// Receives posted to its own receive queue (0 with an SRQ).
    pub rq_posted: usize,
    /// Whether it takes its receives from an SRQ.
    pub srq: bool,
}

/// What one socket in the control directory gave.
#[derive(Debug)]
pub struct Found {
    /// The socket.
    pub path: PathBuf,
    /// Its device's status, or why it could not be read.
    pub status: Result<DeviceStatus, String>,
}

/// Reads every live device's status from the control directory (`dir`, or the one this
/// process's settings name). Sockets left by processes that are gone are removed. An
/// empty list when the directory does not exist.
pub fn list(dir: Option<&Path>) -> io::Result<Vec<Found>> {
    let dir = match dir {
        Some(d) => d.to_path_buf(),
        None => super::dir::resolve().ok_or_else(|| {
            io::Error::other(format!(
                "the control endpoints are off ({}=off)",
                super::dir::SETTING
            ))
        })?,
    };
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    super::dir::check(&dir)?;
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|x| x != "sock") {
            continue;
        }
        match read_one(&path) {
            Ok(status) => found.push(Found {
                path,
                status: Ok(status),
            }),
            Err(e) => {
                if owner_gone(&path) {
                    let _ = std::fs::remove_file(&path);
                } else {
                    found.push(Found {
                        path,
                        status: Err(e.to_string()),
                    });
                }
            }
        }
    }
    found.sort_by_key(|f| match &f.status {
        Ok(s) => (s.pid, s.device.clone()),
        Err(_) => (u32::MAX, String::new()),
    });
    Ok(found)
}

fn read_one(path: &Path) -> io::Result<DeviceStatus> {
    ask(path, "")
}

/// Sends `request` (one line, or none) to the device at `path` and reads its status.
fn ask(path: &Path, request: &str) -> io::Result<DeviceStatus> {
    use std::io::Write;
    let mut s = std::os::unix::net::UnixStream::connect(path)?;
    s.set_read_timeout(Some(READ_TIMEOUT))?;
    s.write_all(request.as_bytes())?;
    // The end of the request: the device answers then.
    s.shutdown(std::net::Shutdown::Write)?;
    let mut line = String::new();
    io::BufReader::new(s).read_line(&mut line)?;
    if line.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the device refused the request {request:?}"),
        ));
    }
    serde_json::from_str(&line).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// The request (the bytes a client sends before it shuts its side down) that takes the device's port down.
pub const PORT_DOWN: &str = "port down\n";
/// The request that brings it back.
pub const PORT_UP: &str = "port up\n";
/// The request that changes its port's address (a new LID, or a GID added).
pub const PORT_ADDR: &str = "port addr\n";

/// What `rdma-sim port` does to a device's port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortRequest {
    /// Takes it down ([`Faults::port_down`](crate::faults::Faults::port_down)).
    Down,
    /// Brings it back up.
    Up,
    /// Changes its address: an InfiniBand port's LID, or a GID added to a RoCE port
    /// ([`Faults::change_lid`](crate::faults::Faults::change_lid),
    /// [`Faults::add_gid`](crate::faults::Faults::add_gid)).
    Address,
}

/// Does `request` to the port of every live device named `device` (of process `pid`
/// only, if given), as [`Faults`](crate::faults::Faults) does in the device's own
/// process; their statuses afterwards (none: no such device).
pub fn set_port(
    dir: Option<&Path>,
    device: &str,
    pid: Option<u32>,
    request: PortRequest,
) -> io::Result<Vec<Found>> {
    let request = match request {
        PortRequest::Down => PORT_DOWN,
        PortRequest::Up => PORT_UP,
        PortRequest::Address => PORT_ADDR,
    };
    let mut done = Vec::new();
    for f in list(dir)? {
        let Ok(st) = &f.status else { continue };
        if st.device != device || pid.is_some_and(|p| p != st.pid) {
            continue;
        }
        let status = ask(&f.path, request).map_err(|e| e.to_string());
        done.push(Found { path: f.path, status });
    }
    Ok(done)
}

/// Whether the process that made the socket at `path` (`<pid>-...`) is gone.
fn owner_gone(path: &Path) -> bool {
    let pid = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.split('-').next())
        .and_then(|p| p.parse::<u32>().ok());
    match pid {
        Some(pid) => !Path::new(&format!("/proc/{pid}")).exists(),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(pid: u32, device: &str) -> DeviceStatus {
        DeviceStatus {
            pid,
            program: "test".into(),
            device: device.into(),
            profile: "portable".into(),
            node_guid: 1,
            link_layer: "InfiniBand".into(),
            lid: 4000,
            listen: "127.0.0.1:4000".into(),
            gids: vec!["::ffff:127.0.0.1".into()],
            mrs: 2,
            port: "ACTIVE".into(),
            counters: [("uc_dropped".to_string(), 3)].into(),
            qps: vec![QpStatus {
                qpn: 0x1234,
                qp_type: "RC".into(),
                state: "RTS".into(),
                dest_qpn: Some(0x5678),
                peer: Some("127.0.0.1:4001".into()),
                connected: true,
                sq_psn: 7,
                rq_psn: 9,
                sq_outstanding: 1,
                rq_posted: 2,
                srq: false,
            }],
        }
    }

    #[test]
    fn the_client_reads_what_an_endpoint_serves_and_removes_dead_sockets() {
        let dir = std::env::temp_dir().join(format!("rdma-sim-status-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (ep, _src) = {
            // The listener registers with the runtime that serves it.
            let _g = rt.enter();
            super::super::serve::serve_fixed(&dir, "simX", rt.handle(), sample(std::process::id(), "simX"))
                .unwrap()
        };
        // A socket whose process is gone (no process has pid 0x7fffffff).
        let stale = dir.join("2147483647-0-sim0.sock");
        drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
        let worker = std::thread::spawn({
            let dir = dir.clone();
            move || list(Some(&dir)).unwrap()
        });
        let found = rt.block_on(async {
            loop {
                if worker.is_finished() {
                    break worker.join().unwrap();
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].path, ep.path());
        assert_eq!(
            found[0].status.as_ref().unwrap(),
            &sample(std::process::id(), "simX")
        );
        assert!(!stale.exists(), "the dead process's socket is removed");
        drop(ep);
        assert!(
            list(Some(&dir)).unwrap().is_empty(),
            "a closed endpoint's socket is gone"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
