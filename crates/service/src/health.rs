//! Liveness and readiness, as the `/healthz` and `/readyz` endpoints report them.
//!
//! Liveness is the endpoint answering at all: a process whose runtime still serves HTTP is alive.
//! Readiness is the service's own word: it flips its [`Readiness`] once what it needs is up
//! (the consumer once its store is connected and it has subscribed, the recovery worker once its
//! store is connected, a mock once its ledger is open and its listener bound), and back when it
//! starts shutting down, so an orchestrator stops counting on it before it is gone.
//!
//! One process runs one service, so the process has one readiness ([`readiness`]): a library's
//! `run` flips it without a handle being threaded through every signature. Tests that run several
//! services in one process share it, which is harmless: nothing but the endpoint reads it.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether the service is ready to do its work. Cloning shares the flag.
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    ready: Arc<AtomicBool>,
    /// Set for good once the service starts shutting down.
    draining: Arc<AtomicBool>,
}

impl Readiness {
    /// A fresh handle, not ready.
    pub fn new() -> Readiness {
        Readiness::default()
    }

    /// Ready or not; once [`Readiness::drain`] was called, never ready again (a start-up that
    /// completes after the first signal must not say ready while the service drains).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
        // Checked after the store, so a drain before or during it wins.
        if self.draining.load(Ordering::Acquire) {
            self.ready.store(false, Ordering::Release);
        }
    }

    /// Not ready, for the rest of the process: it is shutting down.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::Release);
        self.ready.store(false, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
}

/// The process's readiness: what `/readyz` reports unless a test serves its own handle.
pub fn readiness() -> Readiness {
    static PROCESS: OnceLock<Readiness> = OnceLock::new();
    PROCESS.get_or_init(Readiness::new).clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_the_flag_and_the_process_handle_is_one() {
        let readiness = Readiness::new();
        let clone = readiness.clone();
        assert!(!clone.is_ready());
        readiness.set_ready(true);
        assert!(clone.is_ready());
        let (a, b) = (super::readiness(), super::readiness());
        a.set_ready(true);
        assert!(b.is_ready());
        a.set_ready(false);
        assert!(!b.is_ready());
    }

    #[test]
    fn a_service_draining_is_never_ready_again() {
        let readiness = Readiness::new();
        readiness.set_ready(true);
        readiness.drain();
        assert!(!readiness.is_ready());
        // A start-up that completes after the signal.
        readiness.set_ready(true);
        assert!(!readiness.is_ready());
    }
}
