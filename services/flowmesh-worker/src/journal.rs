//! The worker's journal: which work it accepted and which reports it still owes, on disk.
//!
//! Every change is flushed before the caller goes on (sled buffers writes otherwise), so a
//! `kill -9` at any point leaves a journal that tells the restarted worker what to do: re-run
//! accepted work, re-send finished reports, never run finished work again.

use flowmesh_domain::Event;
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Entry {
    /// The work message arrived and the task started; no result yet.
    Accepted,
    /// The task ended; `event` is its terminal report, `reported` once the stream stored it.
    Finished { event: Box<Event>, reported: bool },
}

#[derive(Clone)]
pub struct Journal {
    db: sled::Db,
}

fn key(task_id: &str, attempt: u32) -> String {
    format!("{task_id}#{attempt}")
}

impl Journal {
    pub fn open(dir: &Path) -> Result<Journal, sled::Error> {
        Ok(Journal { db: sled::open(dir)? })
    }

    pub fn get(&self, task_id: &str, attempt: u32) -> Option<Entry> {
        let bytes = self.db.get(key(task_id, attempt)).ok()??;
        serde_json::from_slice(&bytes).ok()
    }

    fn put(&self, task_id: &str, attempt: u32, entry: &Entry) -> Result<(), sled::Error> {
        self.db.insert(key(task_id, attempt), serde_json::to_vec(entry).expect("entries serialize"))?;
        self.db.flush()?;
        Ok(())
    }

    pub fn accept(&self, task_id: &str, attempt: u32) -> Result<(), sled::Error> {
        self.put(task_id, attempt, &Entry::Accepted)
    }

    pub fn finish(&self, task_id: &str, attempt: u32, event: &Event) -> Result<(), sled::Error> {
        self.put(task_id, attempt, &Entry::Finished { event: Box::new(event.clone()), reported: false })
    }

    pub fn reported(&self, task_id: &str, attempt: u32, event: &Event) -> Result<(), sled::Error> {
        self.put(task_id, attempt, &Entry::Finished { event: Box::new(event.clone()), reported: true })
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
