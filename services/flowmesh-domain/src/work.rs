//! The work order the router sends a worker (inside its `task.dispatched`, or on
//! `flowmesh.work.<worker_id>` when it holds a secret), and the report the worker sends back when
//! the run ends (`report`: an outcome in, the event out).

use crate::EventBody;
use crate::event::{Artifact, FailureReason, TaskCancelled, TaskCompleted, TaskFailed, TaskRef};
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkOrder {
    pub workflow_id: String,
    pub task_id: String,
    pub stage: String,
    pub attempt: u32,
    pub task_type: String,
    /// The merged spec with every placeholder resolved; the task's own (shared, not copied)
    /// where resolution rewrote nothing.
    pub spec: std::sync::Arc<Value>,
    /// Upstream stage name → its task id.
    #[serde(default)]
    pub upstream: std::collections::BTreeMap<String, String>,
    /// Upstream stage name → the files it stored, for `inputs` the worker fetches before running.
    #[serde(default)]
    pub upstream_artifacts: std::collections::BTreeMap<String, Vec<Artifact>>,
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

    /// Whether the order holds a secret placeholder the router must fill: such an order never
    /// goes into the log, it travels on the worker's work subject.
    pub fn needs_secrets(&self) -> bool {
        crate::secret::is_redacted(&self.spec)
    }
}

/// What a worker takes from a message of its work queue: `subject_suffix` is the part below
/// `flowmesh.events.` of a dispatch (its order inside, or `None`: the order holds a secret and
/// comes on the work subject), or `None` for an order from `flowmesh.work.<worker>`. A dispatch
/// is believed only as [`Event::read`](crate::event::Event::read) reads it, and only when it is
/// for `worker_id`.
pub fn take(worker_id: &str, subject_suffix: Option<&str>, payload: &[u8]) -> Result<Option<WorkOrder>, String> {
    let Some(suffix) = subject_suffix else {
        return serde_json::from_slice(payload).map(Some).map_err(|e| format!("not a work order: {e}"));
    };
    let event = crate::event::Event::read(suffix, payload).map_err(|e| format!("unreadable dispatch: {e}"))?;
    match event.body {
        EventBody::TaskDispatched(d) if d.worker_id == worker_id => Ok(d.order.map(|order| *order)),
        EventBody::TaskDispatched(d) => Err(format!("a dispatch for worker {}, not {worker_id}", d.worker_id)),
        other => Err(format!("a {} event, not a dispatch", other.kind())),
    }
}

/// How a task's run ended, as its worker saw it: what `report` turns into the event to publish.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// It produced its result and the worker stored what the task had to store.
    Completed(Completion),
    /// A declared artifact is not in the output folder (the task's fault).
    MissingArtifact(String),
    /// The results or artifacts could not be stored (worth another attempt).
    UploadFailed(String),
    /// Cancelled while running: by a person, or by the worker's own drain when `handed_back`.
    Cancelled { handed_back: bool },
    /// Cancelled by a person while its order waited in the worker's queue for a slot: never run.
    CancelledWaiting,
    /// Given back from the worker's queue, unrun, when the router asked (it could run sooner elsewhere).
    Released,
    /// Killed at its maximum runtime.
    TimedOut { limit_secs: u64 },
    /// The executor failed; `retryable` when it asked for another attempt.
    Failed { message: String, retryable: bool },
}

/// What a completed run stored, for `task.completed`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Completion {
    /// The result, when it travels inline.
    pub result: Option<Value>,
    pub result_object: Option<String>,
    pub artifacts: Vec<Artifact>,
    pub upload_ms: Option<u64>,
    /// For a run that reported no `task.started`: when it started.
    pub started_at: Option<String>,
}

/// The report `worker_id` publishes for `task`'s run that ended with `outcome`.
pub fn report(task: TaskRef, worker_id: &str, outcome: Outcome) -> EventBody {
    let worker = Some(worker_id.to_owned());
    let failed = |reason, message, retryable| {
        EventBody::TaskFailed(TaskFailed { task: task.clone(), worker_id: worker.clone(), reason, message, retryable })
    };
    match outcome {
        Outcome::Completed(c) => EventBody::TaskCompleted(TaskCompleted {
            task: task.clone(),
            worker_id: worker_id.to_owned(),
            result: c.result,
            result_object: c.result_object,
            artifacts: c.artifacts,
            upload_ms: c.upload_ms,
            started_at: c.started_at,
        }),
        Outcome::MissingArtifact(name) => failed(
            FailureReason::MissingArtifact,
            format!("declared artifact {name:?} was not produced in the output folder"),
            false,
        ),
        Outcome::UploadFailed(message) => failed(FailureReason::ResultUploadFailed, message, true),
        // Stopped by a drain, not by a person: a retryable failure, so the router gives the task
        // to another worker (a nak would only bring it back to this worker's own consumer).
        Outcome::Cancelled { handed_back: true } => failed(
            FailureReason::HandedBack,
            format!("worker {worker_id} stopped before the task finished (drain grace over)"),
            true,
        ),
        Outcome::Cancelled { handed_back: false } => EventBody::TaskCancelled(TaskCancelled {
            task: task.clone(),
            worker_id: worker.clone(),
            reason: "cancelled while running".to_owned(),
        }),
        Outcome::CancelledWaiting => EventBody::TaskCancelled(TaskCancelled {
            task: task.clone(),
            worker_id: worker.clone(),
            reason: "cancelled while waiting for a slot, before it ran".to_owned(),
        }),
        // Retryable, and the fold spends no attempt on it: the router places the task again.
        Outcome::Released => failed(
            FailureReason::Released,
            format!("given back unrun from worker {worker_id}'s queue: it could run sooner elsewhere"),
            true,
        ),
        Outcome::TimedOut { limit_secs } => failed(
            FailureReason::MaxRuntimeExceeded,
            format!("killed after the maximum runtime of {limit_secs}s"),
            false,
        ),
        Outcome::Failed { message, retryable } => failed(FailureReason::ExecutorError, message, retryable),
    }
}
