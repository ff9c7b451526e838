//! Clients' connection requests on tokio ([`AsyncCmListener::request`]): a task accepts
//! on the listener ([`admission::accept_loop`], bounded by [`SETUP_BOUND`], clients
//! speaking first), each connection's request is read on a task of its own within the
//! request timeout, and the requests that arrive wait (at most [`QUEUED`]) for
//! [`AsyncCmListener::request`] to take them.
//!
//! [`AsyncCmListener::request`]: super::AsyncCmListener::request

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use super::request::{AsyncConnectRequest, Incoming};
use super::requests::{SETUP_BOUND, WARNINGS};
use crate::admission::{self, held_back_note, Spoke, WarnBudget};
use crate::error::Error;

/// Requests read and waiting to be taken.
const QUEUED: usize = 16;

/// The accepting task of a listener and the requests it read.
#[derive(Debug)]
pub(super) struct Requests {
    pub(super) arrived: mpsc::Receiver<AsyncConnectRequest>,
    task: AbortHandle,
}

impl Drop for Requests {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What becomes of clients while descriptors run out.
fn fd_hint() -> String {
    "clients wait in the listen backlog until descriptors are freed".to_string()
}

/// Starts accepting on `listener` (on the current runtime), each client given
/// `timeout` to send its whole request.
pub(super) fn start(listener: Arc<TcpListener>, timeout: Duration) -> Requests {
    let name = listener
        .local_addr()
        .map_or_else(|_| "cm listener".to_string(), |a| format!("cm listener on {a}"));
    let (tx, arrived) = mpsc::channel(QUEUED);
    let warn = Arc::new(Mutex::new(WarnBudget::new(WARNINGS.0, WARNINGS.1)));
    let serve = move |stream: TcpStream, peer: SocketAddr, spoke: Spoke| {
        let (tx, warn) = (tx.clone(), warn.clone());
        async move {
            let read = async {
                // (Not `readable()`, which a fresh socket passes before any byte came.)
                if stream
                    .peek(&mut [0u8; 1])
                    .await
                    .map_err(|e| Error::from_io("read", e))?
                    > 0
                {
                    spoke.mark();
                }
                Incoming { stream, peer }.read_request().await
            };
            let e = match tokio::time::timeout(timeout, read).await {
                Ok(Ok(request)) => {
                    // Waits, in setup, while QUEUED requests wait to be taken.
                    let _ = tx.send(request).await;
                    return;
                }
                Ok(Err(e)) => e,
                Err(_) => Error::timeout(timeout, "the client sent no connection request"),
            };
            if let Some(n) = warn.lock().unwrap_or_else(|e| e.into_inner()).take() {
                tracing::warn!("dropped the client at {peer}: {e}{}", held_back_note(n));
            }
        }
    };
    let task = tokio::spawn(admission::accept_loop(
        name,
        listener,
        SETUP_BOUND,
        true,
        fd_hint,
        serve,
    ));
    Requests {
        arrived,
        task: task.abort_handle(),
    }
}
