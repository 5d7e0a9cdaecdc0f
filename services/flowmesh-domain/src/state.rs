//! The state fold: workflows and tasks as the event log says they are.
//!
//! `apply` is the only way state changes. It enforces the lifecycle: an event for a superseded
//! attempt, a second terminal event, or a report for a task that already ended is ignored.
//!
//! One fact is derived, not read: a workflow whose every task completed or was skipped (none
//! through a merged execution), with no cancel asked for, has completed at its last task's end. Nobody stores its `workflow.completed`
//! (it would cost a message per workflow and say nothing the log does not); readers show it as if
//! stored ([`State::apply_deriving`]).

use crate::event::{Event, EventBody, FailureReason, TaskRef};
use crate::problem::Problem;
use crate::template::Upstream;
use crate::workflow::{TaskDef, Workflow};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// What a completion leaves in its task.
struct Outcome {
    result: Option<Value>,
    result_object: Option<String>,
    artifacts: Vec<crate::event::Artifact>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum), value(rename_all = "snake_case"))]
pub enum TaskStatus {
    /// Dependencies not done yet, or ready and not yet placed.
    Waiting,
    Pending,
    Dispatched,
    Running,
    /// The attempt failed and may be retried; the router requeues it.
    Retrying,
    /// Coalesced into an identical task's execution (`merged_into`); ends with its result.
    Merged,
    Completed,
    Failed,
    Skipped,
    Cancelled,
}

impl TaskStatus {
    /// The name on the wire, in tables and in filters (`--status`).
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Waiting => "waiting",
            TaskStatus::Pending => "pending",
            TaskStatus::Dispatched => "dispatched",
            TaskStatus::Running => "running",
            TaskStatus::Retrying => "retrying",
            TaskStatus::Merged => "merged",
            TaskStatus::Completed => "completed",
            TaskStatus::Failed => "failed",
            TaskStatus::Skipped => "skipped",
            TaskStatus::Cancelled => "cancelled",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, TaskStatus::Completed | TaskStatus::Failed | TaskStatus::Skipped | TaskStatus::Cancelled)
    }

    /// Whether a worker holds (or is about to hold) the task.
    pub fn is_on_worker(self) -> bool {
        matches!(self, TaskStatus::Dispatched | TaskStatus::Running)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskState {
    pub def: TaskDef,
    pub status: TaskStatus,
    pub attempt: u32,
    pub worker_id: Option<String>,
    pub result: Option<Value>,
    pub result_object: Option<String>,
    pub artifacts: Vec<crate::event::Artifact>,
    /// Workers that failed an attempt of this task (placement avoids them).
    pub failed_on: BTreeSet<String>,
    /// The last `task.pending` message, to emit a new one only when it changes.
    pub pending_message: Option<String>,
    pub pending_events: u64,
    pub unplaceable_since_ms: Option<u64>,
    /// Why it failed, was skipped or was cancelled.
    pub reason: Option<String>,
    pub message: Option<String>,
    /// `task.updated` events seen for the current attempt.
    pub updates: u64,
    /// The latest `data.progress` of a `task.updated` (an ML runner's step, loss, tokens/s), for
    /// progress bars; cleared with `updates`.
    #[serde(default)]
    pub progress: Option<Value>,
    pub cancel_requested: bool,
    /// The task whose execution this one shares (`task.merged`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merged_into: Option<String>,
    /// Attempts handed back unrun ([`REQUEUED_UNRUN`]): they do not count against `max_attempts`.
    #[serde(default, skip_serializing_if = "crate::fleet::is_zero")]
    pub unrun_attempts: u32,
}

/// The reason of a `task.requeued` for an attempt that never ran: a worker that stopped cleanly
/// handed its order back from its queue. Such an attempt is not spent.
pub const REQUEUED_UNRUN: &str = "handed_back_unrun";

/// How many attempts of one task may go unrun and unspent. A worker's word that it gave an
/// order back unrun (`released`) is believed up to here; past it the report counts as any
/// retryable failure, so a worker that keeps giving a task back cannot keep it alive for ever.
pub const UNRUN_AT_MOST: u32 = 16;

impl TaskState {
    /// The attempts counted against `max_attempts` so far, the current one included: those
    /// handed back unrun are not.
    pub fn counted_attempts(&self) -> u32 {
        self.attempt.saturating_sub(self.unrun_attempts)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum), value(rename_all = "snake_case"))]
pub enum WorkflowStatus {
    Running,
    Completed,
    Failed,
    Cancelled,
}

