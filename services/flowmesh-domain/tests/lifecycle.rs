//! The task and workflow lifecycle as scenarios over the pure core: `decide` proposes, the
//! scenario plays the workers, `State::apply` folds everything back.

use flowmesh_domain::event::{
    Event, EventBody, FailureReason, SubmissionAccepted, SubmissionRef, TaskCompleted, TaskFailed, TaskPending,
    TaskRef, TaskStarted,
};
mod common;

use flowmesh_domain::fleet::WorkerSnapshot;
use flowmesh_domain::placement::FleetIndex;
use flowmesh_domain::schedule::{Action, Config, Release, Releases, Requests, decide, decide_with};
use flowmesh_domain::state::{Applied, State, TaskStatus, WorkflowStatus};
use flowmesh_domain::validate_submission;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A small worker with one batch slot, so a second task has to wait.
fn worker(id: &str, types: &[&str]) -> WorkerSnapshot {
    let mut w = common::worker(id, types, 8, 32, &[]);
    w.slots.batch.total = 1;
    w.ttl_sec = 4;
    w
}

struct Scenario {
    state: State,
    fleet: Vec<WorkerSnapshot>,
    now: u64,
    config: Config,
    log: Vec<Event>,
    /// What a router keeps between rounds: its requests and its index of the live fleet.
    requests: Requests,
    index: FleetIndex,
    /// The busy explanations sent as hints (never stored), in order.
    hints: Vec<TaskPending>,
    /// `now` at the last round.
    routed_at: Option<u64>,
}

impl Scenario {
    fn new(doc: &str, fleet: Vec<WorkerSnapshot>) -> Scenario {
        let workflow = validate_submission(doc.as_bytes(), "wf-1").unwrap_or_else(|p| panic!("{p:?}"));
        let mut s = Scenario {
            state: State::default(),
            fleet,
            now: 1_000,
            config: Config { no_worker_grace_ms: 60_000, ..Default::default() },
            log: Vec::new(),
            requests: Requests::default(),
            index: FleetIndex::default(),
            hints: Vec::new(),
            routed_at: None,
        };
        s.apply(EventBody::SubmissionAccepted(SubmissionAccepted {
            workflow_id: "wf-1".into(),
            submission: SubmissionRef {
                stream: "FLOWMESH_SUBMISSIONS".into(),
                seq: 1,
                msg_id: None,
                validated_by: None,
            },
            task_ids: workflow.tasks.iter().map(|t| t.task_id.clone()).collect(),
            workflow,
        }));
        s
    }

    fn apply(&mut self, body: EventBody) -> Applied {
        let event = Event::new(body, format!("t{}", self.now), self.log.len() as u64);
        let applied = self.state.apply(&event);
        self.requests.touch(&event.body);
        self.log.push(event);
        applied
    }

    /// Runs the router once; returns the work orders it sent (worker, stage, attempt, spec).
    fn route(&mut self) -> Vec<(String, String, u32, Value)> {
        let mut sent = Vec::new();
        // What the router remembers between rounds never changes a decision. Like the router's
        // tick, time passing gets a round that looks at everything (grace periods).
        if self.routed_at != Some(self.now) {
            self.requests.touch_all();
            self.routed_at = Some(self.now);
        }
        // The index follows the fleet as a router's does: every snapshot put, the gone removed.
        let gone: Vec<String> = self
            .index
            .candidates()
            .map(|c| c.snapshot.id.clone())
            .filter(|id| !self.fleet.iter().any(|w| &w.id == id))
            .collect();
        for id in gone {
            self.index.remove(&id);
        }
        for w in &self.fleet {
            self.index.put(w);
        }
        let actions = decide_with(&self.state, &mut self.index, self.now, &self.config, &mut self.requests);
        // Hints are sent once per explanation, so only a fresh router repeats them.
        let decisions = |actions: &[Action]| -> Vec<Action> {
            actions.iter().filter(|a| !matches!(a, Action::Hint(_))).cloned().collect()
        };
        assert_eq!(
            decisions(&actions),
            decisions(&decide(&self.state, &self.fleet, self.now, &self.config)),
            "remembered requests changed a decision"
        );
        for action in actions {
            match action {
                Action::Hint(pending) => self.hints.push(pending),
                Action::Publish(body) => {
                    self.apply(body);
                }
                Action::Dispatch { event, order } => {
                    // A spec that resolution left as it was is the task's own: shared with the
                    // fold, never copied per dispatch.
                    let own = &self.state.task(&order.task_id).expect("a dispatched task is known").def.spec;
                    assert_eq!(
                        Arc::ptr_eq(own, &order.spec),
                        **own == *order.spec,
                        "{}: an unchanged spec is shared, a rewritten one is the order's own",
                        order.stage
                    );
                    sent.push((event.worker_id.clone(), order.stage.clone(), order.attempt, Value::clone(&order.spec)));
                    self.apply(EventBody::TaskDispatched(event));
                }
            }
        }
        sent
    }

    fn tref(&self, stage: &str, attempt: u32) -> TaskRef {
        TaskRef { workflow_id: "wf-1".into(), task_id: format!("wf-1-{stage}"), stage: stage.into(), attempt }
    }

    fn complete(&mut self, worker: &str, stage: &str, attempt: u32, result: Value) -> Applied {
        self.apply(EventBody::TaskStarted(TaskStarted { task: self.tref(stage, attempt), worker_id: worker.into() }));
        self.apply(EventBody::TaskCompleted(TaskCompleted {
            task: self.tref(stage, attempt),
            worker_id: worker.into(),
            result: Some(result),
            result_object: Some(format!("wf-1-{stage}/results.json")),
            artifacts: Vec::new(),
            upload_ms: None,
            started_at: None,
        }))
    }

