//! The process's sim: the backend configured from the environment (`RDMA_SIM_DEVICES`,
//! `RDMA_SIM_LISTEN`, `RDMA_SIM_ADVERTISE`, ... as for every program on the sim, except
//! that the portability advice is at debug level unless `RDMA_SIM_PORTABILITY_WARNINGS`
//! says `warn`), the devices it lists, and the log. Made by the first verb that needs it
//! and kept for the life of the process, as libibverbs keeps its device list.
//!
//! An opened device is shared by every `ibv_open_device` of it in the process, as one
//! HCA is: contexts of one device see the same port, LID and GID. It closes when the last
//! context and the last object made from it are gone.
//!
//! A child forked from the process opens devices of its own, as a child's
//! `ibv_open_device` on a real HCA gets a new context from the kernel: the device its
//! parent opened lives on the parent's threads (its listener, setup and progress threads),
//! which fork does not copy, and its address is the parent's. The child leaves that device
//! alone: its copy is never used or closed there (closing it would join threads the child
//! does not have and remove the parent's files), and the objects the parent made from it
//! are not usable in the child, as `man ibv_fork_init` says of a real device's.

use std::ffi::c_int;
use std::sync::{Arc, OnceLock, Weak};

use parking_lot::Mutex;
use verbs_api::{Backend, ContextOf};

use crate::abi::{ibv_device, IBV_NODE_CA, IBV_SYSFS_NAME_MAX, IBV_SYSFS_PATH_MAX, IBV_TRANSPORT_IB};
use crate::ffi::{copy_c_str, Errno};

/// The backend behind the C ABI. The rest of the crate reaches the sim through the
/// verbs-api traits, so what the sim learns (SRQs, address handles, UD) reaches C
/// programs without changes here; the one exception is the event reads
/// (`read_cq_event`, `read_async_event`), which are a `read(2)` of the descriptor in the
/// calling thread as in libibverbs, something the traits' waits with a timeout are not.
pub type B = backend_sim::SimBackend;
/// An open device of [`B`].
pub type SimContext = ContextOf<B>;

/// One listed device: the `ibv_device` programs hold, first, so that its address is the
/// device's.
#[repr(C)]
pub struct Device {
    /// What programs see.
    pub c: ibv_device,
    /// Position in the list (`ibv_get_device_index`).
    pub index: u32,
    /// The device name (`sim0`, ...).
    pub name: String,
    /// Node GUID, host order.
    pub guid: u64,
    /// The open device, while any context or object of it lives.
    open: Mutex<Opened>,
}

/// A device opened by one process.
struct Opened {
    /// The device, while any context or object of it lives.
    ctx: Weak<SimContext>,
    /// The process that opened it.
    pid: u32,
}

impl Opened {
    /// The device, if this process opened it and it is open; a device inherited from
    /// the parent this process was forked from is left to it (see the module docs) and
    /// forgotten here.
    fn mine(&mut self) -> Option<Arc<SimContext>> {
        let ctx = self.ctx.upgrade()?;
        let pid = std::process::id();
        if self.pid == pid {
            return Some(ctx);
        }
        // The parent's: never dropped in this process, where its last reference would
        // join the parent's threads and remove the parent's files.
        std::mem::forget(ctx);
        self.ctx = Weak::new();
        self.pid = pid;
        None
    }
}

impl Device {
    /// The open device, opening it if no context holds it.
    pub fn open(&self, backend: &B) -> Result<Arc<SimContext>, verbs_api::Error> {
        let mut open = self.open.lock();
        if let Some(ctx) = open.mine() {
            return Ok(ctx);
        }
        let ctx = Arc::new(backend.open(&self.name)?);
        *open = Opened {
            ctx: Arc::downgrade(&ctx),
            pid: std::process::id(),
        };
        drop(open);
        // The port's LID and GIDs exist from now on: its sysfs files too (written with
        // the device unlocked: making the tree reads which devices are open).
        crate::vfs::files::opened(self, &ctx);
        Ok(ctx)
    }

    /// The open device, if this process opened it and a context or object holds it.
    pub fn opened(&self) -> Option<Arc<SimContext>> {
        self.open.lock().mine()
    }
}

/// The process's sim.
pub struct Runtime {
    /// The backend, configured from the environment.
    pub backend: B,
    /// The devices it lists (never changed after it is made, so their addresses stay
    /// put).
    pub devices: Vec<Device>,
}