impl WorkflowStatus {
    /// The name on the wire, in tables and in filters (`--status`).
    pub fn as_str(self) -> &'static str {
        match self {
            WorkflowStatus::Running => "running",
            WorkflowStatus::Completed => "completed",
            WorkflowStatus::Failed => "failed",
            WorkflowStatus::Cancelled => "cancelled",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkflowState {
    pub workflow_id: String,
    /// The submission's stream sequence: the router serves workflows oldest first.
    pub seq: u64,
    pub name: String,
    pub owner: Option<String>,
    pub submitted_at: String,
    pub status: WorkflowStatus,
    /// Stage name → task, in the workflow's topological order.
    pub tasks: Vec<TaskState>,
    pub cancel_requested: bool,
    pub cancel_requests: u64,
    pub reason: Option<String>,
}

impl WorkflowState {
    pub fn task(&self, stage: &str) -> Option<&TaskState> {
        self.tasks.iter().find(|t| t.def.stage == stage)
    }
}

/// A rejected submission, kept for `workflow list` and `submit --wait`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rejection {
    pub workflow_id: String,
    pub errors: Vec<Problem>,
}

/// What `apply` did with an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    Changed,
    /// Recorded in the log but without effect, with the reason (late report, duplicate, …).
    Ignored(&'static str),
}

/// The workflows that ended in one minute, and when the last of them did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct EndedIn {
    last_ms: u64,
    ids: crate::ids::WorkflowIds,
}

/// The whole fold.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct State {
    /// Shared, so a copy of the fold (the router's checkpoint, written off its loop) costs a
    /// pointer per workflow; a workflow changed while a copy holds it is copied then.
    pub workflows: BTreeMap<String, Arc<WorkflowState>>,
    pub rejected: BTreeMap<String, Rejection>,
    /// task id → (workflow id, index in `tasks`).
    task_index: BTreeMap<String, (String, usize)>,
    /// Worker id → the `started_at` of the incarnation last reported lost.
    pub lost_workers: BTreeMap<String, String>,
    /// Worker id → the `started_at` of the incarnation last seen joining.
    pub joined_workers: BTreeMap<String, String>,
    pub cordoned: BTreeSet<String>,
    /// Models a prewarm hint was sent for (the router asks once per model).
    #[serde(default)]
    pub prewarm_requested: BTreeSet<String>,
    /// Workers an operator asked to drain (until uncordoned).
    #[serde(default)]
    pub draining: BTreeSet<String>,
    /// Cordon/uncordon/drain events seen, to derive the next one's id.
    pub cordon_events: u64,
    /// The last stream sequence folded in (for checkpoints).
    pub last_seq: u64,
    /// Submission sequence → id of every workflow still running: what the router works on, in the
    /// order submissions came, without walking the whole history on every event.
    running: BTreeMap<u64, String>,
    /// Workflows that ended and are not yet forgotten ([`State::forget_ended`]).
    #[serde(default)]
    ended: Vec<String>,
    /// Every workflow in the fold that had a task merged into another's execution: where
    /// `forget_ended` looks for the lenders it must keep, instead of walking every running
    /// workflow (a few milliseconds at 10,000 in flight, and the router forgets every 50 ms).
    /// Kept until the workflow is dropped; what it lists is checked afresh each time. `None` in a
    /// checkpoint written before it existed: one walk finds them when first needed.
    #[serde(default)]
    merging: Option<BTreeSet<String>>,
    /// The ids of the workflows `forget_ended` dropped (ended or rejected): a second verdict for
    /// one is still ignored. Ranges of submission sequences, so it does not grow with history.
    #[serde(default)]
    forgotten: crate::ids::WorkflowIds,
    /// Workflows (and rejections) whose events the log still holds, by the minute they ended:
    /// what retention purges once the minute's last end is older than the kept period
    /// ([`State::due_for_purge`]). Ranges, so it grows with the kept period's minutes, not with
    /// the workflows in them. Required in a checkpoint: one written before retention does not
    /// read, so the router replays the log once and notes the ends of the history before it too.
    unpurged: BTreeMap<u64, EndedIn>,
    /// Every workflow whose events were purged (`workflows.purged`, the latest of which lists
    /// them all).
    #[serde(default)]
    purged: crate::ids::WorkflowIds,
    /// What the latest purge record's round removes (`WorkflowsPurged::removing`): the only
    /// workflows whose events a router taking over may find left behind.
    #[serde(default)]
    removing: crate::ids::WorkflowIds,
}

