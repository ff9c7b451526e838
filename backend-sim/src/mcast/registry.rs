//! Which devices have QPs attached to a multicast group: the sim's fabric's view of a
//! group, which an InfiniBand subnet manager (its multicast forwarding tables) or a
//! RoCE network (the hosts' IP-level joins) keeps for a real one. A sender hands a
//! group's datagram to each device it names, once; each such device hands it to its own
//! attached QPs ([`Groups`](super::Groups)), so whatever this view says, a QP receives
//! only for groups it was attached to on its own device.
//!
//! The view is one directory per user and host, beside the control sockets
//! ([`control::directory`](crate::control::directory), checked to be the user's alone):
//! `mcast/<MGID in hex>/<pid>@<address>` says that the device listening at `address`, of
//! process `pid`, has members of the group. A device adds its entry when its first QP
//! joins the group and removes it when its last leaves (and when it closes). Every
//! change bumps a counter in `mcast/generation`, a word every process maps, so that a
//! sender reads a group's directory again only after a change anywhere on the host, and
//! otherwise keeps what it read (a load of that word per datagram). Entries of processes
//! that are gone (a killed program) are removed by the next reader. With the control
//! directory turned off (`RDMA_SIM_CONTROL=off`), or unusable, the view is this
//! process's own: multicast then reaches the devices of this process alone.
//!
//! Bounds: a sender keeps the members of at most [`CACHED_GROUPS`] groups, and hands a
//! datagram to at most [`MAX_DEVICES`] devices.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use verbs_api::Gid;

/// Groups whose members a process keeps at most (more are forgotten, and read again when
/// next sent to).
pub const CACHED_GROUPS: usize = 1024;
/// Devices one datagram is handed to at most (the most links a device holds,
/// [`link_bound`](crate::datagram::table::link_bound)'s ceiling).
pub const MAX_DEVICES: usize = 1024;

/// The devices with members of a group, as a sender last read them.
pub type Members = Arc<[SocketAddr]>;

/// The host's multicast view (see the module docs).
pub struct Registry {
    /// `<control directory>/mcast`, or `None`: this process's own view.
    dir: Option<PathBuf>,
    /// The host-wide count of changes (mapped from `mcast/generation`).
    generation: Option<Generation>,
    /// What this process last read, by group, with the count it was read at.
    cache: Mutex<HashMap<Gid, (u64, Members)>>,
    /// Without a directory: the groups of this process's devices.
    local: Mutex<HashMap<Gid, Vec<SocketAddr>>>,
}

/// The registry of this process (its devices share it).
pub fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(Registry::open)
}

impl Registry {
    fn open() -> Registry {
        let dir = crate::control::directory().and_then(|ctl| match prepare(&ctl) {
            Ok(d) => Some(d),
            Err(e) => {
                tracing::warn!(
                    dir = %ctl.display(),
                    "multicast reaches this process's devices only: the host's view of groups is not usable: {e}"
                );
                None
            }
        });
        let generation = dir.as_deref().and_then(|d| match Generation::map(&d.join("generation")) {
            Ok(g) => Some(g),
            Err(e) => {
                tracing::warn!(dir = %d.display(), "multicast: cannot map the count of changes ({e}); every send reads its group's members");
                None
            }
        });
        Registry {
            dir,
            generation,
            cache: Mutex::default(),
            local: Mutex::default(),
        }
    }

    /// The device at `addr` has members of `gid` now.
    pub fn join(&self, gid: &Gid, addr: SocketAddr) {
        match &self.dir {
            None => self.local.lock().entry(*gid).or_default().push(addr),
            Some(d) => {
                let group = d.join(hex(gid));
                let entry = group.join(entry_name(std::process::id(), addr));
                // The group's directory may vanish between making it and the entry (its
                // last member elsewhere removes it): once more then.
                let made = (0..2).any(|_| {
                    let _ = std::fs::DirBuilder::new().mode(0o700).create(&group);
                    std::fs::OpenOptions::new()
                        .write(true)
                        .create(true)
                        .truncate(true)
                        .mode(0o600)
                        .open(&entry)
                        .is_ok()
                });
                if !made {
                    tracing::warn!(entry = %entry.display(), "multicast: cannot record a group's member; other processes will not send it the group's datagrams");
                }
            }
        }
        self.changed();
    }

    /// The device at `addr` has no members of `gid` any more.
    pub fn leave(&self, gid: &Gid, addr: SocketAddr) {
        match &self.dir {
            None => {
                let mut l = self.local.lock();
                if let Some(v) = l.get_mut(gid) {
                    if let Some(i) = v.iter().position(|a| *a == addr) {
                        v.swap_remove(i);
                    }
                    if v.is_empty() {
                        l.remove(gid);
                    }
                }
            }
            Some(d) => {
                let group = d.join(hex(gid));
                let _ = std::fs::remove_file(group.join(entry_name(std::process::id(), addr)));
                // Fails while other members remain, as it should.
                let _ = std::fs::remove_dir(&group);
            }
        }
        self.changed();
    }

