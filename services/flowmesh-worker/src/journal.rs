//! The worker's journal: which finished tasks' reports it still owes, on disk.
//!
//! A task's end is flushed before its report is sent (sled buffers writes otherwise), so a
//! `kill -9` at any point leaves a journal that tells the restarted worker what to do: re-send
//! finished reports, never run finished work again. Work that is not in the journal is run when
//! its work order comes again (an order is acked only after its report is stored, so an order
//! the worker took but did not finish is redelivered). Taking an order writes nothing: a record
//! of it would lead to the same re-run, and cost a flush before every start. Flushes are group
//! commits: ends written while one flush runs are all made durable by the next one, so many tasks
//! finishing together cost one flush, not one each.

use flowmesh_domain::Event;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// A journal record (older journals also hold records of taken orders, which read as nothing).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Entry {
    /// The task ended; `event` is its terminal report, `reported` once the stream stored it.
    Finished { event: Box<Event>, reported: bool },
}

#[derive(Clone)]
pub struct Journal {
    db: sled::Db,
    commits: std::sync::Arc<Commits>,
}

/// Group commit: how many changes were written, how many are known durable, and one flush at a time.
#[derive(Default)]
struct Commits {
    written: AtomicU64,
    durable: AtomicU64,
    flushing: tokio::sync::Mutex<()>,
}

/// sled's page cache (1 GiB by default, filled as the journal grows). The journal is written
/// once or twice per task and read only for a redelivered order and at start, so a small cache
/// costs nothing measurable and keeps the worker's memory flat over a long run.
const CACHE_BYTES: u64 = 16 << 20;

fn key(task_id: &str, attempt: u32) -> String {
    format!("{task_id}#{attempt}")
}

impl Journal {
    pub fn open(dir: &Path) -> Result<Journal, sled::Error> {
        let db = sled::Config::new().path(dir).cache_capacity(CACHE_BYTES).open()?;
        Ok(Journal { db, commits: Default::default() })
    }

    pub fn get(&self, task_id: &str, attempt: u32) -> Option<Entry> {
        let bytes = self.db.get(key(task_id, attempt)).ok()??;
        serde_json::from_slice(&bytes).ok()
    }

    /// Writes the entry and returns once it is durable.
    async fn put(&self, task_id: &str, attempt: u32, entry: &Entry) -> Result<(), sled::Error> {
        self.db.insert(key(task_id, attempt), serde_json::to_vec(entry).expect("entries serialize"))?;
        let mine = self.commits.written.fetch_add(1, Ordering::SeqCst) + 1;
        if self.commits.flushing.try_lock().is_err() {
            // A crash test's point: this report is written but not durable, behind a flush that
            // is making other changes durable.
            crate::failpoint("mid-group-commit");
        }
        let _flushing = self.commits.flushing.lock().await;
        // A flush that began after this insert has made it durable already.
        if self.commits.durable.load(Ordering::SeqCst) >= mine {
            return Ok(());
        }
        // Everything written up to here is covered by this flush.
        let upto = self.commits.written.load(Ordering::SeqCst);
        self.db.flush_async().await?;
        self.commits.durable.fetch_max(upto, Ordering::SeqCst);
        Ok(())
    }

    pub async fn finish(&self, task_id: &str, attempt: u32, event: &Event) -> Result<(), sled::Error> {
        self.put(task_id, attempt, &Entry::Finished { event: Box::new(event.clone()), reported: false }).await
    }

    /// Notes that the stream stored the report. Not flushed on its own: lost in a crash, the
    /// report is sent again at the next start under the same id, which the stream and the fold
    /// both drop as a duplicate. The next flush (of any task) makes it durable.
    pub fn reported(&self, task_id: &str, attempt: u32, event: &Event) -> Result<(), sled::Error> {
        let entry = Entry::Finished { event: Box::new(event.clone()), reported: true };
        self.db.insert(key(task_id, attempt), serde_json::to_vec(&entry).expect("entries serialize"))?;
        Ok(())
    }

    /// Reports that were written but not yet stored by the stream.
    pub fn unreported(&self) -> Vec<Event> {
        self.db
            .iter()
            .filter_map(Result::ok)
            .filter_map(|(_, v)| serde_json::from_slice::<Entry>(&v).ok())
            .filter_map(|e| match e {
                Entry::Finished { event, reported: false } => Some(*event),
                _ => None,
            })
            .collect()
    }
}
