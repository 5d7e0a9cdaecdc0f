//! The router's decisions: given the fold and the live fleet, what happens next.
//!
//! Pure: the router shell publishes the actions and feeds the resulting events back through
//! `State::apply` before it asks again.

use crate::echo;
use crate::event::{
    EventBody, FLEET_SCOPE, FailureReason, NO_SCOPE, TaskCancelled, TaskCompleted, TaskDispatched, TaskFailed,
    TaskMerged, TaskPending, TaskRef, TaskRequeued, TaskSkipped, WorkflowEnded,
};
use crate::fleet::{WorkerSnapshot, uses_service_slot};
use crate::placement::{self, FleetIndex, Placement, Request, Strategy};
use crate::state::{State, TaskState, TaskStatus, WorkflowState, WorkflowStatus, WorkflowUpstream};
use crate::template::{self, lookup};
use crate::validate::validate_dispatchable;
use crate::work::WorkOrder;
use crate::workflow::condition_text;
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config {
    /// How long a task may find no capable worker before it fails (`TASK_NO_WORKER_GRACE_SEC`).
    pub no_worker_grace_ms: u64,
    pub strategy: Strategy,
    /// How long an order may wait in a worker's queue, unstarted, while another worker could
    /// run it, before it is asked back (`Releases`).
    pub queue_patience_ms: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config { no_worker_grace_ms: 60_000, strategy: Strategy::BestFit, queue_patience_ms: QUEUE_PATIENCE_MS }
    }
}

/// `Config::queue_patience_ms` by default: far longer than an order of short tasks waits in a
/// queue, short beside a long task.
pub const QUEUE_PATIENCE_MS: u64 = 5_000;

/// What the router should do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Publish this event.
    Publish(EventBody),
    /// Publish `task.dispatched`, then the work order to the worker.
    Dispatch { event: TaskDispatched, order: WorkOrder },
    /// Tell whoever watches why a task waits for a slot on a busy fleet, without storing it
    /// (core NATS, `flowmesh.hints.<workflow>.<task>`): waiting for a slot changes nothing in the
    /// fold, so it is no event. Sent again only when the explanation changes.
    Hint(TaskPending),
}

fn task_ref(workflow_id: &str, t: &TaskState) -> TaskRef {
    TaskRef {
        workflow_id: workflow_id.to_owned(),
        task_id: t.def.task_id.clone(),
        stage: t.def.stage.clone(),
        attempt: t.attempt,
    }
}

/// What a router carries from one round to the next, so a round looks only at what may have
/// changed: the workflows an event touched (`touch`), the workflows following another's
/// execution (merged tasks), and, while a slot is free, the waiting tasks oldest first. A round
/// walks every running workflow when asked (`touch_all`: the router's tick, an event about the
/// fleet, a new `Requests`) or when the live fleet differs from the last round's.
///
/// It also keeps the placement request of each waiting task attempt whose upstream stages have
/// ended: its resolved spec can no longer change, so later rounds neither resolve nor re-check it.
/// Entries of tasks that stopped waiting are dropped when their workflow is next looked at.
#[derive(Debug)]
pub struct Requests {
    /// By task id (looked up without allocating), for its current attempt.
    tasks: HashMap<String, Remembered>,
    /// This round's number: an entry of a workflow looked at this round and not stamped with it
    /// is dropped.
    round: u64,
    /// Ids of the workflows an event changed since the last round.
    touched: HashSet<String>,
    /// The next round walks every running workflow.
    whole: bool,
    /// The live fleet's `FleetIndex::signature` in the last round.
    fleet: Option<u64>,
    /// By submission sequence: the tasks of each running workflow that hold a worker's slot.
    on_worker: BTreeMap<u64, Vec<Occupant>>,
    /// The part of `on_worker` with an inference execution that identical requests would follow.
    with_merge: BTreeSet<u64>,
    /// Slots in use by worker id (batch, service): `on_worker` counted, kept as it changes.
    usage: HashMap<String, (u32, u32)>,
    /// Workers whose count in `usage` changed since the last round, or on which the last round
    /// placed a task (the index counted that slot itself): the next round sets theirs.
    usage_changed: HashSet<String>,
    /// Submission sequences of running workflows with a merged task: their leader is another
    /// workflow's, so every round looks at them.
    merged: BTreeSet<u64>,
    /// Submission sequences of running workflows with a remembered waiting task.
    backlog: BTreeSet<u64>,
    /// The part of the backlog with a task that identical inference requests would merge into
    /// (by submission sequence, their merge keys), and the same by key. An older one leads the
    /// younger ones even in a round that does not look at it, and a younger one that a round
    /// finds led by another is looked at in that round.
    leading: BTreeMap<u64, Vec<String>>,
    by_key: HashMap<String, BTreeSet<u64>>,
    /// Whether the backlog may hold a task for a batch slot, and for a service slot: it is
    /// looked at only while a slot of such a kind is free. Set when such a task is remembered,
    /// cleared only by a whole round (so never wrongly clear).
    waits_for: Kinds,
}

/// Slot kinds: (batch, service).
#[derive(Debug, Default, Clone, Copy)]
struct Kinds {
    batch: bool,
    service: bool,
}

impl Kinds {
    fn add(&mut self, task_type: &str) {
        if uses_service_slot(task_type) { self.service = true } else { self.batch = true }
    }
}