    fn fail(&mut self, worker: &str, stage: &str, attempt: u32, retryable: bool) -> Applied {
        self.apply(EventBody::TaskFailed(TaskFailed {
            task: self.tref(stage, attempt),
            worker_id: Some(worker.into()),
            reason: FailureReason::ExecutorError,
            message: "boom".into(),
            retryable,
        }))
    }

    /// The worker's report that it gave the order back from its queue, unrun.
    fn give_back(&mut self, worker: &str, stage: &str, attempt: u32) -> Applied {
        self.apply(EventBody::TaskFailed(TaskFailed {
            task: self.tref(stage, attempt),
            worker_id: Some(worker.into()),
            reason: FailureReason::Released,
            message: "given back".into(),
            retryable: true,
        }))
    }

    fn status(&self, stage: &str) -> TaskStatus {
        self.state.task(&format!("wf-1-{stage}")).expect("task").status
    }

    fn workflow(&self) -> WorkflowStatus {
        self.state.workflows["wf-1"].status
    }

    fn kinds(&self) -> Vec<&'static str> {
        self.log.iter().map(|e| e.body.kind()).collect()
    }
}

const TWO_ECHO_STAGES: &str = r#"
apiVersion: flowmesh/v1
kind: Workflow
metadata: {name: two}
spec:
  taskType: echo
  stages:
    - name: up
      spec: {data: {type: list, items: [first, second]}}
    - name: down
      spec: {data: {type: list, items: ["${up.items.1.output}", "got ${up.count} items"]}}
"#;

#[test]
fn a_placeholder_carries_a_value_downstream() {
    let mut s = Scenario::new(TWO_ECHO_STAGES, vec![worker("w1", &["echo"])]);
    let sent = s.route();
    assert_eq!(sent.iter().map(|o| o.1.as_str()).collect::<Vec<_>>(), ["up"], "down waits for up");
    s.complete("w1", "up", 1, json!({"ok": true, "count": 2, "items": [{"output": "first"}, {"output": "second"}]}));
    let sent = s.route();
    assert_eq!(sent.len(), 1);
    assert_eq!(
        sent[0].3["data"]["items"],
        json!(["second", "got 2 items"]),
        "typed whole placeholder, stringified embedded one"
    );
    s.complete("w1", "down", 1, json!({"ok": true}));
    s.route();
    assert_eq!(s.workflow(), WorkflowStatus::Completed);
}

#[test]
fn a_condition_that_is_not_met_skips_the_stage_and_the_join_still_runs() {
    let doc = r#"
apiVersion: flowmesh/v1
kind: Workflow
metadata: {name: cond}
spec:
  taskType: echo
  graph:
    nodes:
      - name: judge
        spec: {data: {type: list, items: [reject]}}
      - name: publish
        dependsOn: [judge]
        spec:
          condition: {node: judge, field: items.0.output, equals: approve}
          data: {type: list, items: [published]}
      - name: report
        dependsOn: [judge, publish]
        spec: {data: {type: list, items: [done]}}
"#;
    let mut s = Scenario::new(doc, vec![worker("w1", &["echo"])]);
    s.route();
    s.complete("w1", "judge", 1, json!({"ok": true, "count": 1, "items": [{"output": "reject"}]}));
    let sent = s.route();
    assert_eq!(s.status("publish"), TaskStatus::Skipped);
    assert!(sent.is_empty(), "report waits for the skip to be folded");
    let sent = s.route();
    assert_eq!(sent.iter().map(|o| o.1.as_str()).collect::<Vec<_>>(), ["report"]);
    s.complete("w1", "report", 1, json!({"ok": true}));
    s.route();
    assert_eq!(s.workflow(), WorkflowStatus::Completed);
}

#[test]
fn a_workflow_whose_tasks_all_completed_ends_in_the_fold_and_nothing_stores_its_end() {
    let mut s = Scenario::new(TWO_ECHO_STAGES, vec![worker("w1", &["echo"])]);
    s.route();
    s.complete("w1", "up", 1, json!({"ok": true, "count": 2, "items": [{"output": "a"}, {"output": "b"}]}));
    assert_eq!(s.workflow(), WorkflowStatus::Running);
    s.route();
    let last = Event::new(
        EventBody::TaskCompleted(TaskCompleted {
            task: s.tref("down", 1),
            worker_id: "w1".into(),
            result: Some(json!({"ok": true})),
            result_object: None,
            artifacts: Vec::new(),
            upload_ms: None,
            started_at: None,
        }),
        "2026-11-24T10:00:00.000Z".into(),
        0,
    );
    let (applied, derived) = s.state.apply_deriving(&last);
    assert_eq!(applied, Applied::Changed);
    let derived = derived.expect("the last task's end implies the workflow's");
    assert_eq!(
        (derived.body.kind(), derived.id.as_str(), derived.time.as_str()),
        ("workflow.completed", "wf-1.end", "2026-11-24T10:00:00.000Z")
    );
    assert_eq!(s.workflow(), WorkflowStatus::Completed);
    assert!(s.route().is_empty());
    assert!(!s.kinds().iter().any(|k| k.starts_with("workflow.")), "the router stores no end: {:?}", s.kinds());
    // An end stored by an older router is a second end: ignored, as is a second derivation.
    let stored = s.apply(derived.body.clone());
    assert_eq!(stored, Applied::Ignored("workflow already ended"));
    assert_eq!(s.state.apply_deriving(&last), (Applied::Ignored("task already ended"), None));
}

