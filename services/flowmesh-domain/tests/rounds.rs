//! A router's round looks only where something may have changed (`schedule::Requests`): the
//! workflows an event touched, merged tasks, and the backlog while a slot is free. Here a busy
//! fleet takes a long, seeded run of submissions (batch tasks, identical inference requests,
//! services, a task no worker can run), completions, failures, cancels, lost and returning
//! workers, heartbeats that change a worker's snapshot, cordons, ended workflows forgotten between
//! rounds, and passing time, and every round
//! must decide exactly what a walk of every running workflow over a fleet indexed afresh
//! (`decide`, with nothing remembered) decides. The remembering router keeps its `FleetIndex`
//! between rounds and feeds it as the router does: a snapshot `put` as it arrives, a worker
//! `remove`d when it goes.

use flowmesh_domain::event::{
    Event, EventBody, FailureReason, SubmissionAccepted, SubmissionRef, TaskCancelRequested, TaskCompleted, TaskFailed,
    TaskRef, WorkerCordon,
};
use flowmesh_domain::fleet::{WorkerSnapshot, WorkerStatus};
use flowmesh_domain::placement::FleetIndex;
use flowmesh_domain::schedule::{Action, Config, Requests, decide, decide_with};
use flowmesh_domain::state::State;
use flowmesh_domain::validate_submission;
use serde_json::json;
mod common;
use common::ASK;
#[path = "common/rng.rs"]
mod rng;
use rng::Rng;

const ONE: &str = r#"
apiVersion: flowmesh/v1
kind: Workflow
metadata: {name: one}
spec:
  taskType: echo
  graph:
    nodes:
      - {name: a, spec: {data: {type: list, items: [hi]}}}
"#;

const TWO: &str = r#"
apiVersion: flowmesh/v1
kind: Workflow
metadata: {name: two}
spec:
  taskType: echo
  maxAttempts: 2
  stages:
    - name: up
      spec: {data: {type: list, items: [first]}}
    - name: down
      spec: {data: {type: list, items: ["${up.items.0.output}"]}}
"#;

/// More cores than any worker has: it waits for a capable worker until its grace runs out.
const HUGE: &str = r#"
apiVersion: flowmesh/v1
kind: Workflow
metadata: {name: huge}
spec:
  taskType: python
  resources: {hardware: {cpu: "64"}}
  graph:
    nodes:
      - {name: a, spec: {command: ["python", "-c", "pass"]}}
"#;

/// A long-lived service: it takes a service slot, not a batch slot.
const SERVE: &str = r#"
apiVersion: flowmesh/v1
kind: ServeTask
metadata: {name: serve}
spec:
  taskType: serve
  resources: {hardware: {cpu: 1, memory: 1Gi}}
  model: {source: {type: huggingface, identifier: Qwen/Qwen3-0.6B}}
  accessMode: forward
  port: 8000
  ttlSeconds: 60
"#;

fn fleet() -> Vec<WorkerSnapshot> {
    let mut w1 = common::worker("w1", &["echo", "inference"], 8, 32, &[]);
    w1.slots.batch.total = 1;
    let w2 = common::worker("w2", &["echo", "python", "serve"], 8, 32, &[]);
    let mut w3 = common::worker("w3", &["echo"], 8, 32, &[]);
    w3.slots.batch.total = 1;
    // Takes one order beyond its slot, queued until the slot frees.
    w3.prefetch = 1;
    vec![w1, w2, w3]
}

struct Run {
    state: State,
    /// The same events folded as the router folds them (`apply_owned`): always equal to `state`.
    owned: State,
    requests: Requests,
    fleet: Vec<WorkerSnapshot>,
    /// The remembering router's index of `fleet`, kept between rounds.
    index: FleetIndex,
    /// Workers taken out of the fleet, to come back later.
    away: Vec<WorkerSnapshot>,
    now: u64,
    config: Config,
    submitted: u64,
    rounds: usize,
    dispatched: usize,
    /// Busy explanations: a task waited for a slot.
    hints: usize,
}

impl Run {
    fn apply(&mut self, body: EventBody) {
        let event = Event::new(body.clone(), "t".into(), 0);
        assert_eq!(self.state.apply(&event), self.owned.apply_owned(event), "{body:?}");
        self.requests.touch(&body);
    }

    fn submit(&mut self, doc: &str) {
        self.submitted += 1;
        let workflow_id = format!("wf-{}", self.submitted);
        let workflow = validate_submission(doc.as_bytes(), &workflow_id).unwrap_or_else(|p| panic!("{p:?}"));
        self.apply(EventBody::SubmissionAccepted(SubmissionAccepted {
            workflow_id,
            submission: SubmissionRef { stream: "S".into(), seq: self.submitted, msg_id: None, validated_by: None },
            task_ids: workflow.tasks.iter().map(|t| t.task_id.clone()).collect(),
            workflow,
        }));
    }

    /// The tasks on workers, oldest submission first.
    fn on_workers(&self) -> Vec<(TaskRef, String)> {
        self.state
            .running_workflows()
            .flat_map(|wf| wf.tasks.iter().map(move |t| (wf, t)))
            .filter(|(_, t)| t.status.is_on_worker())
            .map(|(wf, t)| {
                let tref = TaskRef {
                    workflow_id: wf.workflow_id.clone(),
                    task_id: t.def.task_id.clone(),
                    stage: t.def.stage.clone(),
                    attempt: t.attempt,
                };
                (tref, t.worker_id.clone().unwrap_or_default())
            })
            .collect()
    }

