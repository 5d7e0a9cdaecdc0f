//! A `sled` checkpoint of the router's fold, so a restart replays only the events after it.
//! The event log stays the source of truth: a checkpoint that cannot be read, or that is ahead of
//! the stream (the stream was recreated), is ignored and the whole log is replayed.

use flowmesh_domain::state::State;
use std::path::Path;
use tracing::{info, warn};

const KEY: &str = "fold";

pub struct Checkpoint {
    db: sled::Db,
    /// The stream sequence of the last checkpoint written.
    written_seq: u64,
}

impl Checkpoint {
    pub fn open(dir: &Path) -> anyhow::Result<Checkpoint> {
        Ok(Checkpoint { db: sled::open(dir)?, written_seq: 0 })
    }

    /// The saved fold, if it is usable against a stream whose last sequence is `stream_last`.
    pub fn load(&mut self, stream_last: u64) -> Option<State> {
        let bytes = self.db.get(KEY).ok()??;
        match serde_json::from_slice::<State>(&bytes) {
            Ok(state) if state.last_seq <= stream_last => {
                info!(seq = state.last_seq, "resuming from the router checkpoint");
                self.written_seq = state.last_seq;
                Some(state)
            }
            Ok(state) => {
                warn!(
                    checkpoint = state.last_seq,
                    stream = stream_last,
                    "the checkpoint is ahead of the event stream; replaying all"
                );
                None
            }
            Err(e) => {
                warn!(error = %e, "the router checkpoint is unreadable; replaying all");
                None
            }
        }
    }

    /// Whether `state` has moved on since the last save.
    pub fn is_behind(&self, state: &State) -> bool {
        state.last_seq != self.written_seq
    }

    /// Saves `state` when it has moved on since the last save (flushed: sled buffers writes).
    pub fn save(&mut self, state: &State) {
        if !self.is_behind(state) {
            return;
        }
        let began = std::time::Instant::now();
        let bytes = serde_json::to_vec(state).expect("the fold serializes");
        let (size, serialized) = (bytes.len(), began.elapsed());
        match self.db.insert(KEY, bytes).and_then(|_| self.db.flush()) {
            Ok(_) => {
                self.written_seq = state.last_seq;
                tracing::debug!(bytes = size, ?serialized, total = ?began.elapsed(), "router checkpoint written");
            }
            Err(e) => warn!(error = %e, "could not write the router checkpoint"),
        }
    }
}