#[test]
fn only_a_workflow_with_no_cancel_asked_and_every_task_completed_or_skipped_ends_by_itself() {
    // (the last task's end, whether a cancel was asked first) → what the fold derives, and the
    // end the router then stores.
    let cases: [(&str, bool, Option<&str>, Option<&str>); 4] = [
        ("completed", false, Some("workflow.completed"), None),
        ("completed", true, None, Some("workflow.cancelled")),
        ("skipped", false, Some("workflow.completed"), None),
        ("failed", false, None, Some("workflow.failed")),
    ];
    for (end, cancel, derived_kind, stored_kind) in cases {
        let doc = "apiVersion: flowmesh/v1\nkind: Echo\nmetadata: {name: one}\nspec: {taskType: echo, data: {type: list, items: [a]}}\n";
        let mut s = Scenario::new(doc, vec![worker("w1", &["echo"])]);
        let sent = s.route();
        let stage = sent[0].1.clone();
        if cancel {
            s.apply(EventBody::TaskCancelRequested(flowmesh_domain::event::TaskCancelRequested {
                workflow_id: "wf-1".into(),
                task_id: None,
                reason: "test".into(),
            }));
        }
        let task = s.tref(&stage, 1);
        let body = match end {
            "completed" => EventBody::TaskCompleted(TaskCompleted {
                task,
                worker_id: "w1".into(),
                result: Some(json!({"ok": true})),
                result_object: None,
                artifacts: Vec::new(),
                upload_ms: None,
                started_at: None,
            }),
            "skipped" => EventBody::TaskSkipped(flowmesh_domain::event::TaskSkipped { task, reason: "test".into() }),
            _ => EventBody::TaskFailed(TaskFailed {
                task,
                worker_id: Some("w1".into()),
                reason: FailureReason::ExecutorError,
                message: "boom".into(),
                retryable: false,
            }),
        };
        let (_, derived) = s.state.apply_deriving(&Event::new(body, "t".into(), 0));
        assert_eq!(derived.map(|e| e.body.kind()), derived_kind, "{end}, cancel asked: {cancel}");
        s.route();
        let stored: Vec<&str> = s.kinds().into_iter().filter(|k| k.starts_with("workflow.")).collect();
        assert_eq!(stored, stored_kind.into_iter().collect::<Vec<_>>(), "{end}, cancel asked: {cancel}");
        assert_ne!(s.workflow(), WorkflowStatus::Running, "{end}, cancel asked: {cancel}");
    }
}

#[test]
fn a_permanent_failure_cascades_and_fails_the_workflow() {
    let mut s = Scenario::new(TWO_ECHO_STAGES, vec![worker("w1", &["echo"])]);
    s.route();
    s.fail("w1", "up", 1, false);
    s.route();
    assert_eq!(s.status("up"), TaskStatus::Failed);
    assert_eq!(s.status("down"), TaskStatus::Failed);
    assert_eq!(s.state.task("wf-1-down").unwrap().reason.as_deref(), Some("upstream_failed"));
    s.route();
    assert_eq!(s.workflow(), WorkflowStatus::Failed);
}

#[test]
fn a_retryable_failure_retries_elsewhere_up_to_max_attempts() {
    let mut s = Scenario::new(TWO_ECHO_STAGES, vec![worker("w1", &["echo"]), worker("w2", &["echo"])]);
    let first = s.route();
    let w = first[0].0.clone();
    s.fail(&w, "up", 1, true);
    assert_eq!(s.status("up"), TaskStatus::Retrying);
    s.route(); // requeue
    let second = s.route();
    assert_eq!(second[0].2, 2, "attempt 2");
    assert_ne!(second[0].0, w, "the worker that failed it is avoided");
    s.fail(&second[0].0, "up", 2, true);
    s.route();
    let third = s.route();
    s.fail(&third[0].0, "up", 3, true);
    assert_eq!(s.status("up"), TaskStatus::Failed, "three attempts by default");
    s.route();
    assert!(s.requests.is_empty(), "nothing waits, nothing is remembered: {:?}", s.requests);
}

#[test]
fn a_lost_worker_s_task_is_requeued_and_its_late_report_ignored() {
    let mut s = Scenario::new(TWO_ECHO_STAGES, vec![worker("w1", &["echo"]), worker("w2", &["echo"])]);
    let sent = s.route();
    let lost = sent[0].0.clone();
    s.apply(EventBody::TaskStarted(TaskStarted { task: s.tref("up", 1), worker_id: lost.clone() }));
    s.fleet.retain(|w| w.id != lost);
    s.route();
    assert_eq!(s.state.task("wf-1-up").unwrap().attempt, 2);
    let sent = s.route();
    assert_eq!(sent[0].2, 2);
    // The lost worker was alive after all and reports attempt 1: ignored.
    let late = s.complete(&lost, "up", 1, json!({"late": true}));
    assert_eq!(late, Applied::Ignored("event for a superseded attempt"));
    assert_eq!(s.complete(&sent[0].0, "up", 2, json!({"ok": true, "count": 0, "items": []})), Applied::Changed);
    // A duplicate terminal report changes nothing.
    assert_eq!(s.complete(&sent[0].0, "up", 2, json!({"again": true})), Applied::Ignored("task already ended"));
    assert_eq!(s.state.task("wf-1-up").unwrap().result, Some(json!({"ok": true, "count": 0, "items": []})));
}