impl Default for Requests {
    fn default() -> Self {
        Requests {
            tasks: HashMap::new(),
            round: 0,
            touched: HashSet::new(),
            whole: true,
            fleet: None,
            on_worker: BTreeMap::new(),
            with_merge: BTreeSet::new(),
            usage: HashMap::new(),
            usage_changed: HashSet::new(),
            merged: BTreeSet::new(),
            backlog: BTreeSet::new(),
            leading: BTreeMap::new(),
            by_key: HashMap::new(),
            waits_for: Kinds::default(),
        }
    }
}

/// What is remembered of one waiting task attempt.
#[derive(Debug)]
struct Remembered {
    attempt: u32,
    /// Its workflow's submission sequence.
    seq: u64,
    request: Request,
    /// Its `merge_key`: identical inference requests submitted later follow it.
    merge: Option<String>,
    /// The last busy explanation hinted, and the fleet it was given for (`FleetIndex::signature`).
    hinted: Option<Hinted>,
    /// The last round the task was waiting in.
    round: u64,
}

#[derive(Debug, Clone, PartialEq)]
struct Hinted {
    message: String,
    fleet: u64,
}

/// A task holding a worker's slot.
#[derive(Debug)]
struct Occupant {
    task_id: String,
    worker: String,
    service: bool,
    /// Its `merge_key`: identical inference requests follow it while it runs.
    merge: Option<String>,
}

impl Requests {
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Notes a folded event: the next round looks at its workflow, or at every workflow when
    /// the event is about the fleet.
    pub fn touch(&mut self, event: &EventBody) {
        if self.whole {
            // The next round looks at everything anyway (and a standby router, which never
            // decides, keeps no growing set).
            return;
        }
        let (workflow, _) = event.scope();
        if workflow == FLEET_SCOPE {
            self.whole = true;
        } else if workflow != NO_SCOPE && !self.touched.contains(workflow) {
            self.touched.insert(workflow.to_owned());
        }
    }

    /// Whether the next round walks every running workflow.
    pub fn is_whole(&self) -> bool {
        self.whole
    }

    /// The next round walks every running workflow (time-based rules: grace periods).
    pub fn touch_all(&mut self) {
        self.whole = true;
        self.touched.clear();
    }

    /// Lets go of what it holds for workflows the fold dropped (`State::forget_ended_into`):
    /// they ended, so they hold no slot. A round looks only at touched workflows still in the
    /// fold, so one that ended and was dropped before the next round would otherwise keep its
    /// slots counted until a whole round (up to half a second at least), and its worker would
    /// look busier than it is.
    pub fn forgotten(&mut self, dropped: &[std::sync::Arc<WorkflowState>]) {
        for wf in dropped {
            self.refresh(wf);
        }
    }

    /// Brings what holds a slot up to date: for every running workflow, or for the `touched`
    /// ones. Only a running workflow can have a task on a worker (it ends when all its tasks have).
    fn refresh_slots(&mut self, state: &State, touched: Option<&HashSet<String>>) {
        match touched {
            None => {
                self.on_worker.clear();
                self.with_merge.clear();
                self.usage.clear();
                self.merged.clear();
                for wf in state.running_workflows_unordered() {
                    self.refresh(wf);
                }
            }
            Some(touched) => {
                for wf in touched.iter().filter_map(|id| state.workflows.get(id)) {
                    self.refresh(wf);
                }
            }
        }
    }

    /// The inference executions under way, which lead the identical requests that arrive while
    /// they run (oldest submission first).
    fn leaders(&self) -> HashMap<String, String> {
        let mut leaders = HashMap::new();
        for seq in &self.with_merge {
            for occupant in &self.on_worker[seq] {
                if let Some(key) = &occupant.merge {
                    leaders.entry(key.clone()).or_insert_with(|| occupant.task_id.clone());
                }
            }
        }
        leaders
    }

    /// Counts the slots `occupants` hold in `usage` (`add`), or stops counting them.
    fn count(&mut self, occupants: &[Occupant], add: bool) {
        for occupant in occupants {
            let worker = occupant.worker.as_str();
            // Looked up by `&str` first: a worker's id is copied only when it enters a map.
            let entry = match self.usage.get_mut(worker) {
                Some(entry) => entry,
                None => self.usage.entry(worker.to_owned()).or_default(),
            };
            let n = if occupant.service { &mut entry.1 } else { &mut entry.0 };
            *n = if add { *n + 1 } else { n.saturating_sub(1) };
            if *entry == (0, 0) {
                self.usage.remove(worker);
            }
            if !self.usage_changed.contains(worker) {
                self.usage_changed.insert(worker.to_owned());
            }
        }
    }

    /// Sets the index's slots in use: every worker's (`all`), or those whose count changed.
    fn sync_usage(&mut self, index: &mut FleetIndex, all: bool) {
        if all {
            index.set_all_usage(|id| self.usage.get(id).copied().unwrap_or_default());
            self.usage_changed.clear();
        } else {
            for id in self.usage_changed.drain() {
                let (batch, service) = self.usage.get(&id).copied().unwrap_or_default();
                index.set_usage(&id, batch, service);
            }
        }
    }

    /// After a round that looked at everything: drops what it remembered of tasks that stopped
    /// waiting and rebuilds the backlog from the rest.
    fn rebuild_backlog(&mut self) {
        let round = self.round;
        self.tasks.retain(|_, remembered| remembered.round == round);
        self.backlog = self.tasks.values().map(|r| r.seq).collect();
        self.leading.clear();
        self.by_key.clear();
        self.waits_for = Kinds::default();
        let mut leading: BTreeMap<u64, Vec<String>> = BTreeMap::new();
        for r in self.tasks.values() {
            self.waits_for.add(&r.request.task_type);
            if let Some(key) = &r.merge {
                leading.entry(r.seq).or_default().push(key.clone());
            }
        }
        for (seq, keys) in leading {
            self.set_leading(seq, keys);
        }
    }

