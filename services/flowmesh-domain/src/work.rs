//! The work order: what the router sends a worker on `flowmesh.work.<worker_id>`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkOrder {
    pub workflow_id: String,
    pub task_id: String,
    pub stage: String,
    pub attempt: u32,
    pub task_type: String,
    /// The merged spec with every placeholder resolved.
    pub spec: Value,
    /// Upstream stage name → its task id.
    #[serde(default)]
    pub upstream: std::collections::BTreeMap<String, String>,
    /// Upstream stage name → the files it stored, for `inputs` the worker fetches before running.
    #[serde(default)]
    pub upstream_artifacts: std::collections::BTreeMap<String, Vec<crate::event::Artifact>>,
}

impl WorkOrder {
    /// The `Nats-Msg-Id` of this order: one per task attempt.
    pub fn msg_id(&self) -> String {
        format!("{}.{}.work", self.task_id, self.attempt)
    }
}