/// A report counts only from the worker the attempt was dispatched to: another worker (a second
/// process started with a copied config, a worker confused after a restore) cannot start, update,
/// end or fail it; a report before any dispatch counts from nobody.
#[test]
fn only_the_worker_holding_a_task_reports_on_it() {
    let mut s = Scenario::new(TWO_ECHO_STAGES, vec![worker("w1", &["echo"]), worker("w2", &["echo"])]);
    let down = s.tref("down", 1);
    let early = s.apply(EventBody::TaskCompleted(TaskCompleted {
        task: down,
        worker_id: "w1".into(),
        result: None,
        result_object: None,
        artifacts: Vec::new(),
        upload_ms: None,
        started_at: None,
    }));
    assert_eq!(early, Applied::Ignored("report from a worker that does not hold the task"));
    let sent = s.route();
    let (holder, other) = (sent[0].0.clone(), if sent[0].0 == "w1" { "w2" } else { "w1" });
    let not_held = Applied::Ignored("report from a worker that does not hold the task");
    assert_eq!(
        s.apply(EventBody::TaskStarted(TaskStarted { task: s.tref("up", 1), worker_id: other.into() })),
        not_held
    );
    assert_eq!(s.status("up"), TaskStatus::Dispatched);
    assert_eq!(s.complete(other, "up", 1, json!({"forged": true})), not_held);
    assert_eq!(s.fail(other, "up", 1, false), not_held);
    assert_eq!(s.status("up"), TaskStatus::Dispatched);
    // The holder's reports count.
    assert_eq!(s.complete(&holder, "up", 1, json!({"ok": true, "count": 1, "items": []})), Applied::Changed);
    assert_eq!(s.state.task("wf-1-up").unwrap().result, Some(json!({"ok": true, "count": 1, "items": []})));
}

#[test]
fn no_capable_worker_fails_after_the_grace_period_but_busy_workers_are_waited_for() {
    let doc = "apiVersion: flowmesh/v1\nkind: PPO\nmetadata: {name: p}\nspec: {taskType: ppo}\n";
    let mut s = Scenario::new(doc, vec![worker("cpu", &["echo"])]);
    s.route();
    assert_eq!(s.status("main"), TaskStatus::Pending);
    let pending = s.kinds().iter().filter(|k| **k == "task.pending").count();
    s.now += 30_000;
    s.route();
    assert_eq!(s.kinds().iter().filter(|k| **k == "task.pending").count(), pending, "same reason, no new event");
    s.now += 31_000;
    s.route();
    assert_eq!(s.status("main"), TaskStatus::Failed);
    let task = s.state.task("wf-1-main").unwrap();
    assert_eq!(task.reason.as_deref(), Some("no_eligible_worker"));
    assert!(task.message.as_deref().unwrap().contains("serve task type \"ppo\""), "{:?}", task.message);

    // Busy: the only capable worker has no free slot. No deadline, and nothing stored: the
    // explanation goes out once as a hint.
    let mut s =
        Scenario::new(TWO_ECHO_STAGES.replace("name: two", "name: busy").as_str(), vec![worker("w1", &["echo"])]);
    s.fleet[0].slots.batch.total = 0;
    s.route();
    s.now += 10 * 60_000;
    s.route();
    assert_eq!(s.status("up"), TaskStatus::Waiting);
    assert!(!s.kinds().contains(&"task.pending"), "{:?}", s.kinds());
    let hinted: Vec<(&str, &str)> = s.hints.iter().map(|h| (h.task.stage.as_str(), h.reason.as_str())).collect();
    assert_eq!(hinted, [("up", "busy")], "one hint, not one per round");
    assert!(s.hints[0].message.contains("no free batch slot"), "{}", s.hints[0].message);
}

#[test]
fn a_task_that_was_unplaceable_stores_the_change_to_busy_once() {
    // No worker serves echo: the task is unplaceable, and its clock is stored.
    let mut s = Scenario::new(TWO_ECHO_STAGES, vec![worker("w1", &["python"])]);
    s.route();
    assert!(s.state.task("wf-1-up").unwrap().unplaceable_since_ms.is_some());
    // An echo worker with no free slot joins: the task is now only busy. The stored clock must
    // stop (or a later loss of that worker would fail the task at once), so this one is stored.
    let mut busy = worker("w2", &["echo"]);
    busy.slots.batch.total = 0;
    s.fleet.push(busy);
    s.route();
    let task = s.state.task("wf-1-up").unwrap();
    assert_eq!((task.status, task.unplaceable_since_ms), (TaskStatus::Pending, None));
    assert_eq!(s.kinds().iter().filter(|k| **k == "task.pending").count(), 2);
    // Still busy in later rounds: no more events, no hint either (the stored one says it).
    s.now += 5_000;
    s.route();
    assert_eq!(s.kinds().iter().filter(|k| **k == "task.pending").count(), 2);
    assert!(s.hints.is_empty(), "{:?}", s.hints);
}

#[test]
fn cancelling_a_workflow_cancels_queued_tasks_without_dispatch() {
    let mut s = Scenario::new(TWO_ECHO_STAGES, vec![]);
    s.route();
    s.apply(EventBody::TaskCancelRequested(flowmesh_domain::event::TaskCancelRequested {
        workflow_id: "wf-1".into(),
        task_id: None,
        reason: "operator".into(),
    }));
    s.route();
    assert_eq!((s.status("up"), s.status("down")), (TaskStatus::Cancelled, TaskStatus::Cancelled));
    s.route();
    assert_eq!(s.workflow(), WorkflowStatus::Cancelled);
    assert!(!s.kinds().contains(&"task.dispatched"));
}