    /// The devices with members of `gid` (this one's among them if it has some).
    pub fn members(&self, gid: &Gid) -> Members {
        let Some(d) = &self.dir else {
            return self
                .local
                .lock()
                .get(gid)
                .map_or_else(|| Arc::from([]), |v| Arc::from(&v[..]));
        };
        let Some(generation) = &self.generation else {
            return read_group(&d.join(hex(gid)));
        };
        let now = generation.load();
        if let Some((at, m)) = self.cache.lock().get(gid) {
            if *at == now {
                return m.clone();
            }
        }
        let m = read_group(&d.join(hex(gid)));
        let mut c = self.cache.lock();
        if c.len() >= CACHED_GROUPS {
            c.clear();
        }
        c.insert(*gid, (now, m.clone()));
        m
    }

    fn changed(&self) {
        if let Some(g) = &self.generation {
            g.bump();
        }
    }
}

/// `<ctl>/mcast`, made private (the control directory is checked to be the user's alone).
fn prepare(ctl: &Path) -> io::Result<PathBuf> {
    crate::control::ensure_directory(ctl)?;
    let d = ctl.join("mcast");
    match std::fs::DirBuilder::new().mode(0o700).create(&d) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    crate::control::ensure_directory(&d)?;
    Ok(d)
}

/// A group's directory name: its MGID in hex.
fn hex(gid: &Gid) -> String {
    gid.0.iter().map(|b| format!("{b:02x}")).collect()
}

fn entry_name(pid: u32, addr: SocketAddr) -> String {
    format!("{pid}@{addr}")
}

/// The members a group's directory names, without those of processes that are gone
/// (whose entries it removes).
fn read_group(group: &Path) -> Members {
    let Ok(entries) = std::fs::read_dir(group) else {
        return Arc::from([]);
    };
    let mut v = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some((pid, addr)) = name.to_str().and_then(|n| n.split_once('@')) else {
            continue;
        };
        let (Ok(pid), Ok(addr)) = (pid.parse::<u32>(), addr.parse::<SocketAddr>()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_file(e.path());
            continue;
        }
        if v.len() == MAX_DEVICES {
            tracing::warn!(group = %group.display(), "multicast: more than {MAX_DEVICES} devices have members of a group; the others are not sent to");
            break;
        }
        if !v.contains(&addr) {
            v.push(addr);
        }
    }
    Arc::from(v)
}

/// A count of changes shared by every process of the user on the host: a word of a file
/// mapped by each.
struct Generation {
    word: *const AtomicU64,
}

// SAFETY: the mapping is never unmapped (the registry lives as long as the process), and
// the word is only accessed atomically.
unsafe impl Send for Generation {}
// SAFETY: as above.
unsafe impl Sync for Generation {}

impl Generation {
    fn map(path: &Path) -> io::Result<Generation> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)?;
        let len = std::mem::size_of::<AtomicU64>();
        if f.metadata()?.len() < len as u64 {
            // Two processes doing this at once both set the same length: zeros.
            f.set_len(len as u64)?;
        }
        // SAFETY: a shared mapping of `len` bytes of an open file of at least that length;
        // the kernel chooses the address. The descriptor may close afterwards: the
        // mapping keeps the file.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Generation {
            word: p.cast::<AtomicU64>(),
        })
    }

    fn word(&self) -> &AtomicU64 {
        // SAFETY: `word` points to the start of a live shared mapping (page-aligned, so
        // aligned for a u64) that is never unmapped; every process accesses it atomically.
        unsafe { &*self.word }
    }

    fn load(&self) -> u64 {
        self.word().load(Ordering::Acquire)
    }

    fn bump(&self) {
        self.word().fetch_add(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_names_its_live_members_once() {
        let d = std::env::temp_dir().join(format!("rdma-sim-mcast-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let a: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let b: SocketAddr = "[::1]:6000".parse().unwrap();
        let me = std::process::id();
        for name in [
            entry_name(me, a),
            entry_name(me, b),
            entry_name(me, a),
            "junk".into(),
        ] {
            std::fs::write(d.join(name), b"").unwrap();
        }
        // A process that is gone (no process has pid 0x7fffffff): removed.
        let stale = d.join(entry_name(0x7fff_ffff, "127.0.0.1:7000".parse().unwrap()));
        std::fs::write(&stale, b"").unwrap();
        let mut m = read_group(&d).to_vec();
        m.sort();
        assert_eq!(m, vec![a, b]);
        assert!(!stale.exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_count_of_changes_is_shared_by_every_mapping() {
        let p = std::env::temp_dir().join(format!("rdma-sim-mcast-gen-{}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        let (a, b) = (Generation::map(&p).unwrap(), Generation::map(&p).unwrap());
        assert_eq!(a.load(), 0);
        a.bump();
        b.bump();
        assert_eq!((a.load(), b.load()), (2, 2));
        std::fs::remove_file(&p).unwrap();
    }
}
