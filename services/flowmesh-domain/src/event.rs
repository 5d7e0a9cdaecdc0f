//! Events: the closed set of facts on `FLOWMESH_EVENTS`, with their ids and subjects.
//!
//! Every event id is derived from what caused it and doubles as the `Nats-Msg-Id`, so a writer
//! that retries after a crash re-publishes the same id and the stream keeps one copy.

use crate::placement::Explanation;
use crate::problem::Problem;
use crate::workflow::Workflow;
use serde::{Deserialize, Serialize};
use serde_json::Value;

mod one_pass;

/// One event: its id, its time (RFC 3339, supplied by the writer) and what happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub id: String,
    pub time: String,
    #[serde(flatten)]
    pub body: EventBody,
}

/// Where a submission verdict came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubmissionRef {
    pub stream: String,
    pub seq: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub msg_id: Option<String>,
    /// The validator instance that decided (the first one, when a redelivery decided again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validated_by: Option<String>,
}

/// The task an event is about; `attempt` counts from 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRef {
    pub workflow_id: String,
    pub task_id: String,
    pub stage: String,
    pub attempt: u32,
}

/// A file a task produced, stored in `flowmesh_artifacts` as `<task_id>/<name>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Artifact {
    pub name: String,
    pub object: String,
    pub size: u64,
    /// `SHA-256=<base64url>` as the object store records it. Readers check the bytes they fetch
    /// against this digest, the one the producing worker reported, not the store's own record.
    pub digest: String,
    /// The object store that holds it: the producing worker's own (`flowmesh_artifacts_<worker>`,
    /// which only that worker may write), or `None` for the shared `flowmesh_artifacts`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubmissionAccepted {
    pub workflow_id: String,
    pub submission: SubmissionRef,
    pub task_ids: Vec<String>,
    pub workflow: Workflow,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubmissionRejected {
    pub workflow_id: String,
    pub submission: SubmissionRef,
    pub errors: Vec<Problem>,
}