    /// Brings `on_worker` and `merged` up to date for one workflow, and forgets what was kept for
    /// one that ended.
    fn refresh(&mut self, wf: &WorkflowState) {
        let (seq, running) = (wf.seq, wf.status == WorkflowStatus::Running);
        let occupants: Vec<Occupant> = if running {
            wf.tasks
                .iter()
                .filter(|t| t.status.is_on_worker())
                .filter_map(|t| {
                    Some(Occupant {
                        task_id: t.def.task_id.clone(),
                        worker: t.worker_id.clone()?,
                        service: uses_service_slot(&t.def.task_type),
                        merge: merge_key(wf, t),
                    })
                })
                .collect()
        } else {
            Vec::new()
        };
        if let Some(old) = self.on_worker.remove(&seq) {
            self.count(&old, false);
        }
        self.count(&occupants, true);
        if occupants.iter().any(|o| o.merge.is_some()) {
            self.with_merge.insert(seq);
        } else {
            self.with_merge.remove(&seq);
        }
        if !occupants.is_empty() {
            self.on_worker.insert(seq, occupants);
        }
        if running && wf.tasks.iter().any(|t| t.status == TaskStatus::Merged) {
            self.merged.insert(seq);
        } else {
            self.merged.remove(&seq);
        }
        if !running {
            self.backlog.remove(&seq);
            self.set_leading(seq, Vec::new());
            for t in &wf.tasks {
                self.tasks.remove(t.def.task_id.as_str());
            }
        }
    }

    /// After a round looked at `wf`: drops what it remembered of tasks that stopped waiting, and
    /// keeps the workflow in the backlog while one still waits.
    fn settle(&mut self, wf: &WorkflowState) {
        let round = self.round;
        let mut waiting = false;
        for t in &wf.tasks {
            match self.tasks.get(t.def.task_id.as_str()) {
                Some(r) if r.round == round => waiting = true,
                Some(_) => {
                    self.tasks.remove(t.def.task_id.as_str());
                }
                None => {}
            }
        }
        if waiting {
            self.backlog.insert(wf.seq);
        } else {
            self.backlog.remove(&wf.seq);
        }
        let keys = self.merge_keys(wf).map(|(key, _)| key.clone()).collect();
        self.set_leading(wf.seq, keys);
    }

    fn set_leading(&mut self, seq: u64, keys: Vec<String>) {
        for key in self.leading.remove(&seq).unwrap_or_default() {
            if let Some(seqs) = self.by_key.get_mut(&key) {
                seqs.remove(&seq);
                if seqs.is_empty() {
                    self.by_key.remove(&key);
                }
            }
        }
        for key in &keys {
            self.by_key.entry(key.clone()).or_default().insert(seq);
        }
        if !keys.is_empty() {
            self.leading.insert(seq, keys);
        }
    }

    /// The merge keys of `wf`'s waiting tasks whose request is remembered, with their task ids.
    fn merge_keys<'w>(&'w self, wf: &'w WorkflowState) -> impl Iterator<Item = (&'w String, &'w String)> {
        wf.tasks.iter().filter(|t| matches!(t.status, TaskStatus::Waiting | TaskStatus::Pending)).filter_map(|t| {
            let remembered = self.tasks.get(t.def.task_id.as_str()).filter(|r| r.attempt == t.attempt)?;
            Some((remembered.merge.as_ref()?, &t.def.task_id))
        })
    }

    /// Adds to `leaders` the waiting tasks of `wf` that lead identical requests (see `leading`).
    fn lead(&self, wf: &WorkflowState, leaders: &mut HashMap<String, String>) {
        if wf.cancel_requested {
            return;
        }
        for (key, task_id) in self.merge_keys(wf) {
            leaders.entry(key.clone()).or_insert_with(|| task_id.clone());
        }
    }
}

/// Decides the next actions. `fleet` holds the live workers only; `now_ms` is unix ms.
pub fn decide(state: &State, fleet: &[WorkerSnapshot], now_ms: u64, config: &Config) -> Vec<Action> {
    decide_with(state, &mut FleetIndex::of(fleet), now_ms, config, &mut Requests::default())
}

/// `decide`, remembering between rounds in `requests` what a router remembers (see `Requests`):
/// a round decides what a walk of every running workflow would, looking only where something
/// may have changed. Every event folded into `state` since the last round must have been
/// `touch`ed. `fleet` is the live fleet, kept by the caller from round to round (a worker `put`
/// as its snapshots arrive, `remove`d once it is not live): the round sets its slots in use and
/// cordons itself, and otherwise costs nothing per worker.
pub fn decide_with(
    state: &State,
    fleet: &mut FleetIndex,
    now_ms: u64,
    config: &Config,
    requests: &mut Requests,
) -> Vec<Action> {
    requests.round += 1;
    let mut whole = std::mem::take(&mut requests.whole);
    let touched = std::mem::take(&mut requests.touched);
    requests.refresh_slots(state, (!whole).then_some(&touched));
    // Cordons and drains change only through events about the fleet, which make a whole round.
    // A rebuilt index may hold a worker new to it (or one that left and came back since the last
    // round, which leaves the signature as it was): it gets its cordon and slots in use here.
    let rebuilt = fleet.prepare();
    if rebuilt || whole {
        fleet.set_flags(&state.cordoned, &state.draining);
    }
    let signature = fleet.signature();
    // Another fleet can change what every waiting task may do, and lose a running task's worker.
    whole |= requests.fleet.replace(signature) != Some(signature);
    requests.sync_usage(fleet, whole || rebuilt);
    let mut leaders = requests.leaders();
    let round = Round { state, now_ms, config, fleet: signature };
    let mut walk = Walk { round: &round, index: fleet, leaders: &mut leaders, actions: Vec::new() };
    let visited = if whole { walk.everything(requests) } else { walk.changed(requests, &touched) };
    let mut actions = walk.actions;
    actions.extend(prewarm_hints(state, &visited, fleet));
    actions
}