    /// One round: the remembering router's decisions must be a full walk's; they are folded in.
    fn route(&mut self) {
        let actions = decide_with(&self.state, &mut self.index, self.now, &self.config, &mut self.requests);
        let decisions = |actions: &[Action]| -> Vec<Action> {
            actions.iter().filter(|a| !matches!(a, Action::Hint(_))).cloned().collect()
        };
        let whole = decide(&self.state, &self.fleet, self.now, &self.config);
        assert_eq!(decisions(&actions), decisions(&whole), "round {} decided otherwise than a full walk", self.rounds);
        self.rounds += 1;
        for action in actions {
            match action {
                Action::Publish(body) => self.apply(body),
                Action::Dispatch { event, .. } => {
                    self.dispatched += 1;
                    self.apply(EventBody::TaskDispatched(event));
                }
                Action::Hint(_) => self.hints += 1,
            }
        }
    }

    /// Something happens: the seeded choice of one event or fleet change.
    fn step(&mut self, rng: &mut Rng) {
        match rng.below(21) {
            0..=5 => {
                let doc = [ONE, ONE, TWO, ASK, HUGE, SERVE][rng.below(6)];
                self.submit(doc);
            }
            6..=11 => {
                let running = self.on_workers();
                if let Some((task, worker)) = running.get(rng.below(running.len())).cloned() {
                    let items = json!({"ok": true, "count": 1, "items": [{"output": "first"}]});
                    self.apply(EventBody::TaskCompleted(TaskCompleted {
                        task,
                        worker_id: worker,
                        result: Some(items),
                        result_object: None,
                        artifacts: Vec::new(),
                        upload_ms: None,
                        started_at: None,
                    }));
                }
            }
            12 | 13 => {
                let running = self.on_workers();
                if let Some((task, worker)) = running.get(rng.below(running.len())).cloned() {
                    self.apply(EventBody::TaskFailed(TaskFailed {
                        task,
                        worker_id: Some(worker),
                        reason: FailureReason::ExecutorError,
                        message: "boom".into(),
                        retryable: rng.below(2) == 0,
                    }));
                }
            }
            14 => {
                let workflow_id = format!("wf-{}", 1 + rng.below(self.submitted as usize));
                self.apply(EventBody::TaskCancelRequested(TaskCancelRequested {
                    workflow_id,
                    task_id: None,
                    reason: "changed my mind".into(),
                }));
            }
            15 if self.fleet.len() > 1 => {
                let worker = self.fleet.remove(rng.below(self.fleet.len()));
                self.index.remove(&worker.id);
                if rng.below(3) == 0 {
                    // Heard again before the next round: the fleet looks as it did.
                    self.index.put(&worker);
                    self.fleet.push(worker);
                } else {
                    self.away.push(worker);
                }
            }
            16 if !self.away.is_empty() => {
                let worker = self.away.remove(0);
                self.index.put(&worker);
                self.fleet.push(worker);
            }
            17 => {
                // The router's tick: time passes, ended workflows are forgotten, a whole round.
                self.now += 25_000;
                self.state.forget_ended();
                self.owned.forget_ended();
                assert_eq!(self.state, self.owned, "folding by value and by reference differ");
                self.requests.touch_all();
            }
            20 => {
                // The router's forget timer: ended workflows dropped between rounds, with no
                // whole round after it; what they held is let go of.
                let mut dropped = Vec::new();
                self.state.forget_ended_into(&mut dropped);
                self.owned.forget_ended();
                self.requests.forgotten(&dropped);
            }
            18 if !self.fleet.is_empty() => {
                // A heartbeat: what changes from one snapshot to the next (slots, status, idle
                // time), now and then the hardware (a rebuild of the rankings).
                let i = rng.below(self.fleet.len());
                let w = &mut self.fleet[i];
                match rng.below(6) {
                    0 => w.slots.batch.total = 1 + w.slots.batch.total % 3,
                    4 => w.prefetch = (w.prefetch + 1) % 3,
                    1 => {
                        w.status =
                            if w.status == WorkerStatus::Draining { WorkerStatus::Idle } else { WorkerStatus::Draining }
                    }
                    2 => w.hardware.memory_bytes ^= 1 << 30,
                    _ => w.idle_since_ms = Some(self.now - rng.below(60_000) as u64),
                }
                self.index.put(&self.fleet[i]);
            }
            19 => {
                // An operator cordons a worker, or uncordons it (which also ends a drain).
                let worker_id = format!("w{}", 1 + rng.below(3));
                self.apply(match rng.below(5) {
                    0 => EventBody::WorkerCordoned(WorkerCordon { worker_id }),
                    1 => EventBody::WorkerDrainRequested(WorkerCordon { worker_id }),
                    _ => EventBody::WorkerUncordoned(WorkerCordon { worker_id }),
                });
            }
            _ => {}
        }
    }
}

#[test]
fn a_round_that_looks_only_where_something_changed_decides_what_a_full_walk_decides() {
    for seed in 0u64..8 {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ seed);
        let mut run = Run {
            state: State::default(),
            owned: State::default(),
            requests: Requests::default(),
            fleet: fleet(),
            index: FleetIndex::of(&fleet()),
            away: Vec::new(),
            now: 1_000_000,
            config: Config { no_worker_grace_ms: 60_000, ..Default::default() },
            submitted: 0,
            rounds: 0,
            dispatched: 0,
            hints: 0,
        };
        for _ in 0..600 {
            for _ in 0..1 + rng.below(3) {
                run.step(&mut rng);
            }
            run.route();
        }
        // The run was a busy one: a backlog formed and drained through freed slots.
        println!("seed {seed}: {} rounds, {} dispatches, {} busy explanations", run.rounds, run.dispatched, run.hints);
        assert!(run.dispatched > 120, "seed {seed}: only {} dispatches", run.dispatched);
        assert!(run.hints > 20, "seed {seed}: only {} busy explanations", run.hints);
    }
}
