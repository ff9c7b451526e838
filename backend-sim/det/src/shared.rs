//! The handle every verbs object holds on its world: the world behind a lock, the thread
//! it belongs to, its link to a tokio runtime ([`crate::clock`]) and its rendezvous
//! listeners. Every verb enters the world through it: from another thread, or from
//! another tokio runtime than the one the world is bound to, it is refused (the world is
//! single-threaded, and a second runtime's clock is not the world's).

use std::sync::Arc;
use std::thread::ThreadId;
use std::time::Duration;

use backend_sim_proto::fabric::FaultMix;
use backend_sim_proto::switches::Switches;
use parking_lot::{Mutex, MutexGuard};
use verbs_api::Result;

use crate::clock::Runtime;
use crate::listeners::Listeners;
use crate::refuse::refused;
use crate::world::World;

/// The world and the thread it belongs to.
pub(crate) struct Shared {
    world: Mutex<World>,
    owner: ThreadId,
    /// The tokio runtime the world may be attached to.
    pub(crate) rt: Runtime,
    /// The in-memory rendezvous' listeners.
    pub(crate) listeners: Mutex<Listeners>,
}

impl Shared {
    /// A world of devices `hosts` under `seed`, its QPs behaving as `sw` says, its waits
    /// bounded by `budget` (see [`crate::budget`]), owned by the calling thread.
    pub(crate) fn new(
        seed: u64,
        mix: FaultMix,
        hosts: Vec<String>,
        sw: Switches,
        budget: Duration,
    ) -> Arc<Shared> {
        Arc::new(Shared {
            world: Mutex::new(World::new(seed, mix, hosts, sw, budget)),
            owner: std::thread::current().id(),
            rt: Runtime::default(),
            listeners: Mutex::default(),
        })
    }

    /// The world, for verb `call` of the owning thread; another thread is refused, and
    /// so is another tokio runtime than the one the world is bound to.
    pub(crate) fn enter(&self, call: &'static str) -> Result<MutexGuard<'_, World>> {
        if std::thread::current().id() != self.owner {
            return Err(refused(format!(
                "{call} from another thread: a deterministic world is single-threaded (a \
                 second thread's timing is not the seed's to decide); run the client and \
                 the server in the thread that built it, interleaving their steps"
            )));
        }
        self.rt.check_runtime(call)?;
        // Only the owner enters, one verb at a time: a world that is locked now is
        // being entered again from within a verb, which must not wait for itself.
        let mut w = self
            .world
            .try_lock()
            .ok_or_else(|| refused(format!("{call} within another verb of the same world")))?;
        self.rt.on_enter(call, &mut w);
        Ok(w)
    }

    /// Refuses verb `call` from another thread, for verbs that need nothing of the world.
    pub(crate) fn check(&self, call: &'static str) -> Result<()> {
        self.enter(call).map(drop)
    }

    /// The world from any thread, for what cannot fail (a drop, the trace).
    pub(crate) fn lock_any(&self) -> MutexGuard<'_, World> {
        self.world.lock()
    }
}