/// Declares the events about one task: each carries its `TaskRef` flattened (`workflow_id`,
/// `task_id`, `stage`, `attempt` beside its own fields). Serialising flattens as serde does;
/// reading goes through a plain struct with the four fields inline, because serde's `flatten`
/// buffers the whole body (a dispatch's work order included) in an intermediate tree first.
macro_rules! task_events {
    ($($(#[$meta:meta])* pub struct $name:ident { $($(#[$field_meta:meta])* pub $field:ident: $ty:ty,)* })*) => {$(
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Serialize)]
        pub struct $name {
            #[serde(flatten)]
            pub task: TaskRef,
            $($(#[$field_meta])* pub $field: $ty,)*
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<$name, D::Error> {
                #[derive(Deserialize)]
                struct Wire {
                    workflow_id: String,
                    task_id: String,
                    stage: String,
                    attempt: u32,
                    $($(#[$field_meta])* $field: $ty,)*
                }
                let wire = Wire::deserialize(deserializer)?;
                let task = TaskRef {
                    workflow_id: wire.workflow_id,
                    task_id: wire.task_id,
                    stage: wire.stage,
                    attempt: wire.attempt,
                };
                Ok($name { task, $($field: wire.$field,)* })
            }
        }
    )*};
}

task_events! {
    pub struct TaskPending {
        /// `busy` (capable workers exist) or `no_eligible_worker` (none could run it now).
        pub reason: String,
        pub message: String,
        pub explanation: Explanation,
        /// When the task first found no capable worker (unix ms); the grace period counts from here.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub unplaceable_since_ms: Option<u64>,
    }

    pub struct TaskDispatched {
        pub worker_id: String,
        pub task_type: String,
        pub message: String,
        /// The work order itself, for a task with no secret: the worker consumes this event from
        /// its dispatch subject, and no separate order is stored. `None` when the order travels on
        /// the worker's `FLOWMESH_WORK` subject (it holds a secret, which the log never does), and
        /// in dispatches stored before orders travelled in the log.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub order: Option<Box<crate::work::WorkOrder>>,
    }

    /// The router coalesced an identical inference request into one already queued or running:
    /// this task waits for `into`'s execution and gets its result as its own.
    pub struct TaskMerged {
        /// The task whose execution this one shares.
        pub into: String,
        pub message: String,
    }

    pub struct TaskStarted {
        pub worker_id: String,
    }

    pub struct TaskUpdated {
        pub worker_id: String,
        pub message: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub data: Option<Value>,
    }

    pub struct TaskCompleted {
        pub worker_id: String,
        /// The result itself when small (64 KiB or less); otherwise `None` and `result_object` names it.
        #[serde(default)]
        pub result: Option<Value>,
        /// The stored `results.json`; `None` when the task stored no files at all (an echo): its
        /// result travels only inline, in `result`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub result_object: Option<String>,
        pub artifacts: Vec<Artifact>,
        /// How long storing logs, results and artifacts took at the end of the run (`flowmesh trace`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub upload_ms: Option<u64>,
        /// When the task started, for a task that completed before its `task.started` was due (the
        /// worker reports a start only for tasks still running after `START_REPORT_DELAY`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub started_at: Option<String>,
    }

    pub struct TaskFailed {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub worker_id: Option<String>,
        pub reason: FailureReason,
        pub message: String,
        pub retryable: bool,
    }

    /// The task goes back to the queue; `task` names the new attempt.
    pub struct TaskRequeued {
        pub reason: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub worker_id: Option<String>,
    }

    pub struct TaskSkipped {
        pub reason: String,
    }

    pub struct TaskCancelled {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub worker_id: Option<String>,
        pub reason: String,
    }
}

/// Declares `FailureReason` from one list of `"name" => Variant`: the name on the wire and
/// `as_str` are the same literal. Any other name reads as `Other`, so a reason written by a newer
/// service still folds.
macro_rules! failure_reasons {
    ($($(#[$doc:meta])* $name:literal => $variant:ident,)*) => {
        /// Why a task failed, as `task.failed` names it (`reason`).
        #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(from = "String", into = "String")]
        pub enum FailureReason {
            $($(#[$doc])* $variant,)*
            /// A reason this version does not know.
            Other(String),
        }

        impl FailureReason {
            pub fn as_str(&self) -> &str {
                match self {
                    $(FailureReason::$variant => $name,)*
                    FailureReason::Other(name) => name,
                }
            }
        }

        impl From<String> for FailureReason {
            fn from(name: String) -> FailureReason {
                match name.as_str() {
                    $($name => FailureReason::$variant,)*
                    _ => FailureReason::Other(name),
                }
            }
        }
    };
}

failure_reasons! {
    /// The executor failed (its message says how); `retryable` says whether it asked for a retry.
    "executor_error" => ExecutorError,
    /// Killed at `maxRuntimeSeconds`.
    "max_runtime_exceeded" => MaxRuntimeExceeded,
    /// A declared artifact was not in the output folder.
    "missing_artifact" => MissingArtifact,
    /// The results or artifacts could not be stored.
    "result_upload_failed" => ResultUploadFailed,
    /// A draining worker stopped before the task finished and handed it back.
    "handed_back" => HandedBack,
    /// Asked by the router, the worker gave back an order waiting in its queue, unrun: it could
    /// run sooner on another worker. No attempt spent, no failure of the worker.
    "released" => Released,
    /// The worker holding the last attempt left the fleet.
    "worker_lost" => WorkerLost,
    /// An upstream stage failed or was cancelled.
    "upstream_failed" => UpstreamFailed,
    /// The stage's spec did not resolve (templates, upstream values).
    "spec_resolution_failed" => SpecResolutionFailed,
    /// The resolved spec is not valid for its task type.
    "spec_validation_failed" => SpecValidationFailed,
    /// No worker in the fleet can run it (the message explains why, worker by worker).
    "no_eligible_worker" => NoEligibleWorker,
}

impl From<FailureReason> for String {
    fn from(reason: FailureReason) -> String {
        match reason {
            FailureReason::Other(name) => name,
            known => known.as_str().to_owned(),
        }
    }
}

impl std::fmt::Display for FailureReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskCancelRequested {
    pub workflow_id: String,
    /// One task, or the whole workflow when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkflowEnded {
    pub workflow_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerJoined {
    pub worker_id: String,
    pub started_at: String,
    pub supported_task_types: Vec<String>,
    pub gpus: usize,
    pub simulated: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerLost {
    pub worker_id: String,
    pub started_at: String,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerCordon {
    pub worker_id: String,
}

/// An operator (or a policy) asks an idle worker to load a model ahead of the tasks that need it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerPrewarm {
    pub worker_id: String,
    /// A model id as specs name it (`model.source.identifier`).
    pub model: String,
}

/// The router removed these workflows' events from the log (retention: ended longer ago than the
/// kept period). It lists every workflow purged so far, not only the latest batch, and is
/// stored before the batch is purged: a reader that took part of a purged workflow's events
/// learns from the next one it reads to drop it, and the latest alone is enough to hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkflowsPurged {
    pub workflows: crate::ids::WorkflowIds,
    /// The workflows this record's round removes (within `workflows`). A record is stored only
    /// once the round of the one before it removed everything it named, so what a router that
    /// takes over may find left in the log is these, never anything older. Absent in a record
    /// written before it was: nothing to remove again.
    #[serde(default, skip_serializing_if = "crate::ids::WorkflowIds::is_empty")]
    pub removing: crate::ids::WorkflowIds,
}

/// Declares `EventBody` from one list of `"tag" => Variant(Body)`: the serde tag and `kind()`
/// are the same literal, so they cannot disagree.
macro_rules! event_bodies {
    ($($(#[$doc:meta])* $tag:literal => $variant:ident($body:ty),)*) => {
        /// Every kind of event. Matched exhaustively everywhere; there is no catch-all.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "type")]
        pub enum EventBody {
            $($(#[$doc])* #[serde(rename = $tag)] $variant($body),)*
        }

        impl EventBody {
            /// The `type` field, e.g. `task.completed`: the serde tag.
            pub fn kind(&self) -> &'static str {
                match self {
                    $(EventBody::$variant(_) => $tag,)*
                }
            }

            /// Every kind of event this version knows (`<noun>.<verb>`).
            pub const KINDS: &'static [&'static str] = &[$($tag),*];

            /// Whether `kind` (`<noun>.<verb>`) is a kind of event this version knows.
            pub fn is_kind(kind: &str) -> bool {
                matches!(kind, $($tag)|*)
            }

            /// The body of a JSON event whose `type` is `kind`, read straight into its struct
            /// (the envelope's `id`, `time` and `type` are ignored there); `None` for a kind
            /// this version does not know.
            fn from_json(kind: &str, payload: &str) -> Option<serde_json::Result<EventBody>> {
                let mut deserializer = serde_json::Deserializer::from_str(payload);
                let body = EventBody::deserialize_as(kind, &mut deserializer)?;
                Some(body.and_then(|body| deserializer.end().map(|()| body)))
            }

            /// The body of an event whose `type` is `kind`, read from `deserializer` into its
            /// struct; `None` for a kind this version does not know.
            fn deserialize_as<'de, D: serde::Deserializer<'de>>(
                kind: &str,
                deserializer: D,
            ) -> Option<Result<EventBody, D::Error>> {
                match kind {
                    $($tag => Some(<$body>::deserialize(deserializer).map(EventBody::$variant)),)*
                    _ => None,
                }
            }
        }
    };
}

event_bodies! {
    "submission.accepted" => SubmissionAccepted(SubmissionAccepted),
    "submission.rejected" => SubmissionRejected(SubmissionRejected),
    "task.pending" => TaskPending(TaskPending),
    "task.dispatched" => TaskDispatched(TaskDispatched),
    "task.merged" => TaskMerged(TaskMerged),
    "task.started" => TaskStarted(TaskStarted),
    "task.updated" => TaskUpdated(TaskUpdated),
    "task.completed" => TaskCompleted(TaskCompleted),
    "task.failed" => TaskFailed(TaskFailed),
    "task.requeued" => TaskRequeued(TaskRequeued),
    "task.skipped" => TaskSkipped(TaskSkipped),
    "task.cancel_requested" => TaskCancelRequested(TaskCancelRequested),
    "task.cancelled" => TaskCancelled(TaskCancelled),
    "workflow.completed" => WorkflowCompleted(WorkflowEnded),
    "workflow.failed" => WorkflowFailed(WorkflowEnded),
    "workflow.cancelled" => WorkflowCancelled(WorkflowEnded),
    "worker.joined" => WorkerJoined(WorkerJoined),
    "worker.lost" => WorkerLost(WorkerLost),
    "worker.cordoned" => WorkerCordoned(WorkerCordon),
    "worker.uncordoned" => WorkerUncordoned(WorkerCordon),
    /// An operator asked the worker to drain: no new work; what runs finishes. Uncordoning ends it.
    "worker.drain_requested" => WorkerDrainRequested(WorkerCordon),
    "worker.prewarm_requested" => WorkerPrewarmRequested(WorkerPrewarm),
    "workflows.purged" => WorkflowsPurged(WorkflowsPurged),
}

/// The subject token used when an event has no workflow (fleet events), no task, or (first
/// token) no worker: an event a service writes about no worker's queue.
pub const NO_SCOPE: &str = "_";
/// The workflow-position token of fleet events.
pub const FLEET_SCOPE: &str = "fleet";

impl EventBody {
    /// The task this event is about, if any.
    pub fn task(&self) -> Option<&TaskRef> {
        match self {
            EventBody::TaskPending(e) => Some(&e.task),
            EventBody::TaskDispatched(e) => Some(&e.task),
            EventBody::TaskMerged(e) => Some(&e.task),
            EventBody::TaskStarted(e) => Some(&e.task),
            EventBody::TaskUpdated(e) => Some(&e.task),
            EventBody::TaskCompleted(e) => Some(&e.task),
            EventBody::TaskFailed(e) => Some(&e.task),
            EventBody::TaskRequeued(e) => Some(&e.task),
            EventBody::TaskSkipped(e) => Some(&e.task),
            EventBody::TaskCancelled(e) => Some(&e.task),
            EventBody::SubmissionAccepted(_)
            | EventBody::SubmissionRejected(_)
            | EventBody::TaskCancelRequested(_)
            | EventBody::WorkflowCompleted(_)
            | EventBody::WorkflowFailed(_)
            | EventBody::WorkflowCancelled(_)
            | EventBody::WorkerJoined(_)
            | EventBody::WorkerLost(_)
            | EventBody::WorkerCordoned(_)
            | EventBody::WorkerUncordoned(_)
            | EventBody::WorkerDrainRequested(_)
            | EventBody::WorkerPrewarmRequested(_)
            | EventBody::WorkflowsPurged(_) => None,
        }
    }

    /// (workflow token, task token) of the subject `flowmesh.events.<workflow>.<task>.<type>`.
    pub fn scope(&self) -> (&str, &str) {
        if let Some(task) = self.task() {
            return (&task.workflow_id, &task.task_id);
        }
        match self {
            EventBody::SubmissionAccepted(e) => (&e.workflow_id, NO_SCOPE),
            EventBody::SubmissionRejected(e) => (&e.workflow_id, NO_SCOPE),
            EventBody::TaskCancelRequested(e) => (&e.workflow_id, e.task_id.as_deref().unwrap_or(NO_SCOPE)),
            EventBody::WorkflowCompleted(e) | EventBody::WorkflowFailed(e) | EventBody::WorkflowCancelled(e) => {
                (&e.workflow_id, NO_SCOPE)
            }
            EventBody::WorkerJoined(e) => (FLEET_SCOPE, &e.worker_id),
            EventBody::WorkerLost(e) => (FLEET_SCOPE, &e.worker_id),
            EventBody::WorkerCordoned(e) | EventBody::WorkerUncordoned(e) | EventBody::WorkerDrainRequested(e) => {
                (FLEET_SCOPE, &e.worker_id)
            }
            EventBody::WorkerPrewarmRequested(e) => (FLEET_SCOPE, &e.worker_id),
            _ => (NO_SCOPE, NO_SCOPE),
        }
    }

    /// The workflow this event is about; `None` for fleet events and purge records.
    pub fn workflow(&self) -> Option<&str> {
        if let Some(task) = self.task() {
            return Some(&task.workflow_id);
        }
        match self {
            EventBody::SubmissionAccepted(e) => Some(&e.workflow_id),
            EventBody::SubmissionRejected(e) => Some(&e.workflow_id),
            EventBody::TaskCancelRequested(e) => Some(&e.workflow_id),
            _ => self.ended_workflow(),
        }
    }

    /// The deterministic id: the same cause always yields the same id. All terminal events of
    /// one task attempt share `<task>.<attempt>.end`, so the stream keeps only the first.
    pub fn derive_id(&self, sequence_hint: u64) -> String {
        let t = |task: &TaskRef, what: &str| format!("{}.{}.{what}", task.task_id, task.attempt);
        match self {
            EventBody::SubmissionAccepted(e) => format!("sub.{}.verdict", e.submission.seq),
            EventBody::SubmissionRejected(e) => format!("sub.{}.verdict", e.submission.seq),
            EventBody::TaskPending(e) => t(&e.task, &format!("pending.{sequence_hint}")),
            EventBody::TaskDispatched(e) => t(&e.task, "dispatched"),
            EventBody::TaskMerged(e) => t(&e.task, "merged"),
            EventBody::TaskStarted(e) => t(&e.task, "started"),
            EventBody::TaskUpdated(e) => t(&e.task, &format!("updated.{sequence_hint}")),
            EventBody::TaskCompleted(e) => t(&e.task, "end"),
            EventBody::TaskFailed(e) => t(&e.task, "end"),
            EventBody::TaskSkipped(e) => t(&e.task, "end"),
            EventBody::TaskCancelled(e) => t(&e.task, "end"),
            EventBody::TaskRequeued(e) => t(&e.task, "requeued"),
            EventBody::TaskCancelRequested(e) => {
                format!("{}.cancel.{}", e.task_id.as_deref().unwrap_or(&e.workflow_id), sequence_hint)
            }
            EventBody::WorkflowCompleted(e) | EventBody::WorkflowFailed(e) | EventBody::WorkflowCancelled(e) => {
                format!("{}.end", e.workflow_id)
            }
            EventBody::WorkerJoined(e) => format!("worker.{}.{}.joined", e.worker_id, e.started_at),
            EventBody::WorkerLost(e) => format!("worker.{}.{}.lost", e.worker_id, e.started_at),
            EventBody::WorkerCordoned(e) => {
                format!("worker.{}.cordon.{sequence_hint}", e.worker_id)
            }
            EventBody::WorkerUncordoned(e) => {
                format!("worker.{}.uncordon.{sequence_hint}", e.worker_id)
            }
            EventBody::WorkerDrainRequested(e) => {
                format!("worker.{}.drain.{sequence_hint}", e.worker_id)
            }
            EventBody::WorkerPrewarmRequested(e) => {
                format!("worker.{}.prewarm.{}.{sequence_hint}", e.worker_id, e.model)
            }
            // A retry of the same record is the same id; two leaders' records (a lease changing
            // hands mid-round) of one size but other ids are not.
            EventBody::WorkflowsPurged(e) => format!("purged.{}.{:016x}", e.workflows.len(), e.workflows.fingerprint()),
        }
    }

    /// The worker a report names, for the kinds a worker may write: its own `started`, `updated`,
    /// `completed`, `failed` and `cancelled` reports. `None` for every other kind, and for a
    /// `failed` or `cancelled` that names no worker (the router's).
    pub fn reporter(&self) -> Option<&str> {
        match self {
            EventBody::TaskStarted(e) => Some(&e.worker_id),
            EventBody::TaskUpdated(e) => Some(&e.worker_id),
            EventBody::TaskCompleted(e) => Some(&e.worker_id),
            EventBody::TaskFailed(e) => e.worker_id.as_deref(),
            EventBody::TaskCancelled(e) => e.worker_id.as_deref(),
            EventBody::SubmissionAccepted(_)
            | EventBody::SubmissionRejected(_)
            | EventBody::TaskPending(_)
            | EventBody::TaskDispatched(_)
            | EventBody::TaskRequeued(_)
            | EventBody::TaskSkipped(_)
            | EventBody::TaskCancelRequested(_)
            | EventBody::WorkflowCompleted(_)
            | EventBody::WorkflowFailed(_)
            | EventBody::WorkflowCancelled(_)
            | EventBody::WorkerJoined(_)
            | EventBody::WorkerLost(_)
            | EventBody::WorkerCordoned(_)
            | EventBody::WorkerUncordoned(_)
            | EventBody::TaskMerged(_)
            | EventBody::WorkerDrainRequested(_)
            | EventBody::WorkerPrewarmRequested(_)
            | EventBody::WorkflowsPurged(_) => None,
        }
    }

    /// Kinds only the worker running the task writes (the router writes `failed` and
    /// `cancelled` too, when a worker is lost or a task never reached one).
    pub fn is_worker_report_only(&self) -> bool {
        matches!(self, EventBody::TaskStarted(_) | EventBody::TaskUpdated(_) | EventBody::TaskCompleted(_))
    }

    /// The workflow this event ends, if it is a workflow's end (stored, or derived by a reader).
    pub fn ended_workflow(&self) -> Option<&str> {
        match self {
            EventBody::WorkflowCompleted(e) | EventBody::WorkflowFailed(e) | EventBody::WorkflowCancelled(e) => {
                Some(&e.workflow_id)
            }
            _ => None,
        }
    }

    /// Whether this is the end of a task attempt.
    pub fn is_task_terminal(&self) -> bool {
        matches!(
            self,
            EventBody::TaskCompleted(_)
                | EventBody::TaskFailed(_)
                | EventBody::TaskSkipped(_)
                | EventBody::TaskCancelled(_)
        )
    }
}

/// Who wrote an event, as its subject says. NATS permissions decide who may publish on which
/// subject (`streams/nats-server.conf`), so a reader that checks a body against its subject knows
/// its author without trusting anything the body claims.
///
/// The subject below `flowmesh.events.` is `<worker>.<workflow>.<task>.<noun>.<verb>`. The first
/// token is the worker a report is by, or the worker a dispatch is for (whose queue it is), and
/// `_` for every other event: the workers' dispatch consumers then filter on a literal first
/// token, so the server's search of its subject index for one worker's dispatches stays within
/// that worker's subjects ("The event subject layout" in ARCHITECTURE). Logs written before
/// this layout (`<workflow>.<task>.<noun>.<verb>`, with `.<worker>` after a report or a
/// dispatch) are read as well: [`Layout`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Author<'a> {
    /// The validator, the router or an operator: `_.<workflow>.<task>.<noun>.<verb>`, and a
    /// dispatch, `<W>.<workflow>.<task>.task.dispatched`.
    Service,
    /// Worker W reporting on work dispatched to it: `<W>.<workflow>.<task>.task.<verb>`.
    Worker(&'a str),
}

/// How a subject below `flowmesh.events.` places its tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `<worker|_>.<workflow>.<task>.<noun>.<verb>`: what every writer writes.
    WorkerFirst,
    /// `<workflow>.<task>.<noun>.<verb>[.<worker>]`: logs written before the worker came first.
    /// No role may write it any more; it is read so that an older log folds as it did.
    Legacy,
}

impl Layout {
    /// The layout of `subject_suffix`: worker-first when it has five tokens and the last two
    /// are a kind of event. No subject reads both ways: a kind's verb is never a kind's noun,
    /// so the fourth token cannot end one kind (legacy) and begin another (worker-first).
    pub fn of(subject_suffix: &str) -> Layout {
        let mut dots = subject_suffix.match_indices('.').map(|(at, _)| at);
        match (dots.nth(2), dots.next(), dots.next()) {
            (Some(third), Some(_), None) if EventBody::is_kind(&subject_suffix[third + 1..]) => Layout::WorkerFirst,
            _ => Layout::Legacy,
        }
    }
}

impl<'a> Author<'a> {
    /// The author a subject below `flowmesh.events.` names: the first token, unless it is `_`
    /// or the event a dispatch (both written by a service). In a legacy subject, a fifth token
    /// is the reporting worker, except after `task.dispatched`.
    pub fn of(subject_suffix: &'a str) -> Author<'a> {
        Author::in_layout(subject_suffix, Layout::of(subject_suffix))
    }

    /// As [`Author::of`], for a subject whose layout the caller has already told.
    fn in_layout(subject_suffix: &'a str, layout: Layout) -> Author<'a> {
        let mut tokens = subject_suffix.splitn(5, '.');
        let mut next = || tokens.next();
        let tokens = [next(), next(), next(), next(), next()];
        match layout {
            Layout::WorkerFirst => match tokens {
                [Some(NO_SCOPE), ..] | [_, _, _, Some("task"), Some("dispatched")] => Author::Service,
                [Some(worker), ..] => Author::Worker(worker),
                _ => Author::Service,
            },
            Layout::Legacy => match tokens {
                [_, _, Some("task"), Some("dispatched"), Some(_)] => Author::Service,
                [_, _, _, _, Some(worker)] => Author::Worker(worker),
                _ => Author::Service,
            },
        }
    }
}

/// Whether a reader builds the work order a dispatch carries.
#[derive(Debug, Clone, Copy)]
enum Orders {
    Read,
    Skip,
}

/// A dispatch's fields but its order, which serde skips as an unknown field: it checks that the
/// order is JSON and builds nothing of it.
#[derive(Deserialize)]
struct DispatchWithoutOrder {
    workflow_id: String,
    task_id: String,
    stage: String,
    attempt: u32,
    worker_id: String,
    task_type: String,
    message: String,
}

impl From<DispatchWithoutOrder> for EventBody {
    fn from(d: DispatchWithoutOrder) -> EventBody {
        EventBody::TaskDispatched(TaskDispatched {
            task: TaskRef { workflow_id: d.workflow_id, task_id: d.task_id, stage: d.stage, attempt: d.attempt },
            worker_id: d.worker_id,
            task_type: d.task_type,
            message: d.message,
            order: None,
        })
    }
}

/// The largest event a reader takes: the streams' `max_msg_size`.
pub const MAX_EVENT_BYTES: usize = 1 << 20;

/// Why a message on the event log is not folded. Readers skip it, count it and go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unreadable {
    #[error("{size} bytes, over the {MAX_EVENT_BYTES}-byte limit")]
    TooLarge { size: usize },
    #[error("not an event: {0}")]
    NotAnEvent(String),
    #[error("a {kind} event may not be written by {author}")]
    WrongAuthor { kind: &'static str, author: String },
    #[error("its subject says {found:?}, its body {expected:?}")]
    SubjectMismatch { expected: String, found: String },
}

impl Event {
    /// Builds an event whose id is derived from its body (see [`EventBody::derive_id`]).
    pub fn new(body: EventBody, time: String, sequence_hint: u64) -> Event {
        Event { id: body.derive_id(sequence_hint), time, body }
    }

    /// The subject below `flowmesh.events.` of this event written by `author`:
    /// `<first>.<workflow>.<task>.<noun>.<verb>`, where `<first>` is the reporting worker for a
    /// worker's report, the worker the order is for (which consumes that subject) for a
    /// dispatch, and `_` for every other event.
    pub fn subject_suffix(&self, author: Author<'_>) -> String {
        let (workflow, task) = self.body.scope();
        format!("{}.{workflow}.{task}.{}", self.first_token(author), self.body.kind())
    }

    /// The first token of this event's subject when `author` writes it ([`Event::subject_suffix`]).
    fn first_token<'a>(&'a self, author: Author<'a>) -> &'a str {
        match (author, &self.body) {
            (Author::Service, EventBody::TaskDispatched(d)) => &d.worker_id,
            (Author::Service, _) => NO_SCOPE,
            (Author::Worker(worker), _) => worker,
        }
    }

    /// Decodes a JSON event as the derived `Deserialize` does, without its cost: an internally
    /// tagged enum under a flattened field makes serde buffer the whole event (a dispatch's
    /// order included) in an intermediate tree twice before the body's struct sees it. Here,
    /// when the `type` comes before the body's fields (as every writer of ours puts it), the
    /// type names the body's struct and that reads the rest of the same map: one pass
    /// ([`one_pass`]). Otherwise, and for anything that pass does not take, one pass reads the
    /// envelope (`id`, `time`, `type`) and skips the rest, and a second reads the body's own
    /// struct from the same bytes, saying precisely what is wrong. It may refuse what the
    /// derived decoding takes (a `type` given as a number, which serde reads as the variant's
    /// index; bytes that are not UTF-8), and what it reads, the derived decoding reads the same.
    /// Debug builds (every test, the integration scenarios' services included) decode each
    /// event both ways and assert it, and read what the one pass takes in two passes as well.
    pub fn from_json(payload: &[u8]) -> Result<Event, String> {
        Event::decode(payload, Orders::Read)
    }

    fn decode(payload: &[u8], orders: Orders) -> Result<Event, String> {
        let event = Event::from_json_unchecked(payload, orders);
        if cfg!(debug_assertions)
            && let Ok(read) = &event
        {
            let derived = serde_json::from_slice::<Event>(payload).map(|mut event| {
                if let (Orders::Skip, EventBody::TaskDispatched(d)) = (orders, &mut event.body) {
                    d.order = None;
                }
                event
            });
            // Skipping orders, a dispatch whose order is JSON but no work order reads all the
            // same, where the derived decoding refuses it.
            let unread_order =
                matches!(orders, Orders::Skip) && derived.is_err() && matches!(read.body, EventBody::TaskDispatched(_));
            // The derived decoding buffers the fields its body does not know, and its buffer
            // stops at serde_json's nesting limit (128); this one skips them, without a limit.
            // A field it reads is held to the limit either way (the event fuzz test found it).
            let deep_unknown_field =
                derived.as_ref().is_err_and(|e| e.to_string().starts_with("recursion limit exceeded"));
            assert!(
                unread_order || deep_unknown_field || derived.as_ref().ok() == Some(read),
                "the derived decoding disagrees on {}: {read:?} against {derived:?}",
                String::from_utf8_lossy(payload),
            );
        }
        event
    }

    fn from_json_unchecked(payload: &[u8], orders: Orders) -> Result<Event, String> {
        // JSON is UTF-8. The decoders skip the fields they do not know without looking inside
        // their strings, so they alone would take such bytes there; checked once here, the
        // passes below read it as text and check no string again.
        let text = std::str::from_utf8(payload)
            .map_err(|e| format!("not UTF-8 (first bad byte at offset {})", e.valid_up_to()))?;
        if let Some(event) = one_pass::read(text, orders) {
            if cfg!(debug_assertions) {
                let two_passes = Event::from_json_in_two_passes(text, orders);
                assert_eq!(two_passes.as_ref(), Ok(&event), "the two readings disagree on {text}");
            }
            return Ok(event);
        }
        Event::from_json_in_two_passes(text, orders)
    }

    fn from_json_in_two_passes(text: &str, orders: Orders) -> Result<Event, String> {
        #[derive(Deserialize)]
        struct Envelope<'a> {
            id: String,
            time: String,
            #[serde(rename = "type", borrow)]
            kind: std::borrow::Cow<'a, str>,
        }
        let envelope: Envelope<'_> = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let body = if let (Orders::Skip, "task.dispatched") = (orders, envelope.kind.as_ref()) {
            serde_json::from_str::<DispatchWithoutOrder>(text).map_err(|e| e.to_string())?.into()
        } else {
            EventBody::from_json(&envelope.kind, text)
                .ok_or_else(|| format!("unknown event type {:?}", envelope.kind))?
                .map_err(|e| e.to_string())?
        };
        Ok(Event { id: envelope.id, time: envelope.time, body })
    }

    /// Reads a message of the event log: `subject_suffix` is its subject below
    /// `flowmesh.events.`. The event is returned only when its body agrees with its subject in
    /// kind, workflow and task, and its author (from the subject) may write that kind: a
    /// worker only its own reports, the services everything else. Nothing a body claims is
    /// believed that its subject does not confirm.
    pub fn read(subject_suffix: &str, payload: &[u8]) -> Result<Event, Unreadable> {
        Event::read_with(subject_suffix, payload, Orders::Read)
    }

    /// `read`, leaving out the work order a dispatch carries (its `order` is `None`): for a
    /// fold, which never looks at it. The router reads back each dispatch it sent, and building
    /// its order (the task's whole spec) to drop it at once was about 22 allocations per task.
    pub fn read_skipping_orders(subject_suffix: &str, payload: &[u8]) -> Result<Event, Unreadable> {
        Event::read_with(subject_suffix, payload, Orders::Skip)
    }

    fn read_with(subject_suffix: &str, payload: &[u8], orders: Orders) -> Result<Event, Unreadable> {
        if payload.len() > MAX_EVENT_BYTES {
            return Err(Unreadable::TooLarge { size: payload.len() });
        }
        let event = Event::decode(payload, orders).map_err(|mut message| {
            crate::problem::cut_text(&mut message, 200);
            Unreadable::NotAnEvent(message)
        })?;
        let layout = Layout::of(subject_suffix);
        let author = Author::in_layout(subject_suffix, layout);
        let kind = event.body.kind();
        let allowed = match author {
            Author::Service => !event.body.is_worker_report_only(),
            Author::Worker(worker) => event.body.reporter() == Some(worker),
        };
        if !allowed {
            let author = match author {
                Author::Service => "a service".to_owned(),
                Author::Worker(w) => format!("worker {w}"),
            };
            return Err(Unreadable::WrongAuthor { kind, author });
        }
        if !event.written_on(author, subject_suffix, layout) {
            let expected = event.subject_suffix(author);
            return Err(Unreadable::SubjectMismatch { expected, found: subject_suffix.to_owned() });
        }
        Ok(event)
    }

    /// Whether `subject_suffix` is where `author` writes this event (`subject_suffix`), without
    /// spelling it: every reader checks every event it folds. A legacy subject is checked as it
    /// was written ([`Layout::Legacy`]), and a dispatch stored before dispatches named their
    /// worker in the subject is read without the worker's token.
    fn written_on(&self, author: Author<'_>, subject_suffix: &str, layout: Layout) -> bool {
        let (workflow, task) = self.body.scope();
        fn token<'a>(rest: &'a str, part: &str) -> Option<&'a str> {
            rest.strip_prefix(part)?.strip_prefix('.')
        }
        if layout == Layout::WorkerFirst {
            return token(subject_suffix, self.first_token(author))
                .and_then(|rest| token(rest, workflow))
                .and_then(|rest| token(rest, task))
                == Some(self.body.kind());
        }
        let last = match (author, &self.body) {
            (Author::Service, EventBody::TaskDispatched(d)) => Some(d.worker_id.as_str()),
            (Author::Service, _) => None,
            (Author::Worker(worker), _) => Some(worker),
        };
        let Some(after_kind) = token(subject_suffix, workflow)
            .and_then(|rest| token(rest, task))
            .and_then(|rest| rest.strip_prefix(self.body.kind()))
        else {
            return false;
        };
        match (after_kind, last) {
            ("", None) => true,
            ("", Some(_)) => matches!((author, &self.body), (Author::Service, EventBody::TaskDispatched(_))),
            (rest, Some(last)) => rest.strip_prefix('.') == Some(last),
            (_, None) => false,
        }
    }
}