impl State {
    pub fn task(&self, task_id: &str) -> Option<&TaskState> {
        let (wf, i) = self.task_index.get(task_id)?;
        self.workflows.get(wf)?.tasks.get(*i)
    }

    fn task_mut(&mut self, task: &TaskRef) -> Option<&mut TaskState> {
        let (wf, i) = self.task_index.get(&task.task_id)?;
        Arc::make_mut(self.workflows.get_mut(wf)?).tasks.get_mut(*i)
    }

    /// A workflow the fold holds (running, or ended and not yet forgotten).
    pub fn workflow(&self, workflow_id: &str) -> Option<&WorkflowState> {
        self.workflows.get(workflow_id).map(|wf| &**wf)
    }

    /// The running workflows, oldest submission first.
    pub fn running_workflows(&self) -> impl Iterator<Item = &WorkflowState> {
        self.running.values().filter_map(|id| self.workflow(id))
    }

    /// The running workflows in no particular order, for what counts, collects or sweeps them
    /// all: a walk of the fold's map in place, where `running_workflows` looks each one up by its
    /// id (the router's status counts with it: 9-11 ms for two ordered walks at 10,000 in flight,
    /// under 1 ms for one in place).
    pub fn running_workflows_unordered(&self) -> impl Iterator<Item = &WorkflowState> {
        self.workflows.values().map(|wf| &**wf).filter(|wf| wf.status == WorkflowStatus::Running)
    }

    /// The running workflow submitted at `seq` (a key of `running_workflows`' order).
    pub fn running_workflow(&self, seq: u64) -> Option<&WorkflowState> {
        self.workflow(self.running.get(&seq)?)
    }

    /// Folds one event in.
    pub fn apply(&mut self, event: &Event) -> Applied {
        self.apply_deriving(event).0
    }

    /// `apply`, taking the event: an acceptance's workflow and a completion's result move into
    /// the fold instead of being copied (every task's spec, about 25 allocations for a one-task
    /// echo workflow; its result, about 8). For a reader that keeps nothing else of what it
    /// folds, the router.
    pub fn apply_owned(&mut self, event: Event) -> Applied {
        match event.body {
            EventBody::SubmissionAccepted(e) => {
                if let Some(why) = self.has_verdict(&e.workflow_id) {
                    return Applied::Ignored(why);
                }
                self.insert_workflow(e.workflow, e.submission.seq, &event.time);
                Applied::Changed
            }
            EventBody::TaskCompleted(e) => {
                let crate::event::TaskCompleted { task, worker_id, result, result_object, artifacts, .. } = e;
                let applied = self.complete(&task, &worker_id, move || Outcome { result, result_object, artifacts });
                if applied == Applied::Changed {
                    self.complete_if_done(&task.workflow_id, &event.time);
                }
                applied
            }
            body => self.apply(&Event { body, ..event }),
        }
    }

    /// Folds one event in, and returns with what it did the `workflow.completed` it implies, if
    /// it was the last task's end: an event nobody stores, for readers to show as if stored (at
    /// that task's end's time, under the id a stored one would have).
    pub fn apply_deriving(&mut self, event: &Event) -> (Applied, Option<Event>) {
        let applied = self.apply_stored(event);
        let derived = match &event.body {
            EventBody::TaskCompleted(e) if applied == Applied::Changed => {
                self.complete_if_done(&e.task.workflow_id, &event.time)
            }
            EventBody::TaskSkipped(e) if applied == Applied::Changed => {
                self.complete_if_done(&e.task.workflow_id, &event.time)
            }
            _ => None,
        };
        let derived = derived.map(|ended| Event::new(EventBody::WorkflowCompleted(ended), event.time.clone(), 0));
        (applied, derived)
    }

    /// Ends the workflow as completed when every task completed or was skipped, no cancel was
    /// asked for, and no task took its result from a merged execution. The router stores the end
    /// of any other workflow: failed, cancelled, or with a merged task, whose completion a fold
    /// can only believe with the shared execution's workflow in view (a reader of one workflow's
    /// subjects has not).
    fn complete_if_done(&mut self, workflow_id: &str, time: &str) -> Option<crate::event::WorkflowEnded> {
        let wf = Arc::make_mut(self.workflows.get_mut(workflow_id)?);
        let done = wf
            .tasks
            .iter()
            .all(|t| matches!(t.status, TaskStatus::Completed | TaskStatus::Skipped) && t.merged_into.is_none());
        if wf.status != WorkflowStatus::Running || wf.cancel_requested || !done {
            return None;
        }
        wf.status = WorkflowStatus::Completed;
        self.running.remove(&wf.seq);
        self.ended.push(workflow_id.to_owned());
        self.ended_at(workflow_id, time);
        Some(crate::event::WorkflowEnded { workflow_id: workflow_id.to_owned(), reason: None })
    }