/// The router checks a spec again at dispatch only where resolution rewrote it: the rest is the
/// spec the validator checked on acceptance (`a_resolved_spec_that_breaks_a_rule_fails_at_dispatch`
/// holds the check itself).
#[test]
fn only_a_spec_that_resolution_rewrote_counts_as_new_at_dispatch() {
    let doc = r#"
apiVersion: flowmesh/v1
kind: Workflow
metadata: {name: rewrites}
spec:
  stages:
    - name: up
      spec: {taskType: echo, data: {type: list, items: [3]}}
    - name: plain
      dependsOn: [up]
      spec: {taskType: echo, data: {type: list, items: [a, 7]}}
    - name: reads
      dependsOn: [up]
      spec: {taskType: echo, data: {type: list, items: [a, {node: up, path: "items[0].output"}]}}
    - name: templated
      dependsOn: [up]
      spec: {taskType: echo, data: {type: list, items: ["${up.count}"]}}
"#;
    let mut s = Scenario::new(doc, vec![worker("w1", &["echo"])]);
    s.route();
    s.complete("w1", "up", 1, json!({"ok": true, "count": 1, "items": [{"output": 3}]}));
    let wf = s.state.workflow("wf-1").unwrap();
    for (stage, rewritten, items) in
        [("plain", false, json!(["a", 7])), ("reads", true, json!(["a", 3])), ("templated", true, json!([1]))]
    {
        let resolved = flowmesh_domain::schedule::resolve(wf, wf.task(stage).unwrap()).unwrap();
        assert_eq!((resolved.rewritten, &resolved.spec["data"]["items"]), (rewritten, &items), "{stage}");
    }
}

#[test]
fn a_resolved_spec_that_breaks_a_rule_fails_at_dispatch() {
    let doc = r#"
apiVersion: flowmesh/v1
kind: Workflow
metadata: {name: deferred}
spec:
  stages:
    - name: decide
      spec: {taskType: echo, data: {type: list, items: [0]}}
    - name: serve
      spec:
        taskType: inference
        model: {source: {type: huggingface, identifier: m}, vllm: {}}
        resources: {hardware: {gpu: {count: "${decide.items.0.output}"}}}
"#;
    let mut s = Scenario::new(doc, vec![worker("w1", &["echo", "inference"])]);
    s.route();
    s.complete("w1", "decide", 1, json!({"ok": true, "count": 1, "items": [{"output": 0}]}));
    s.route();
    let task = s.state.task("wf-1-serve").unwrap();
    assert_eq!(task.status, TaskStatus::Failed);
    assert_eq!(task.reason.as_deref(), Some("spec_validation_failed"));
    assert!(
        task.message.as_deref().unwrap().contains("/spec/stages/1/spec/resources/hardware/gpu/count"),
        "{:?}",
        task.message
    );
}

#[test]
fn a_busy_fleet_serves_workflows_in_submission_order() {
    let mut state = State::default();
    for seq in [10u64, 2, 33] {
        let id = format!("wf-{seq}");
        let doc = "apiVersion: flowmesh/v1\nkind: Echo\nmetadata: {name: e}\nspec: {taskType: echo, data: {type: list, items: [x]}}\n";
        let workflow = validate_submission(doc.as_bytes(), &id).unwrap();
        let body = EventBody::SubmissionAccepted(SubmissionAccepted {
            workflow_id: id.clone(),
            submission: SubmissionRef { stream: "FLOWMESH_SUBMISSIONS".into(), seq, msg_id: None, validated_by: None },
            task_ids: workflow.tasks.iter().map(|t| t.task_id.clone()).collect(),
            workflow,
        });
        state.apply(&Event::new(body, "t".into(), 0));
    }
    // One slot: exactly one dispatch, and it goes to the oldest submission (wf-2, not "wf-10" < "wf-2").
    let actions = decide(&state, &[worker("w1", &["echo"])], 0, &Config::default());
    let dispatched: Vec<String> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Dispatch { order, .. } => Some(order.workflow_id.clone()),
            Action::Publish(_) | Action::Hint(_) => None,
        })
        .collect();
    assert_eq!(dispatched, ["wf-2"]);
}

/// Two identical inference requests (a, b) and a different one (c), all roots.
const IDENTICAL_INFERENCE: &str = r#"
apiVersion: flowmesh/v1
kind: Workflow
metadata: {name: merge}
spec:
  taskType: inference
  model: {source: {type: huggingface, identifier: Qwen/Qwen3-0.6B}}
  inference: {max_tokens: 32, temperature: 0}
  graph:
    nodes:
      - {name: a, spec: {data: {type: list, items: [hello]}}}
      - {name: b, spec: {data: {type: list, items: [hello]}, output: {artifacts: [results.json]}}}
      - {name: c, spec: {data: {type: list, items: [goodbye]}}}
"#;

#[test]
fn an_identical_inference_request_is_merged_and_gets_the_result_as_its_own() {
    let mut s = Scenario::new(IDENTICAL_INFERENCE, vec![worker("w1", &["inference"])]);
    let sent = s.route();
    assert_eq!(sent.iter().map(|o| o.1.as_str()).collect::<Vec<_>>(), ["a"], "one execution; c waits for the slot");
    assert_eq!(s.status("b"), TaskStatus::Merged);
    let merged = s.state.task("wf-1-b").unwrap();
    assert_eq!(merged.merged_into.as_deref(), Some("wf-1-a"));
    assert_eq!(s.status("c"), TaskStatus::Waiting, "different inputs are not merged (c waits for the slot)");
    // Only the leader's completion, reported for the merged task, ends it: not before.
    let early = s.apply(EventBody::TaskCompleted(TaskCompleted {
        task: s.tref("b", 1),
        worker_id: "w1".into(),
        result: None,
        result_object: None,
        artifacts: Vec::new(),
        upload_ms: None,
        started_at: None,
    }));
    assert_eq!(early, Applied::Ignored("report from a worker that does not hold the task"));
    s.complete("w1", "a", 1, json!({"items": [{"output": "hi"}]}));
    let sent = s.route();
    assert_eq!(s.status("b"), TaskStatus::Completed);
    let b = s.state.task("wf-1-b").unwrap();
    assert_eq!((b.result.clone(), b.worker_id.as_deref()), (Some(json!({"items": [{"output": "hi"}]})), Some("w1")));
    assert_eq!(sent.iter().map(|o| o.1.as_str()).collect::<Vec<_>>(), ["c"]);
    assert!(s.kinds().contains(&"task.merged"));
    // A workflow with a task completed through a merge is not ended by the fold alone (a reader of
    // its subjects cannot check that completion against the shared execution): the router stores it.
    s.complete("w1", "c", 1, json!({"items": [{"output": "other"}]}));
    assert_eq!(s.workflow(), WorkflowStatus::Running);
    s.route();
    assert_eq!(s.workflow(), WorkflowStatus::Completed);
    assert_eq!(s.kinds().last(), Some(&"workflow.completed"));
}