/// One round's decisions as they are made, workflow by workflow.
struct Walk<'r, 'i> {
    round: &'r Round<'r>,
    index: &'i mut FleetIndex,
    /// Merge key → the task that leads identical inference requests.
    leaders: &'r mut HashMap<String, String>,
    actions: Vec<Action>,
}

impl<'r> Walk<'r, '_> {
    fn decide(&mut self, wf: &WorkflowState, requests: &mut Requests) {
        decide_workflow(wf, self.round, self.index, requests, self.leaders, &mut self.actions);
    }

    /// Every running workflow, oldest submission first; what is remembered is rebuilt from it.
    fn everything(&mut self, requests: &mut Requests) -> Vec<&'r WorkflowState> {
        let state = self.round.state;
        let visited: Vec<&WorkflowState> = state.running_workflows().collect();
        for wf in &visited {
            self.decide(wf, requests);
        }
        requests.rebuild_backlog();
        visited
    }

    /// The workflows something happened to (`touched`) and those with a merged task, in
    /// submission order with the backlog, which is looked at only while a slot it needs is free.
    fn changed(&mut self, requests: &mut Requests, touched: &HashSet<String>) -> Vec<&'r WorkflowState> {
        let state = self.round.state;
        let mut queue: BTreeSet<u64> = touched
            .iter()
            .filter_map(|id| state.workflows.get(id))
            .filter(|wf| wf.status == WorkflowStatus::Running)
            .map(|wf| wf.seq)
            .collect();
        queue.extend(requests.merged.iter().copied());
        let backlog = std::mem::take(&mut requests.backlog);
        let mut waiting = backlog.iter().copied().peekable();
        // A walk of everything would have made every older waiting task lead identical requests
        // by the time it reaches a workflow: those not looked at this round lead them too.
        let leading = std::mem::take(&mut requests.leading);
        let mut older_leaders = leading.keys().copied().peekable();
        let mut slot_free = true;
        let mut last = None;
        let mut visited = Vec::new();
        loop {
            let next_waiting = if slot_free { waiting.peek().copied() } else { None };
            let seq = match (queue.first().copied(), next_waiting) {
                (None, None) => break,
                (Some(q), Some(w)) if w < q => {
                    waiting.next();
                    w
                }
                (None, Some(w)) => {
                    waiting.next();
                    w
                }
                (Some(q), _) => {
                    queue.pop_first();
                    q
                }
            };
            if last.is_some_and(|last| seq <= last) {
                continue;
            }
            last = Some(seq);
            while let Some(older) = older_leaders.next_if(|&older| older <= seq) {
                // One looked at now registers as it is looked at, if it still leads.
                if let Some(wf) = state.running_workflow(older).filter(|_| older < seq) {
                    requests.lead(wf, self.leaders);
                }
            }
            let Some(wf) = state.running_workflow(seq) else { continue };
            self.decide(wf, requests);
            visited.push(wf);
            // Younger waiting requests identical to one of this workflow's would merge in a walk
            // of everything: they are looked at in this round too.
            for (key, _) in requests.merge_keys(wf) {
                if let Some(younger) = requests.by_key.get(key) {
                    queue.extend(younger.range(seq + 1..));
                }
            }
            let waits_for = requests.waits_for;
            slot_free = slot_free && !self.index.saturated(waits_for.batch, waits_for.service);
        }
        requests.backlog = backlog;
        requests.leading = leading;
        for wf in &visited {
            requests.settle(wf);
        }
        visited
    }
}

/// Hints the router sends ahead of a backlog: a stage that will need a model once its upstream
/// stages end, which no live worker holds warm, gets one idle worker that could run it asked to
/// load the model now (`worker.prewarm_requested`, once per model; the lowest id among idle
/// workers that pass every permanent rule).
fn prewarm_hints(state: &State, running: &[&WorkflowState], fleet: &FleetIndex) -> Vec<Action> {
    let mut asked: HashSet<String> = HashSet::new();
    let mut out = Vec::new();
    for wf in running {
        for t in wf.tasks.iter().filter(|t| t.status == TaskStatus::Waiting) {
            let upstream_running = t.def.depends_on.iter().any(|d| wf.task(d).is_some_and(|u| !u.status.is_terminal()));
            if !upstream_running {
                continue;
            }
            let Ok(request) = placement::request_for(&t.def.task_type, &t.def.spec, t.def.selected_workers.clone())
            else {
                continue;
            };
            let Some(model) = request.model.clone() else { continue };
            if state.prewarm_requested.contains(&model)
                || asked.contains(&model)
                || fleet.candidates().any(|c| c.snapshot.warm(&model).is_some())
            {
                continue;
            }
            let idle = fleet
                .candidates()
                .filter(|c| c.snapshot.status == crate::fleet::WorkerStatus::Idle && c.batch_in_use == 0)
                .filter(|c| placement::explain(&request, c).is_empty())
                .min_by(|a, b| a.snapshot.id.cmp(&b.snapshot.id));
            if let Some(c) = idle {
                asked.insert(model.clone());
                out.push(Action::Publish(EventBody::WorkerPrewarmRequested(crate::event::WorkerPrewarm {
                    worker_id: c.snapshot.id.clone(),
                    model,
                })));
            }
        }
    }
    out
}