    /// Why a verdict for `workflow_id` is ignored: it already has one (held or forgotten).
    fn has_verdict(&self, workflow_id: &str) -> Option<&'static str> {
        if self.workflows.contains_key(workflow_id) {
            Some("workflow already accepted")
        } else if self.rejected.contains_key(workflow_id) {
            Some("workflow already rejected")
        } else if self.forgotten.contains(workflow_id) {
            Some("workflow already decided")
        } else {
            None
        }
    }

    fn apply_stored(&mut self, event: &Event) -> Applied {
        match &event.body {
            // One verdict per workflow: the first stored.
            EventBody::SubmissionAccepted(e) => {
                if let Some(why) = self.has_verdict(&e.workflow_id) {
                    return Applied::Ignored(why);
                }
                self.insert_workflow(e.workflow.clone(), e.submission.seq, &event.time);
                Applied::Changed
            }
            EventBody::SubmissionRejected(e) => {
                if let Some(why) = self.has_verdict(&e.workflow_id) {
                    return Applied::Ignored(why);
                }
                let rejection = Rejection { workflow_id: e.workflow_id.clone(), errors: e.errors.clone() };
                self.rejected.insert(e.workflow_id.clone(), rejection);
                self.ended_at(&e.workflow_id, &event.time);
                Applied::Changed
            }
            EventBody::TaskPending(e) => self.update_task(&e.task, |t| {
                if !matches!(t.status, TaskStatus::Waiting | TaskStatus::Pending) {
                    return Applied::Ignored("task is not waiting");
                }
                t.status = TaskStatus::Pending;
                t.pending_message = Some(e.message.clone());
                t.pending_events += 1;
                t.unplaceable_since_ms = e.unplaceable_since_ms;
                Applied::Changed
            }),
            EventBody::TaskDispatched(e) => self.update_task(&e.task, |t| {
                if !matches!(t.status, TaskStatus::Waiting | TaskStatus::Pending) {
                    return Applied::Ignored("task is not waiting");
                }
                t.status = TaskStatus::Dispatched;
                t.worker_id = Some(e.worker_id.clone());
                Applied::Changed
            }),
            EventBody::TaskMerged(e) => {
                let applied = self.update_task(&e.task, |t| {
                    if !matches!(t.status, TaskStatus::Waiting | TaskStatus::Pending) {
                        return Applied::Ignored("task is not waiting");
                    }
                    t.status = TaskStatus::Merged;
                    t.merged_into = Some(e.into.clone());
                    t.pending_message = None;
                    t.unplaceable_since_ms = None;
                    Applied::Changed
                });
                if applied == Applied::Changed
                    && let Some(merging) = self.merging.as_mut()
                {
                    merging.insert(e.task.workflow_id.clone());
                }
                applied
            }
            EventBody::TaskCompleted(e) => self.complete(&e.task, &e.worker_id, || Outcome {
                result: e.result.clone(),
                result_object: e.result_object.clone(),
                artifacts: e.artifacts.clone(),
            }),
            EventBody::TaskStarted(e) => self.update_report(&e.task, Some(&e.worker_id), |t| {
                if t.status != TaskStatus::Dispatched {
                    return Applied::Ignored("task was not dispatched");
                }
                t.status = TaskStatus::Running;
                t.worker_id = Some(e.worker_id.clone());
                Applied::Changed
            }),
            EventBody::TaskUpdated(e) => self.update_report(&e.task, Some(&e.worker_id), |t| {
                t.updates += 1;
                if let Some(progress) = e.data.as_ref().and_then(|d| d.get("progress")) {
                    t.progress = Some(progress.clone());
                }
                Applied::Changed
            }),
            EventBody::TaskFailed(e) => self.update_report(&e.task, e.worker_id.as_deref(), |t| {
                if e.reason == FailureReason::Released
                    && t.status == TaskStatus::Dispatched
                    && t.unrun_attempts < UNRUN_AT_MOST
                {
                    // Given back from the worker's queue before it ran: placed again, not an
                    // attempt spent, not the worker's failure (a cancel asked meanwhile is
                    // decided on the new attempt, before any dispatch).
                    t.unrun_attempts += 1;
                    t.status = TaskStatus::Retrying;
                    t.reason = Some(e.reason.to_string());
                    t.message = Some(e.message.clone());
                    return Applied::Changed;
                }
                let retry = e.retryable && t.counted_attempts() < t.def.max_attempts && !t.cancel_requested;
                t.status = if retry { TaskStatus::Retrying } else { TaskStatus::Failed };
                if let Some(worker) = &e.worker_id {
                    t.failed_on.insert(worker.clone());
                }
                t.reason = Some(e.reason.to_string());
                t.message = Some(e.message.clone());
                Applied::Changed
            }),
            EventBody::TaskRequeued(e) => {
                // The requeue names the new attempt; it applies to the one before it.
                let previous = TaskRef { attempt: e.task.attempt.saturating_sub(1), ..e.task.clone() };
                self.update_task(&previous, |t| {
                    if e.reason == REQUEUED_UNRUN {
                        // Not the worker's failure, and not an attempt spent.
                        t.unrun_attempts += 1;
                    } else if let Some(worker) = &e.worker_id {
                        t.failed_on.insert(worker.clone());
                    }
                    t.attempt = e.task.attempt;
                    t.status = TaskStatus::Waiting;
                    t.worker_id = None;
                    t.merged_into = None;
                    t.pending_message = None;
                    t.unplaceable_since_ms = None;
                    t.updates = 0;
                    t.progress = None;
                    t.reason = Some(e.reason.clone());
                    Applied::Changed
                })
            }
            EventBody::TaskSkipped(e) => self.update_task(&e.task, |t| {
                t.status = TaskStatus::Skipped;
                t.reason = Some(e.reason.clone());
                Applied::Changed
            }),
            EventBody::TaskCancelRequested(e) => {
                let Some(wf) = self.workflows.get_mut(&e.workflow_id).map(Arc::make_mut) else {
                    return Applied::Ignored("unknown workflow");
                };
                wf.cancel_requests += 1;
                match &e.task_id {
                    None => {
                        wf.cancel_requested = true;
                        wf.tasks.iter_mut().for_each(|t| t.cancel_requested = true);
                    }
                    Some(id) => match wf.tasks.iter_mut().find(|t| &t.def.task_id == id) {
                        Some(t) => t.cancel_requested = true,
                        None => return Applied::Ignored("unknown task"),
                    },
                }
                Applied::Changed
            }
            EventBody::TaskCancelled(e) => self.update_report(&e.task, e.worker_id.as_deref(), |t| {
                t.status = TaskStatus::Cancelled;
                t.reason = Some(e.reason.clone());
                Applied::Changed
            }),
            EventBody::WorkflowCompleted(e) => self.end_workflow(e, WorkflowStatus::Completed, &event.time),
            EventBody::WorkflowFailed(e) => self.end_workflow(e, WorkflowStatus::Failed, &event.time),
            EventBody::WorkflowCancelled(e) => self.end_workflow(e, WorkflowStatus::Cancelled, &event.time),
            EventBody::WorkerJoined(e) => {
                self.joined_workers.insert(e.worker_id.clone(), e.started_at.clone());
                Applied::Changed
            }
            EventBody::WorkerLost(e) => {
                self.lost_workers.insert(e.worker_id.clone(), e.started_at.clone());
                Applied::Changed
            }
            EventBody::WorkerCordoned(e) => {
                self.cordon_events += 1;
                self.cordoned.insert(e.worker_id.clone());
                Applied::Changed
            }
            EventBody::WorkerUncordoned(e) => {
                self.cordon_events += 1;
                self.cordoned.remove(&e.worker_id);
                self.draining.remove(&e.worker_id);
                Applied::Changed
            }
            // A hint to a worker; what it then holds warm is in its snapshot.
            EventBody::WorkerPrewarmRequested(e) => {
                self.prewarm_requested.insert(e.model.clone());
                Applied::Changed
            }
            EventBody::WorkerDrainRequested(e) => {
                self.cordon_events += 1;
                self.draining.insert(e.worker_id.clone());
                Applied::Changed
            }
            EventBody::WorkflowsPurged(e) => {
                self.removing = e.removing.clone();
                self.purge(&e.workflows)
            }
        }
    }

    /// Takes in a `workflows.purged`: what it lists is gone from the log, so the fold drops it
    /// too, even a workflow it holds as running (this reader took the first part of its events
    /// before the purge removed the rest), and ignores whatever of it still comes.
    fn purge(&mut self, workflows: &crate::ids::WorkflowIds) -> Applied {
        let held: Vec<String> =
            self.workflows.keys().chain(self.rejected.keys()).filter(|id| workflows.contains(id)).cloned().collect();
        for id in &held {
            self.rejected.remove(id);
            self.drop_workflow(id);
        }
        self.ended.retain(|id| !workflows.contains(id));
        self.unpurged.retain(|_, ended| {
            ended.ids.remove_all(workflows);
            !ended.ids.is_empty()
        });
        self.forgotten.extend(workflows);
        self.purged.extend(workflows);
        Applied::Changed
    }

    /// Notes when a workflow (or a rejection) ended, for retention: its end event's time, on
    /// its writer's clock (an unreadable one counts as long ago).
    fn ended_at(&mut self, workflow_id: &str, time: &str) {
        let ms = crate::trace::unix_ms(time).unwrap_or(0);
        let ended = self.unpurged.entry(ms / 60_000).or_default();
        ended.last_ms = ended.last_ms.max(ms);
        ended.ids.insert(workflow_id);
    }

    /// Moves an ended workflow's noted end to `time` when that is later: it is then purged no
    /// sooner than what ended at `time`. One not noted (still running, or purged) is left alone.
    fn ended_again(&mut self, workflow_id: &str, time: &str) {
        let ms = crate::trace::unix_ms(time).unwrap_or(0);
        let Some((&minute, ended)) = self.unpurged.iter_mut().find(|(_, ended)| ended.ids.contains(workflow_id)) else {
            return;
        };
        if minute >= ms / 60_000 {
            return;
        }
        let mut one = crate::ids::WorkflowIds::default();
        one.insert(workflow_id);
        ended.ids.remove_all(&one);
        if ended.ids.is_empty() {
            self.unpurged.remove(&minute);
        }
        self.ended_at(workflow_id, time);
    }

    /// Up to `limit` workflows whose events may be purged now: ended (or rejected) in a minute
    /// whose last end lies before `ended_before_ms`, already dropped from the fold
    /// (`forget_ended`), and holding no execution that a task of a running workflow took its
    /// result from (a fold believes that result only with the shared execution's workflow in
    /// view).
    pub fn due_for_purge(&self, ended_before_ms: u64, limit: usize) -> Vec<String> {
        if self.unpurged.values().next().is_none_or(|ended| ended.last_ms >= ended_before_ms) {
            return Vec::new();
        }
        let sharing: BTreeSet<&str> = self
            .running_with_merges()
            .flat_map(|wf| wf.tasks.iter())
            .filter_map(|t| crate::ids::workflow_of_task(t.merged_into.as_deref()?))
            .collect();
        let held = |id: &str| self.workflows.contains_key(id) || self.rejected.contains_key(id) || sharing.contains(id);
        self.unpurged
            .values()
            .take_while(|ended| ended.last_ms < ended_before_ms)
            .flat_map(|ended| ended.ids.iter())
            .filter(|id| !held(id))
            .take(limit)
            .collect()
    }

    /// Every workflow purged so far: what the next `workflows.purged` adds its batch to.
    pub fn purged(&self) -> &crate::ids::WorkflowIds {
        &self.purged
    }

    /// The workflows the latest purge record's round removes (`WorkflowsPurged::removing`).
    pub fn removing(&self) -> &crate::ids::WorkflowIds {
        &self.removing
    }

    fn insert_workflow(&mut self, workflow: Workflow, seq: u64, time: &str) {
        let Workflow { workflow_id, name, owner, tasks } = workflow;
        let tasks: Vec<TaskState> = tasks
            .into_iter()
            .map(|def| TaskState {
                def,
                status: TaskStatus::Waiting,
                attempt: 1,
                worker_id: None,
                result: None,
                result_object: None,
                artifacts: Vec::new(),
                failed_on: BTreeSet::new(),
                pending_message: None,
                pending_events: 0,
                unplaceable_since_ms: None,
                reason: None,
                message: None,
                updates: 0,
                progress: None,
                cancel_requested: false,
                merged_into: None,
                unrun_attempts: 0,
            })
            .collect();
        for (i, t) in tasks.iter().enumerate() {
            self.task_index.insert(t.def.task_id.clone(), (workflow_id.clone(), i));
        }
        self.running.insert(seq, workflow_id.clone());
        self.workflows.insert(
            workflow_id.clone(),
            Arc::new(WorkflowState {
                workflow_id,
                seq,
                name,
                owner,
                submitted_at: time.to_owned(),
                status: WorkflowStatus::Running,
                tasks,
                cancel_requested: false,
                cancel_requests: 0,
                reason: None,
            }),
        );
    }

    /// Whether `task_id` is merged into a leader that completed on `worker`.
    fn completes_through_leader(&self, task_id: &str, worker: &str) -> bool {
        self.task(task_id)
            .filter(|t| t.status == TaskStatus::Merged)
            .and_then(|t| t.merged_into.as_deref())
            .and_then(|leader| self.task(leader))
            .is_some_and(|l| l.status == TaskStatus::Completed && l.worker_id.as_deref() == Some(worker))
    }

    /// A task's completion by `worker`, leaving `outcome` in the task: a report of the worker that
    /// holds the task, or a merged task's end with its leader's result, reported by the router in
    /// the name of the worker that ran the leader (it counts only while that leader did complete
    /// there).
    fn complete(&mut self, task: &TaskRef, worker: &str, outcome: impl FnOnce() -> Outcome) -> Applied {
        let set = |t: &mut TaskState| {
            let Outcome { result, result_object, artifacts } = outcome();
            t.status = TaskStatus::Completed;
            t.result = result;
            t.result_object = result_object;
            t.artifacts = artifacts;
            Applied::Changed
        };
        if self.completes_through_leader(&task.task_id, worker) {
            return self.update_task(task, |t| {
                t.worker_id = Some(worker.to_owned());
                set(t)
            });
        }
        // The task's worker is already `worker`: `update_report` checked it.
        self.update_report(task, Some(worker), set)
    }

    /// Applies `change` when the event is about the task's current attempt and the task has not
    /// ended; every other report is late or duplicate and is ignored.
    fn update_task(&mut self, task: &TaskRef, change: impl FnOnce(&mut TaskState) -> Applied) -> Applied {
        let Some(t) = self.task_mut(task) else {
            return Applied::Ignored("unknown task");
        };
        if t.status.is_terminal() {
            return Applied::Ignored("task already ended");
        }
        if t.attempt != task.attempt {
            return Applied::Ignored("event for a superseded attempt");
        }
        change(t)
    }

    /// `update_task` for an event that may name a worker: one that names a worker is a report
    /// about running work, and counts only from the worker the task's attempt was dispatched to.
    fn update_report(
        &mut self,
        task: &TaskRef,
        worker: Option<&str>,
        change: impl FnOnce(&mut TaskState) -> Applied,
    ) -> Applied {
        self.update_task(task, |t| match worker {
            Some(w) if t.worker_id.as_deref() != Some(w) => {
                Applied::Ignored("report from a worker that does not hold the task")
            }
            _ => change(t),
        })
    }

    fn end_workflow(&mut self, e: &crate::event::WorkflowEnded, status: WorkflowStatus, time: &str) -> Applied {
        let Some(wf) = self.workflows.get_mut(&e.workflow_id).map(Arc::make_mut) else {
            return Applied::Ignored("unknown workflow");
        };
        if wf.status != WorkflowStatus::Running {
            return Applied::Ignored("workflow already ended");
        }
        wf.status = status;
        wf.reason = e.reason.clone();
        self.running.remove(&wf.seq);
        // Workflows whose executions its merged tasks took their results from: their files
        // are this workflow's results too, so they stay as long as its events do.
        let lenders: BTreeSet<String> = wf
            .tasks
            .iter()
            .filter_map(|t| crate::ids::workflow_of_task(t.merged_into.as_deref()?))
            .filter(|lender| *lender != e.workflow_id)
            .map(str::to_owned)
            .collect();
        self.ended.push(e.workflow_id.clone());
        self.ended_at(&e.workflow_id, time);
        for lender in &lenders {
            self.ended_again(lender, time);
        }
        Applied::Changed
    }

    /// Drops the workflows that ended since the last call, and every rejection, keeping only
    /// their ids (as ranges, [`crate::ids::WorkflowIds`]): a second verdict for one is still
    /// ignored, and a late report about one of its tasks is ignored as about an unknown task, as
    /// it was about an ended one. A long-running router so holds what runs, not its history (the
    /// views read the log), and a flood of rejected submissions costs it nothing to keep. A
    /// workflow whose task is the shared execution of a merged task still waiting for its result
    /// stays until a later call. Returns how many were dropped.
    pub fn forget_ended(&mut self) -> usize {
        self.forget_ended_into(&mut Vec::new())
    }

    /// [`State::forget_ended`], moving the workflows it drops into `dropped` instead of freeing
    /// them, so that the caller frees them where it holds nothing up: freeing a whole workflow
    /// (its spec, results and strings) costs several microseconds, and a router forgets what
    /// ended in the last 50 ms at once (100 at 2,000 workflows/s).
    pub fn forget_ended_into(&mut self, dropped: &mut Vec<Arc<WorkflowState>>) -> usize {
        if self.merging.is_none() {
            let merging = self.running_with_merges().map(|wf| wf.workflow_id.clone()).collect();
            self.merging = Some(merging);
        }
        let rejected = std::mem::take(&mut self.rejected);
        for id in rejected.keys() {
            self.forgotten.insert(id);
        }
        if self.ended.is_empty() {
            return rejected.len();
        }
        let sharing: BTreeSet<String> = self
            .running_with_merges()
            .flat_map(|wf| wf.tasks.iter())
            .filter(|t| t.status == TaskStatus::Merged)
            .filter_map(|t| self.task_index.get(t.merged_into.as_deref()?))
            .map(|(wf, _)| wf.clone())
            .collect();
        let (keep, drop): (Vec<String>, Vec<String>) =
            std::mem::take(&mut self.ended).into_iter().partition(|id| sharing.contains(id));
        self.ended = keep;
        for id in &drop {
            dropped.extend(self.drop_workflow(id));
            self.forgotten.insert(id);
        }
        rejected.len() + drop.len()
    }

    /// The running workflows that had a task merged into another's execution: those `merging`
    /// lists, or, before the fold has built it (its first `forget_ended`), a walk of everything
    /// running for them.
    fn running_with_merges(&self) -> impl Iterator<Item = &WorkflowState> {
        let listed = self.merging.iter().flatten().filter_map(|id| self.workflow(id));
        let walked = self.merging.is_none().then(|| self.running_workflows_unordered()).into_iter().flatten();
        listed
            .chain(walked)
            .filter(|wf| wf.status == WorkflowStatus::Running)
            .filter(|wf| wf.tasks.iter().any(|t| t.merged_into.is_some()))
    }

    /// Takes a workflow out of the fold: its entry, its place among the running, its tasks.
    fn drop_workflow(&mut self, workflow_id: &str) -> Option<Arc<WorkflowState>> {
        let wf = self.workflows.remove(workflow_id)?;
        if let Some(merging) = self.merging.as_mut() {
            merging.remove(workflow_id);
        }
        self.running.remove(&wf.seq);
        for t in &wf.tasks {
            self.task_index.remove(&t.def.task_id);
        }
        Some(wf)
    }

    /// Drops what the fold remembers of a worker's incarnations (joined, lost). The router calls
    /// it for a worker gone for good that holds nothing, so that a fleet which scales with fresh
    /// ids does not grow the fold for ever; the worker, if it comes back, joins anew.
    pub fn forget_worker(&mut self, worker_id: &str) {
        self.joined_workers.remove(worker_id);
        self.lost_workers.remove(worker_id);
    }

    /// The workers that hold (or are about to hold) a task of a running workflow.
    pub fn workers_holding_tasks(&self) -> BTreeSet<&str> {
        self.running_workflows_unordered()
            .flat_map(|wf| wf.tasks.iter())
            .filter(|t| t.status.is_on_worker())
            .filter_map(|t| t.worker_id.as_deref())
            .collect()
    }

    /// Every workflow with a verdict so far, accepted or rejected, held or forgotten.
    pub fn decided_workflows(&self) -> usize {
        self.workflows.len() + self.rejected.len() + self.forgotten.len()
    }
}

/// Placeholder resolution against one workflow's completed tasks.
pub struct WorkflowUpstream<'a>(pub &'a WorkflowState);

impl Upstream for WorkflowUpstream<'_> {
    fn task_id(&self, stage: &str) -> Option<String> {
        self.0.task(stage).map(|t| t.def.task_id.clone())
    }
    fn result(&self, stage: &str) -> Option<&Value> {
        self.0.task(stage).filter(|t| t.status == TaskStatus::Completed).and_then(|t| t.result.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names_are_their_serde_names() {
        use TaskStatus as T;
        for status in [
            T::Waiting,
            T::Pending,
            T::Dispatched,
            T::Running,
            T::Retrying,
            T::Merged,
            T::Completed,
            T::Failed,
            T::Skipped,
            T::Cancelled,
        ] {
            assert_eq!(serde_json::to_value(status).unwrap(), status.as_str(), "{status:?}");
        }
        use WorkflowStatus as W;
        for status in [W::Running, W::Completed, W::Failed, W::Cancelled] {
            assert_eq!(serde_json::to_value(status).unwrap(), status.as_str(), "{status:?}");
        }
    }
}