#[test]
fn cancelling_a_merged_task_leaves_the_shared_execution_alone() {
    use flowmesh_domain::event::TaskCancelRequested;
    let mut s = Scenario::new(IDENTICAL_INFERENCE, vec![worker("w1", &["inference"])]);
    s.route();
    s.apply(EventBody::TaskCancelRequested(TaskCancelRequested {
        workflow_id: "wf-1".into(),
        task_id: Some("wf-1-b".into()),
        reason: "not needed".into(),
    }));
    s.route();
    assert_eq!(s.status("b"), TaskStatus::Cancelled);
    assert_eq!(s.status("a"), TaskStatus::Dispatched, "the execution goes on");
    s.complete("w1", "a", 1, json!({"ok": true}));
    s.route();
    assert_eq!(s.status("a"), TaskStatus::Completed);
}

#[test]
fn when_the_shared_execution_fails_a_merged_task_runs_on_its_own() {
    let mut s = Scenario::new(IDENTICAL_INFERENCE, vec![worker("w1", &["inference"])]);
    s.route();
    s.fail("w1", "a", 1, false);
    let sent = s.route();
    assert_eq!((s.status("a"), s.status("b")), (TaskStatus::Failed, TaskStatus::Waiting));
    assert_eq!(sent.iter().map(|o| o.1.as_str()).collect::<Vec<_>>(), ["c"], "c took the freed slot");
    s.complete("w1", "c", 1, json!({"ok": true}));
    let sent = s.route();
    assert_eq!(sent.iter().map(|o| (o.1.as_str(), o.2)).collect::<Vec<_>>(), [("b", 2)], "b runs itself, attempt 2");
}

const PREP_THEN_ANSWER: &str = r#"
apiVersion: flowmesh/v1
kind: Workflow
metadata: {name: ahead}
spec:
  stages:
    - {name: prep, spec: {taskType: echo, data: {type: list, items: [x]}}}
    - name: answer
      spec:
        taskType: inference
        model: {source: {type: huggingface, identifier: Qwen/Qwen3-0.6B}}
        data: {type: list, items: [hello]}
"#;