/// What every decision of one round shares.
struct Round<'a> {
    state: &'a State,
    now_ms: u64,
    config: &'a Config,
    /// The fleet's `FleetIndex::signature` this round.
    fleet: u64,
}

/// Identical inference requests — same model, backend, generation parameters and inputs — share
/// one execution. The key is the resolved spec without what does not change the output (where it
/// may run, how often it may be retried, where results go); `None` for anything else.
fn merge_key(wf: &WorkflowState, t: &TaskState) -> Option<String> {
    if t.def.task_type != "inference" {
        return None;
    }
    merge_key_of(&t.def.task_type, resolve(wf, t).ok()?.spec.into_owned())
}

/// The merge key of a resolved spec (see `merge_key`); `None` for what is never merged.
pub fn merge_key_of(task_type: &str, mut spec: serde_json::Value) -> Option<String> {
    if task_type != "inference" || template::contains_placeholder(&spec) {
        return None;
    }
    let map = spec.as_object_mut()?;
    for key in ["output", "resources", "workerTags", "maxAttempts", "maxRuntimeSeconds", "dependsOn", "condition"] {
        map.remove(key);
    }
    serde_json::to_string(&spec).ok()
}

/// The tasks an identical inference request would be merged into now: merge key → the task
/// (on a worker, or waiting and ready) that leads it, oldest submission first. `flowmesh plan` asks.
pub fn merge_leaders(state: &State) -> HashMap<String, String> {
    let mut leaders = HashMap::new();
    for wf in state.running_workflows() {
        for t in &wf.tasks {
            let ready = || t.def.depends_on.iter().all(|d| wf.task(d).is_some_and(|u| u.status.is_terminal()));
            let candidate =
                t.status.is_on_worker() || (matches!(t.status, TaskStatus::Waiting | TaskStatus::Pending) && ready());
            if candidate && let Some(key) = merge_key(wf, t) {
                leaders.entry(key).or_insert_with(|| t.def.task_id.clone());
            }
        }
    }
    leaders
}

/// A merged task follows its leader: it completes with the leader's result, waits while the
/// leader runs, and goes back to waiting on its own when the leader ends without a result.
/// Cancelling it touches nobody else.
fn decide_merged(wf: &WorkflowState, t: &TaskState, tref: TaskRef, state: &State) -> Option<Action> {
    if wf.cancel_requested || t.cancel_requested {
        return Some(Action::Publish(EventBody::TaskCancelled(TaskCancelled {
            task: tref,
            worker_id: None,
            reason: "cancel requested while merged; the shared execution goes on for the others".to_owned(),
        })));
    }
    let leader = t.merged_into.as_deref().and_then(|id| state.task(id));
    match leader.map(|l| (l.status, l)) {
        Some((TaskStatus::Completed, l)) => Some(Action::Publish(EventBody::TaskCompleted(TaskCompleted {
            task: tref,
            worker_id: l.worker_id.clone().unwrap_or_default(),
            result: l.result.clone(),
            result_object: l.result_object.clone(),
            artifacts: l.artifacts.clone(),
            upload_ms: None,
            started_at: None,
        }))),
        Some((TaskStatus::Failed | TaskStatus::Cancelled | TaskStatus::Skipped, _)) | None => {
            let reason =
                format!("the execution it shared ({}) ended without a result", t.merged_into.as_deref().unwrap_or("?"));
            Some(Action::Publish(EventBody::TaskRequeued(TaskRequeued {
                task: TaskRef { attempt: t.attempt + 1, ..tref },
                reason,
                worker_id: None,
            })))
        }
        Some(_) => None,
    }
}