// SAFETY: `Device` holds raw pointers only inside `ibv_device::_ops`, which are NULL and
// never used; everything else is `Send + Sync`.
unsafe impl Send for Runtime {}
// SAFETY: as above; the mutable state is behind a mutex.
unsafe impl Sync for Runtime {}

static RUNTIME: OnceLock<Result<Runtime, Errno>> = OnceLock::new();

/// The process's sim, made on first use; a bad setting in the environment fails every
/// call with EINVAL (and is logged once).
pub fn runtime() -> Result<&'static Runtime, Errno> {
    RUNTIME.get_or_init(init).as_ref().map_err(|e| *e)
}

/// The listed device at `dev`, if `dev` is one.
pub fn device(dev: *const ibv_device) -> Result<&'static Device, Errno> {
    let rt = runtime()?;
    rt.devices
        .iter()
        .find(|d| std::ptr::eq(&d.c, dev))
        .ok_or(libc::EINVAL)
}

fn init() -> Result<Runtime, Errno> {
    init_log();
    // The portable profile's advice goes to the debug log unless the environment asks
    // for warnings: the programs here did not choose the sim, and a destroy with
    // completions nobody will poll (every MPI_Finalize) must not add a line to their
    // output.
    let quiet = backend_sim::SimConfig {
        portability_warnings: backend_sim::profile::warnings::Level::Debug,
        ..Default::default()
    };
    let backend = B::from_env_over(quiet).map_err(|e| {
        tracing::error!(error = %e, "the sim's libibverbs cannot start");
        e.errno()
    })?;
    // The connection manager's devices are the program's own (librdmacm opens the device
    // an id is bound to through this library).
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    backend.set_cm_devices(std::sync::Arc::new(crate::ucma::CabiDevices));
    let listed = backend.devices().map_err(|e| {
        tracing::error!(error = %e, "the sim lists no devices");
        e.errno()
    })?;
    let sysfs = crate::vfs::sysfs_root().to_string_lossy();
    let devices = listed
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            let mut c = ibv_device {
                _ops: [std::ptr::null_mut(); 2],
                node_type: IBV_NODE_CA,
                transport_type: IBV_TRANSPORT_IB,
                name: [0; IBV_SYSFS_NAME_MAX],
                dev_name: [0; IBV_SYSFS_NAME_MAX],
                dev_path: [0; IBV_SYSFS_PATH_MAX],
                ibdev_path: [0; IBV_SYSFS_PATH_MAX],
            };
            // As libibverbs names a device's directories: under its sysfs path
            // (`ibv_get_sysfs_path()`), which the library answers for (`vfs`).
            let uverbs = crate::vfs::files::uverbs_name(i as u32);
            copy_c_str(&mut c.name, &d.name);
            copy_c_str(&mut c.dev_name, &uverbs);
            copy_c_str(
                &mut c.dev_path,
                &format!("{sysfs}/class/infiniband_verbs/{uverbs}"),
            );
            copy_c_str(&mut c.ibdev_path, &format!("{sysfs}/class/infiniband/{}", d.name));
            Device {
                c,
                index: i as u32,
                name: d.name,
                guid: d.guid,
                open: Mutex::new(Opened {
                    ctx: Weak::new(),
                    pid: std::process::id(),
                }),
            }
        })
        .collect();
    // SAFETY: `forget_parents_devices` is an `extern "C" fn()` that lives for the
    // process; it runs in the child only.
    unsafe { libc::pthread_atfork(None, None, Some(forget_parents_devices)) };
    Ok(Runtime { backend, devices })
}

/// `pthread_atfork`'s child handler: the child forgets the devices its parent had open
/// (see the module docs), before any of its code can close the parent's contexts it
/// inherited. Only the forking thread exists here, and a lock another of the parent's
/// threads held stays held, so a device whose lock is taken is left to its next open.
extern "C" fn forget_parents_devices() {
    if let Some(Ok(rt)) = RUNTIME.get() {
        for d in &rt.devices {
            if let Some(mut open) = d.open.try_lock() {
                open.mine();
            }
        }
    }
}

/// The sim's warnings go to stderr (a program that exits with "Couldn't modify QP" then
/// shows why); `RUST_LOG` chooses more, e.g. `RUST_LOG=backend_sim=debug`.
fn init_log() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

/// Number of completion vectors each context reports.
pub const NUM_COMP_VECTORS: c_int = 1;