#[test]
fn the_router_asks_an_idle_capable_worker_to_prewarm_a_model_a_stage_will_need() {
    let fleet = vec![worker("w1", &["echo"]), worker("w2", &["inference"]), worker("w3", &["inference"])];
    let mut s = Scenario::new(PREP_THEN_ANSWER, fleet.clone());
    s.route();
    let hints: Vec<(String, String)> = s
        .log
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::WorkerPrewarmRequested(p) => Some((p.worker_id.clone(), p.model.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(hints, [("w2".to_owned(), "Qwen/Qwen3-0.6B".to_owned())], "one idle capable worker, lowest id");
    s.route();
    assert_eq!(s.kinds().iter().filter(|k| **k == "worker.prewarm_requested").count(), 1, "asked once per model");

    // A model some worker already holds warm needs no hint.
    let mut warm = fleet;
    warm[2].warm_models = vec![flowmesh_domain::fleet::WarmModel {
        id: "Qwen/Qwen3-0.6B".into(),
        size_bytes: 1,
        state: flowmesh_domain::fleet::WarmState::Cached,
    }];
    let mut s = Scenario::new(PREP_THEN_ANSWER, warm);
    s.route();
    assert!(!s.kinds().contains(&"worker.prewarm_requested"));
}

const THREE_PARALLEL: &str = r#"
apiVersion: flowmesh/v1
kind: Workflow
metadata: {name: three}
spec:
  taskType: echo
  graph:
    nodes:
      - {name: a, spec: {data: {type: list, items: [a]}}}
      - {name: b, spec: {data: {type: list, items: [b]}}}
      - {name: c, spec: {data: {type: list, items: [c]}, workerTags: [special]}}
"#;

/// A busy backlog is not placed again round after round while every slot of its type stays
/// taken; the fleet changing under it, or a slot freeing, is noticed at once. (`route` also
/// checks every round against a router that remembers nothing.)
#[test]
fn a_busy_backlog_is_placed_again_only_when_a_slot_frees_or_the_fleet_changes() {
    let mut special = worker("w2", &["echo"]);
    special.tags = vec!["special".into()];
    let mut s = Scenario::new(THREE_PARALLEL, vec![worker("w1", &["echo"]), special]);
    let sent = s.route();
    let on: BTreeMap<String, String> = sent.iter().map(|(w, stage, _, _)| (stage.clone(), w.clone())).collect();
    assert_eq!(on.keys().collect::<Vec<_>>(), ["a", "b"], "{sent:?}");
    let hinted = |s: &Scenario| -> Vec<String> { s.hints.iter().map(|h| h.task.stage.clone()).collect() };
    assert_eq!(hinted(&s), ["c"]);
    s.now += 1_000;
    assert!(s.route().is_empty());
    assert_eq!(hinted(&s), ["c"], "told once");

    // The only worker with the tag leaves while the other is full: c has no capable worker now,
    // which is stored (its grace clock starts), and the task it held is requeued.
    let tagged = s.fleet.iter().position(|w| w.id == "w2").expect("w2");
    s.fleet.remove(tagged);
    s.now += 1_000;
    s.route();
    let c = s.state.task("wf-1-c").unwrap();
    assert_eq!((c.status, c.unplaceable_since_ms.is_some()), (TaskStatus::Pending, true), "{:?}", s.kinds());
    let held_by_w2 = if on["a"] == "w2" { "a" } else { "b" };
    assert_eq!(s.state.task(&format!("wf-1-{held_by_w2}")).unwrap().attempt, 2, "requeued from the lost worker");

    // w1's task ends: its slot goes to the requeued task at once.
    let on_w1 = if held_by_w2 == "a" { "b" } else { "a" };
    s.complete("w1", on_w1, 1, json!({"ok": true}));
    s.now += 1_000;
    let sent = s.route();
    assert_eq!(
        sent.iter().map(|(w, stage, attempt, _)| (w.as_str(), stage.as_str(), *attempt)).collect::<Vec<_>>(),
        [("w1", held_by_w2, 2)]
    );
}

/// A worker that stops cleanly hands back the orders waiting in its queue unrun: a task it held
/// that never reported a start is requeued without spending an attempt (even its only one), and
/// the worker is not marked as having failed it. What it started, and what a worker that vanished
/// held, spend their attempt as before.
#[test]
fn a_task_handed_back_unrun_by_a_cleanly_stopped_worker_keeps_its_attempts() {
    const ONE_TRY: &str = "apiVersion: flowmesh/v1\nkind: EchoTask\nmetadata: {name: one}\nspec:\n  taskType: echo\n  maxAttempts: 1\n  data: {type: list, items: [a]}\n";
    // (how the worker left, whether the task reported a start) → what the router decides.
    let cases = [(true, false, Some(flowmesh_domain::state::REQUEUED_UNRUN)), (true, true, None), (false, false, None)];
    for (clean_stop, started, requeued) in cases {
        let mut s = Scenario::new(ONE_TRY, vec![worker("w1", &["echo"]), worker("w2", &["echo"])]);
        let held = s.route()[0].0.clone();
        if started {
            s.apply(EventBody::TaskStarted(TaskStarted { task: s.tref("main", 1), worker_id: held.clone() }));
        }
        s.fleet.retain(|w| w.id != held);
        if clean_stop {
            s.index.depart(&held);
        } else {
            s.index.remove(&held);
        }
        let actions = decide_with(&s.state, &mut s.index, s.now, &s.config, &mut s.requests);
        let [Action::Publish(body)] = actions.as_slice() else { panic!("one decision: {actions:?}") };
        let case = (clean_stop, started);
        match (body, requeued) {
            (EventBody::TaskRequeued(r), Some(reason)) => {
                assert_eq!(
                    (r.reason.as_str(), r.task.attempt, r.worker_id.as_deref()),
                    (reason, 2, Some(held.as_str()))
                );
            }
            (EventBody::TaskFailed(f), None) => assert_eq!(f.reason, FailureReason::WorkerLost, "{case:?}"),
            _ => panic!("{case:?}: {body:?}"),
        }
        s.apply(body.clone());
        if requeued.is_none() {
            assert_eq!(s.status("main"), TaskStatus::Failed, "{case:?}: its one attempt is spent");
            continue;
        }
        let t = s.state.task("wf-1-main").unwrap();
        assert_eq!((t.status, t.attempt, t.counted_attempts()), (TaskStatus::Waiting, 2, 1));
        assert!(t.failed_on.is_empty(), "not the worker's failure: {:?}", t.failed_on);
        // The new attempt runs elsewhere and is the one that counts: failing, it is not retried.
        let sent = s.route();
        assert_eq!((sent.len(), sent[0].2), (1, 2));
        assert_ne!(sent[0].0, held);
        s.fail(&sent[0].0, "main", 2, true);
        assert_eq!(s.status("main"), TaskStatus::Failed, "one attempt ran, the only one allowed");
    }
}

/// An order waiting in one worker's queue while a slot that could run it is free on another is
/// asked back (from the second look in a row on); given back unrun, it is placed
/// again on the free slot without spending an attempt, even its only one. An order that started,
/// or one with no free slot elsewhere, is left where it is; a worker that keeps giving a task
/// back spends its attempts once `UNRUN_AT_MOST` is reached.
#[test]
fn a_queued_order_is_asked_back_when_a_slot_elsewhere_frees_and_placed_there_unspent() {
    const TWO: &str = "apiVersion: flowmesh/v1\nkind: Workflow\nmetadata: {name: two}\nspec:\n  taskType: echo\n  maxAttempts: 1\n  graph:\n    nodes:\n      - {name: a, spec: {data: {type: list, items: [a]}}}\n      - {name: b, spec: {data: {type: list, items: [b]}}}\n";
    let queueing = || {
        let mut w = worker("w1", &["echo"]);
        w.prefetch = 1;
        w
    };
    // (w2 joins with a free slot, the queued task reports a start) → asked back at the second look.
    for (w2_free, started) in [(true, false), (false, false), (true, true)] {
        let case = (w2_free, started);
        let mut s = Scenario::new(TWO, vec![queueing()]);
        let sent = s.route();
        assert_eq!(sent.iter().map(|o| (o.0.as_str(), o.1.as_str())).collect::<Vec<_>>(), [("w1", "a"), ("w1", "b")]);
        s.apply(EventBody::TaskStarted(TaskStarted { task: s.tref("a", 1), worker_id: "w1".into() }));
        if started {
            s.apply(EventBody::TaskStarted(TaskStarted { task: s.tref("b", 1), worker_id: "w1".into() }));
        }
        let mut w2 = worker("w2", &["echo"]);
        if !w2_free {
            w2.supported_task_types = vec!["python".into()];
        }
        s.fleet.push(w2);
        assert!(s.route().is_empty(), "{case:?}: nothing new to place");
        let mut releases = Releases::default();
        let first = releases.look(&s.state, &s.index, &s.config, s.now);
        let second = releases.look(&s.state, &s.index, &s.config, s.now);
        let third = releases.look(&s.state, &s.index, &s.config, s.now);
        if !w2_free || started {
            assert!(first.is_empty() && second.is_empty() && third.is_empty(), "{case:?}: {second:?}");
            continue;
        }
        assert!(first.is_empty(), "not at the first look: {first:?}");
        assert_eq!(second, [Release { worker_id: "w1".into(), task_id: "wf-1-b".into() }]);
        assert_eq!(third, second, "asked again while it waits");
        s.give_back("w1", "b", 1);
        let t = s.state.task("wf-1-b").unwrap();
        assert_eq!((t.status, t.counted_attempts()), (TaskStatus::Retrying, 0), "no attempt spent");
        assert!(t.failed_on.is_empty(), "not w1's failure: {:?}", t.failed_on);
        assert!(s.route().is_empty(), "requeued first");
        let sent = s.route();
        assert_eq!(sent.iter().map(|o| (o.0.as_str(), o.1.as_str(), o.2)).collect::<Vec<_>>(), [("w2", "b", 2)]);
        s.complete("w2", "b", 2, json!({"ok": true}));
        assert_eq!(s.status("b"), TaskStatus::Completed);
    }

    // Given back again and again (here from a slot: the fold cannot tell): believed up to the
    // limit, then an attempt like any failure.
    let mut two_slots = worker("w1", &["echo"]);
    two_slots.slots.batch.total = 2;
    let mut s = Scenario::new(TWO, vec![two_slots]);
    s.route();
    for attempt in 1..=flowmesh_domain::state::UNRUN_AT_MOST + 1 {
        let task = s.state.task("wf-1-b").unwrap();
        assert_eq!((task.status, task.attempt), (TaskStatus::Dispatched, attempt));
        s.give_back("w1", "b", attempt);
        s.route();
        s.route();
    }
    assert_eq!(s.status("b"), TaskStatus::Failed, "its one counted attempt spent: {:?}", s.kinds());
}

/// With no slot free anywhere, an order that has waited `queue_patience_ms` in one worker's
/// queue while another worker could run it is asked back; given back, it waits in the router,
/// never in a queue again (the queue place it left is free), and takes the first slot to free.
#[test]
fn a_queued_order_that_waited_its_patience_takes_the_first_slot_to_free_anywhere() {
    const THREE: &str = "apiVersion: flowmesh/v1\nkind: Workflow\nmetadata: {name: three}\nspec:\n  taskType: echo\n  graph:\n    nodes:\n      - {name: a, spec: {data: {type: list, items: [a]}}}\n      - {name: b, spec: {data: {type: list, items: [b]}}}\n      - {name: c, spec: {data: {type: list, items: [c]}}}\n";
    let mut w1 = worker("w1", &["echo"]);
    w1.prefetch = 1;
    let mut s = Scenario::new(THREE, vec![w1]);
    let sent = s.route();
    assert_eq!(sent.iter().map(|o| (o.0.as_str(), o.1.as_str())).collect::<Vec<_>>(), [("w1", "a"), ("w1", "b")]);
    s.apply(EventBody::TaskStarted(TaskStarted { task: s.tref("a", 1), worker_id: "w1".into() }));
    s.fleet.push(worker("w2", &["echo"]));
    let sent = s.route();
    assert_eq!(sent.iter().map(|o| (o.0.as_str(), o.1.as_str())).collect::<Vec<_>>(), [("w2", "c")]);
    s.apply(EventBody::TaskStarted(TaskStarted { task: s.tref("c", 1), worker_id: "w2".into() }));

    let mut releases = Releases::default();
    let patience = s.config.queue_patience_ms;
    assert!(releases.look(&s.state, &s.index, &s.config, s.now).is_empty(), "first look");
    s.now += patience - 1;
    assert!(releases.look(&s.state, &s.index, &s.config, s.now).is_empty(), "within its patience");
    s.now += 1;
    assert_eq!(
        releases.look(&s.state, &s.index, &s.config, s.now),
        [Release { worker_id: "w1".into(), task_id: "wf-1-b".into() }]
    );
    s.give_back("w1", "b", 1);
    assert!(s.route().is_empty(), "requeued");
    assert!(s.route().is_empty(), "not into w1's queue again, though its place is free");
    assert_eq!(s.status("b"), TaskStatus::Waiting);
    assert!(releases.look(&s.state, &s.index, &s.config, s.now).is_empty(), "nothing queued now");
    s.complete("w2", "c", 1, json!({"ok": true}));
    let sent = s.route();
    assert_eq!(sent.iter().map(|o| (o.0.as_str(), o.1.as_str(), o.2)).collect::<Vec<_>>(), [("w2", "b", 2)]);
}