fn decide_workflow(
    wf: &WorkflowState,
    round: &Round<'_>,
    index: &mut FleetIndex,
    requests: &mut Requests,
    leaders: &mut HashMap<String, String>,
    actions: &mut Vec<Action>,
) {
    let ends_before = actions.len();
    for t in &wf.tasks {
        // Built only for an action: a backlog's waiting tasks mostly produce none.
        let tref = || task_ref(&wf.workflow_id, t);
        match t.status {
            TaskStatus::Completed | TaskStatus::Failed | TaskStatus::Skipped | TaskStatus::Cancelled => {}
            TaskStatus::Retrying => {
                actions.push(Action::Publish(EventBody::TaskRequeued(TaskRequeued {
                    task: TaskRef { attempt: t.attempt + 1, ..tref() },
                    reason: t.reason.clone().unwrap_or_else(|| "retry".to_owned()),
                    worker_id: None,
                })));
            }
            TaskStatus::Dispatched | TaskStatus::Running => {
                let worker = t.worker_id.as_deref().unwrap_or_default();
                if index.contains(worker) {
                    continue;
                }
                let body = if t.cancel_requested {
                    EventBody::TaskCancelled(TaskCancelled {
                        task: tref(),
                        worker_id: Some(worker.to_owned()),
                        reason: format!("cancel requested; worker {worker} was lost"),
                    })
                } else if t.status == TaskStatus::Dispatched && index.departed(worker) {
                    // Never started on a worker that stopped cleanly: it waited in that worker's
                    // queue and was handed back unrun, so the new attempt does not spend one.
                    EventBody::TaskRequeued(TaskRequeued {
                        task: TaskRef { attempt: t.attempt + 1, ..tref() },
                        reason: crate::state::REQUEUED_UNRUN.to_owned(),
                        worker_id: Some(worker.to_owned()),
                    })
                } else if t.counted_attempts() < t.def.max_attempts {
                    EventBody::TaskRequeued(TaskRequeued {
                        task: TaskRef { attempt: t.attempt + 1, ..tref() },
                        reason: "worker_lost".to_owned(),
                        worker_id: Some(worker.to_owned()),
                    })
                } else {
                    EventBody::TaskFailed(TaskFailed {
                        task: tref(),
                        worker_id: Some(worker.to_owned()),
                        reason: FailureReason::WorkerLost,
                        message: format!("worker {worker} was lost on the last of {} attempts", t.def.max_attempts),
                        retryable: false,
                    })
                };
                actions.push(Action::Publish(body));
            }
            TaskStatus::Merged => {
                if let Some(action) = decide_merged(wf, t, tref(), round.state) {
                    actions.push(action);
                }
            }
            TaskStatus::Waiting | TaskStatus::Pending => {
                if let Some(action) = decide_waiting(wf, t, index, round, requests, leaders) {
                    if let Action::Dispatch { event, .. } = &action {
                        index.occupy(&event.worker_id, uses_service_slot(&t.def.task_type));
                        requests.usage_changed.insert(event.worker_id.clone());
                    }
                    actions.push(action);
                }
            }
        }
    }
    if actions.len() == ends_before && wf.tasks.iter().all(|t| t.status.is_terminal()) {
        let ended = WorkflowEnded { workflow_id: wf.workflow_id.clone(), reason: None };
        let body = if wf.cancel_requested {
            EventBody::WorkflowCancelled(ended)
        } else if wf.tasks.iter().all(|t| matches!(t.status, TaskStatus::Completed | TaskStatus::Skipped)) {
            // Left running by the fold only when a task completed through a merged execution
            // (`State::apply_deriving` derives every other completion), or in a fold restored
            // from a checkpoint written before that rule.
            EventBody::WorkflowCompleted(ended)
        } else {
            let failed: Vec<&str> = wf
                .tasks
                .iter()
                .filter(|t| t.status != TaskStatus::Completed && t.status != TaskStatus::Skipped)
                .map(|t| t.def.stage.as_str())
                .collect();
            EventBody::WorkflowFailed(WorkflowEnded {
                reason: Some(format!("stages did not complete: {}", failed.join(", "))),
                ..ended
            })
        };
        actions.push(Action::Publish(body));
    }
}

