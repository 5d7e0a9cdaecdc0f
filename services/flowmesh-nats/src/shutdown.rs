//! A shutdown signal every service loop watches; cloning it is cheap.

use tokio::sync::watch;

/// Fired once; every clone of the matching `Shutdown` sees it.
#[derive(Debug)]
pub struct Trigger(watch::Sender<bool>);

#[derive(Debug, Clone)]
pub struct Shutdown(watch::Receiver<bool>);

pub fn channel() -> (Trigger, Shutdown) {
    let (tx, rx) = watch::channel(false);
    (Trigger(tx), Shutdown(rx))
}

impl Trigger {
    pub fn fire(&self) {
        let _ = self.0.send(true);
    }

    /// A receiver for a service started after the trigger was made.
    pub fn subscribe(&self) -> Shutdown {
        Shutdown(self.0.subscribe())
    }
}

impl Shutdown {
    /// A signal that never fires: for callers with no shutdown of their own (a command-line
    /// call ends with its process).
    pub fn never() -> Shutdown {
        static NEVER: std::sync::OnceLock<watch::Sender<bool>> = std::sync::OnceLock::new();
        Shutdown(NEVER.get_or_init(|| watch::channel(false).0).subscribe())
    }

    pub fn is_set(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once the trigger fires (or is dropped).
    pub async fn wait(&mut self) {
        let _ = self.0.wait_for(|fired| *fired).await;
    }
}
