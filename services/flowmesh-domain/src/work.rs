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
    /// Upstream stage name → its result, for stages that stored no files (their result travels
    /// only inline in `task.completed`): the worker writes it as that stage's `results.json`.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub upstream_results: std::collections::BTreeMap<String, Value>,
}

impl WorkOrder {
    /// The `Nats-Msg-Id` of this order: one per task attempt.
    pub fn msg_id(&self) -> String {
        format!("{}.{}.work", self.task_id, self.attempt)
    }
}