#[allow(clippy::too_many_arguments)]
fn decide_waiting(
    wf: &WorkflowState,
    t: &TaskState,
    index: &FleetIndex,
    round: &Round<'_>,
    requests: &mut Requests,
    leaders: &mut HashMap<String, String>,
) -> Option<Action> {
    let (now_ms, config) = (round.now_ms, round.config);
    let tref = || task_ref(&wf.workflow_id, t);
    let fail = |reason: FailureReason, message: String| {
        Some(Action::Publish(EventBody::TaskFailed(TaskFailed {
            task: tref(),
            worker_id: None,
            reason,
            message,
            retryable: false,
        })))
    };
    if wf.cancel_requested || t.cancel_requested {
        return Some(Action::Publish(EventBody::TaskCancelled(TaskCancelled {
            task: tref(),
            worker_id: None,
            reason: "cancel requested before dispatch".to_owned(),
        })));
    }
    let mut all_done = true;
    for dep in &t.def.depends_on {
        let Some(d) = wf.task(dep) else { continue };
        match d.status {
            // A skipped branch counts as done: its dependants run (FlowMesh joins after a condition).
            TaskStatus::Completed | TaskStatus::Skipped => {}
            TaskStatus::Failed | TaskStatus::Cancelled => {
                return fail(
                    FailureReason::UpstreamFailed,
                    format!("upstream stage {dep:?} did not complete ({:?})", d.status),
                );
            }
            _ => all_done = false,
        }
    }
    if !all_done {
        return None;
    }
    let upstream = WorkflowUpstream(wf);
    if let Some(condition) = &t.def.condition {
        let actual = upstream
            .0
            .task(&condition.node)
            .and_then(|d| d.result.as_ref())
            .and_then(|r| lookup(r, &template::parse_path(&condition.field)))
            .map(condition_text);
        let wanted = condition_text(&condition.equals);
        if actual.as_deref() != Some(wanted.as_str()) {
            return Some(Action::Publish(EventBody::TaskSkipped(TaskSkipped {
                task: tref(),
                reason: format!(
                    "condition not met: {}.{} is {} (wanted {wanted:?})",
                    condition.node,
                    condition.field,
                    actual.map_or_else(|| "absent".to_owned(), |a| format!("{a:?}"))
                ),
            })));
        }
    }
    let merge = merge_key(wf, t);
    if let Some(merge) = &merge {
        match leaders.get(merge) {
            Some(leader) if leader != &t.def.task_id => {
                let message = format!("{} merged with {leader}: one execution, its result for both", t.def.stage);
                return Some(Action::Publish(EventBody::TaskMerged(TaskMerged {
                    task: tref(),
                    into: leader.clone(),
                    message,
                })));
            }
            Some(_) => {}
            None => {
                leaders.insert(merge.clone(), t.def.task_id.clone());
            }
        }
    }
    let this_round = requests.round;
    // The spec resolved this round, if it had to be (a task seen waiting before has its request).
    let mut resolved = None;
    let known = requests.tasks.get(t.def.task_id.as_str()).is_some_and(|r| r.attempt == t.attempt);
    if !known {
        let Resolved { spec, rewritten } = match resolve(wf, t) {
            Ok(resolved) => resolved,
            Err(message) => return fail(FailureReason::SpecResolutionFailed, message),
        };
        // The validator ran these same checks on this very spec when it accepted the workflow
        // (`validate_submission`, every merged stage): only what resolution rewrote is new.
        if rewritten {
            let problems = validate_dispatchable(&spec, &t.def.spec_path);
            if !problems.is_empty() {
                let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
                return fail(FailureReason::SpecValidationFailed, text.join("; "));
            }
        }
        let request = match placement::request_for(&t.def.task_type, &spec, t.def.selected_workers.clone()) {
            Ok(r) => placement::Request { queue: !given_back(t), ..r },
            Err(message) => return fail(FailureReason::SpecValidationFailed, message),
        };
        let remembered =
            Remembered { attempt: t.attempt, seq: wf.seq, request, merge, hinted: None, round: this_round };
        requests.tasks.insert(t.def.task_id.clone(), remembered);
        requests.waits_for.add(&t.def.task_type);
        resolved = Some(spec);
    }
    let remembered = requests.tasks.get_mut(t.def.task_id.as_str()).expect("remembered above");
    remembered.round = this_round;
    // Told it waits for a slot, on this same fleet, and still every slot of its type is taken:
    // nothing to place and nothing new to say, so a backlog costs no placement per round. (A
    // task with no capable worker is never skipped: its grace clock runs.)
    if t.unplaceable_since_ms.is_none()
        && remembered.hinted.as_ref().is_some_and(|h| h.fleet == round.fleet)
        && index.full(&t.def.task_type)
    {
        return None;
    }
    match index.place(&remembered.request, &t.def.stage, &t.def.task_id, config.strategy, &t.failed_on, now_ms) {
        Placement::Chosen { worker_id, score, explanation, queued } => {
            // Resolution is deterministic: what resolved in an earlier round resolves the same now.
            let spec = match resolved.map_or_else(|| resolve_spec(wf, t), |spec| Ok(shared(spec, t))) {
                Ok(spec) => spec,
                Err(message) => return fail(FailureReason::SpecResolutionFailed, message),
            };
            let order = work_order(wf, t, spec);
            let message = explanation.map(|e| e.message).unwrap_or_else(|| {
                let placed = if queued { "queued on" } else { "placed on" };
                format!("{} {placed} {worker_id} ({:?} score {score:.3})", t.def.stage, config.strategy)
            });
            let event =
                TaskDispatched { task: tref(), worker_id, task_type: t.def.task_type.clone(), message, order: None };
            Some(Action::Dispatch { event, order })
        }
        Placement::Pending(explanation) => {
            let unplaceable = explanation.capable == 0;
            let since = if unplaceable { Some(t.unplaceable_since_ms.unwrap_or(now_ms)) } else { None };
            if let Some(since) = since
                && now_ms.saturating_sub(since) >= config.no_worker_grace_ms
            {
                return fail(FailureReason::NoEligibleWorker, explanation.message);
            }
            if t.pending_message.as_deref() == Some(explanation.message.as_str()) && t.unplaceable_since_ms == since {
                return None;
            }
            // Busy, and the fold has no unplaceable clock to stop: nothing to store.
            if !unplaceable && t.unplaceable_since_ms.is_none() {
                if let Some(hinted) = remembered.hinted.as_mut()
                    && hinted.message == explanation.message
                {
                    hinted.fleet = round.fleet;
                    return None;
                }
                remembered.hinted = Some(Hinted { message: explanation.message.clone(), fleet: round.fleet });
                return Some(Action::Hint(TaskPending {
                    task: tref(),
                    reason: "busy".to_owned(),
                    message: explanation.message.clone(),
                    explanation,
                    unplaceable_since_ms: None,
                }));
            }
            Some(Action::Publish(EventBody::TaskPending(TaskPending {
                task: tref(),
                reason: if unplaceable { FailureReason::NoEligibleWorker.as_str() } else { "busy" }.to_owned(),
                message: explanation.message.clone(),
                explanation,
                unplaceable_since_ms: since,
            })))
        }
    }
}

/// An order the router asks its worker to give back from its queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    pub worker_id: String,
    pub task_id: String,
}

/// Queued orders that could run sooner elsewhere. A worker with a queue (`prefetch`) takes an
/// order while its slots are busy, and the order would wait for one of them even when another
/// worker could run it sooner. Looked at on the router's tick, after a round: a task dispatched
/// to a worker that holds more than its slots, not reported started, is asked back
/// (`Release`) when, at two looks in a row, placement would put it on a free slot of another
/// worker now; or when it has waited `Config::queue_patience_ms` and another worker could run
/// it once a slot frees there. It is asked again at each look while that holds (a core-NATS
/// message; one for an order no longer waiting is ignored). Its worker gives it back only if
/// it still waits for a slot (`task.failed`, reason `released`, no attempt spent), and the task
/// then waits in the router for the first free slot, never in a queue again (`given_back`), in
/// its submission's turn.
#[derive(Debug, Default)]
pub struct Releases {
    /// Task attempts found waiting in a queue at the last look, with when they were first found.
    seen: HashMap<(String, u32), u64>,
}

impl Releases {
    /// The orders to ask back now: a walk over the running workflows while some worker holds
    /// more than its slots.
    pub fn look(&mut self, state: &State, index: &FleetIndex, config: &Config, now_ms: u64) -> Vec<Release> {
        let mut seen = HashMap::new();
        let mut releases = Vec::new();
        if !index.any_queue_taken() {
            self.seen = seen;
            return releases;
        }
        for wf in state.running_workflows_unordered() {
            for t in &wf.tasks {
                if t.status != TaskStatus::Dispatched || uses_service_slot(&t.def.task_type) {
                    continue;
                }
                let Some(worker) = t.worker_id.as_deref() else { continue };
                if !index.queue_taken(worker) {
                    continue;
                }
                let key = (t.def.task_id.clone(), t.attempt);
                let since = self.seen.get(&key).copied();
                seen.insert(key, since.unwrap_or(now_ms));
                let Some(since) = since else { continue };
                let Some(request) = dispatched_request(wf, t) else { continue };
                let free_now = index.slot_free_for(&t.def.task_type)
                    && on_a_free_slot_elsewhere(t, &request, worker, index, config, now_ms);
                let waited = now_ms.saturating_sub(since) >= config.queue_patience_ms
                    && index.could_run_elsewhere(&request, worker);
                if free_now || waited {
                    releases.push(Release { worker_id: worker.to_owned(), task_id: t.def.task_id.clone() });
                }
            }
        }
        self.seen = seen;
        releases
    }
}

/// Whether the task's current attempt follows one given back from a worker's queue.
fn given_back(t: &TaskState) -> bool {
    t.reason.as_deref() == Some(FailureReason::Released.as_str())
}

/// The placement request of a dispatched task, as its dispatch resolved it.
fn dispatched_request(wf: &WorkflowState, t: &TaskState) -> Option<Request> {
    let Resolved { spec, .. } = resolve(wf, t).ok()?;
    placement::request_for(&t.def.task_type, &spec, t.def.selected_workers.clone()).ok()
}

/// Whether placement would put the task on a free slot of another worker than `holder` now.
fn on_a_free_slot_elsewhere(
    t: &TaskState,
    request: &Request,
    holder: &str,
    index: &FleetIndex,
    config: &Config,
    now_ms: u64,
) -> bool {
    match index.place(request, &t.def.stage, &t.def.task_id, config.strategy, &t.failed_on, now_ms) {
        Placement::Chosen { worker_id, queued, .. } => !queued && worker_id != holder,
        Placement::Pending(_) => false,
    }
}

/// The task's spec with its placeholders (and echo references) resolved from upstream results.
pub fn resolve_spec(wf: &WorkflowState, t: &TaskState) -> Result<Arc<serde_json::Value>, String> {
    resolve(wf, t).map(|resolved| shared(resolved.spec, t))
}

/// A spec as it will be dispatched, and whether resolution rewrote any of it.
#[derive(Debug)]
pub struct Resolved<'a> {
    /// The task's own spec, borrowed, where nothing was rewritten: a task that waits for a slot
    /// has its placement request read from it without a copy, and is copied once, at dispatch.
    pub spec: Cow<'a, serde_json::Value>,
    /// It held a placeholder or (echo) an item that reads an upstream result. When not, the spec
    /// is the one the validator checked.
    pub rewritten: bool,
}

/// A resolved spec as a work order holds it: the task's own, shared, where nothing was
/// rewritten (`t` is the task it was resolved for, whose spec a borrowed one is).
fn shared(spec: Cow<'_, serde_json::Value>, t: &TaskState) -> Arc<serde_json::Value> {
    match spec {
        Cow::Borrowed(_) => Arc::clone(&t.def.spec),
        Cow::Owned(spec) => Arc::new(spec),
    }
}

/// `resolve_spec`, saying whether anything was rewritten.
pub fn resolve<'a>(wf: &WorkflowState, t: &'a TaskState) -> Result<Resolved<'a>, String> {
    let upstream = WorkflowUpstream(wf);
    let placeholders = template::contains_placeholder(&t.def.spec);
    let spec = if placeholders {
        Cow::Owned(template::resolve(&t.def.spec, &upstream)?)
    } else {
        Cow::Borrowed(t.def.spec.as_ref())
    };
    if t.def.task_type == "echo" && !echo::references(&spec).is_empty() {
        return Ok(Resolved { spec: Cow::Owned(echo::resolve_items(spec.into_owned(), &upstream)?), rewritten: true });
    }
    Ok(Resolved { spec, rewritten: placeholders })
}

/// The work order for the task's current attempt.
pub fn work_order(wf: &WorkflowState, t: &TaskState, spec: Arc<serde_json::Value>) -> WorkOrder {
    let upstream: BTreeMap<String, String> =
        t.def.depends_on.iter().filter_map(|d| wf.task(d).map(|u| (d.clone(), u.def.task_id.clone()))).collect();
    let upstream_artifacts =
        t.def.depends_on.iter().filter_map(|d| wf.task(d).map(|u| (d.clone(), u.artifacts.clone()))).collect();
    // A stage that stored no files has its result only inline: the order carries it.
    let upstream_results = t
        .def
        .depends_on
        .iter()
        .filter_map(|d| {
            wf.task(d).filter(|u| u.result_object.is_none()).and_then(|u| Some((d.clone(), u.result.clone()?)))
        })
        .collect();
    WorkOrder {
        workflow_id: wf.workflow_id.clone(),
        task_id: t.def.task_id.clone(),
        stage: t.def.stage.clone(),
        attempt: t.attempt,
        task_type: t.def.task_type.clone(),
        spec,
        upstream,
        upstream_artifacts,
        upstream_results,
    }
}
