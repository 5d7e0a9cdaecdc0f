//! A router's fold forgets the workflows that ended (`State::forget_ended`): it holds what runs,
//! not the whole history, and still refuses what it refused while it held them.

use flowmesh_domain::event::{
    Event, EventBody, SubmissionAccepted, SubmissionRef, SubmissionRejected, TaskCompleted, TaskRef,
};
use flowmesh_domain::fleet::WorkerSnapshot;
use flowmesh_domain::problem::Problem;
use flowmesh_domain::schedule::{Action, Config, decide};
use flowmesh_domain::state::{Applied, State, TaskStatus, WorkflowStatus};
use flowmesh_domain::validate_submission;
use serde_json::json;
mod common;
use common::ASK;

fn apply(state: &mut State, body: EventBody) -> Applied {
    state.apply(&Event::new(body, "t".into(), 0))
}

fn accepted(seq: u64) -> EventBody {
    let workflow_id = format!("wf-{seq}");
    let workflow = validate_submission(ASK.as_bytes(), &workflow_id).unwrap_or_else(|p| panic!("{p:?}"));
    EventBody::SubmissionAccepted(SubmissionAccepted {
        workflow_id,
        submission: SubmissionRef { stream: "FLOWMESH_SUBMISSIONS".into(), seq, msg_id: None, validated_by: None },
        task_ids: workflow.tasks.iter().map(|t| t.task_id.clone()).collect(),
        workflow,
    })
}

fn rejected(seq: u64) -> EventBody {
    EventBody::SubmissionRejected(SubmissionRejected {
        workflow_id: format!("wf-{seq}"),
        submission: SubmissionRef { stream: "FLOWMESH_SUBMISSIONS".into(), seq, msg_id: None, validated_by: None },
        errors: vec![Problem::new("/spec", "not a valid spec")],
    })
}

fn completed(workflow: &str, worker: &str) -> EventBody {
    EventBody::TaskCompleted(TaskCompleted {
        task: TaskRef { workflow_id: workflow.into(), task_id: format!("{workflow}-a"), stage: "a".into(), attempt: 1 },
        worker_id: worker.into(),
        result: Some(json!({"items": [{"output": "hi"}]})),
        result_object: None,
        artifacts: Vec::new(),
        upload_ms: None,
        started_at: None,
    })
}

/// One round of the router, every action folded back in.
fn route(state: &mut State, fleet: &[WorkerSnapshot]) {
    let config = Config { no_worker_grace_ms: 60_000, ..Default::default() };
    for action in decide(state, fleet, 1_000, &config) {
        match action {
            Action::Publish(body) => {
                apply(state, body);
            }
            Action::Dispatch { event, .. } => {
                apply(state, EventBody::TaskDispatched(event));
            }
            Action::Hint(_) => {}
        }
    }
}

#[test]
fn an_ended_workflow_is_forgotten_and_its_second_verdict_and_late_reports_are_still_ignored() {
    let fleet = [common::worker("w1", &["inference"], 8, 32, &[])];
    let mut state = State::default();
    apply(&mut state, accepted(1));
    route(&mut state, &fleet);
    apply(&mut state, completed("wf-1", "w1"));
    assert_eq!(state.workflows["wf-1"].status, WorkflowStatus::Completed);

    assert_eq!(state.forget_ended(), 1);
    assert_eq!(state.forget_ended(), 0, "each ended workflow is dropped once");
    assert!(state.workflows.is_empty() && state.task("wf-1-a").is_none());
    assert_eq!(state.decided_workflows(), 1);
    // A checkpoint keeps what was forgotten.
    let mut restored: State = serde_json::from_value(serde_json::to_value(&state).unwrap()).unwrap();
    for s in [&mut state, &mut restored] {
        assert_eq!(apply(s, accepted(1)), Applied::Ignored("workflow already decided"), "a second verdict");
        assert_eq!(apply(s, completed("wf-1", "w1")), Applied::Ignored("unknown task"), "a late report");
        route(s, &fleet);
        assert!(s.workflows.is_empty() && s.running_workflows().next().is_none(), "nothing runs again");
    }
}

#[test]
fn a_shared_execution_s_workflow_is_kept_until_its_merged_tasks_took_their_result() {
    let mut worker = common::worker("w1", &["inference"], 8, 32, &[]);
    worker.slots.batch.total = 1;
    let fleet = [worker];
    let mut state = State::default();
    apply(&mut state, accepted(1));
    apply(&mut state, accepted(2));
    route(&mut state, &fleet);
    assert_eq!(state.task("wf-2-a").map(|t| t.status), Some(TaskStatus::Merged));

    // The leader's workflow ends first; the merged task still needs its result.
    apply(&mut state, completed("wf-1", "w1"));
    assert_eq!(state.workflows["wf-1"].status, WorkflowStatus::Completed);
    assert_eq!(state.forget_ended(), 0);
    assert!(state.task("wf-1-a").is_some());

    // The router hands the result on, then ends the merged task's workflow; both go.
    route(&mut state, &fleet);
    assert_eq!(state.task("wf-2-a").map(|t| t.status), Some(TaskStatus::Completed));
    route(&mut state, &fleet);
    assert_eq!(state.workflows["wf-2"].status, WorkflowStatus::Completed);
    // The router frees what it forgot off its loop: the dropped workflows are handed over whole.
    let mut dropped = Vec::new();
    assert_eq!(state.forget_ended_into(&mut dropped), 2);
    assert!(state.workflows.is_empty());
    let ids: Vec<_> = dropped.iter().map(|wf| (wf.workflow_id.as_str(), wf.tasks.len())).collect();
    assert_eq!(ids, [("wf-1", 1), ("wf-2", 1)]);
}

#[test]
fn a_workflow_keeps_its_first_verdict_and_rejections_are_forgotten_too() {
    let mut state = State::default();
    assert_eq!(apply(&mut state, rejected(2)), Applied::Changed);
    assert_eq!(apply(&mut state, accepted(2)), Applied::Ignored("workflow already rejected"));
    assert_eq!(apply(&mut state, accepted(3)), Applied::Changed);
    assert_eq!(apply(&mut state, rejected(3)), Applied::Ignored("workflow already accepted"));
    assert!(state.workflows.contains_key("wf-3") && state.rejected.keys().collect::<Vec<_>>() == ["wf-2"]);

    // The rejection goes; the running workflow stays.
    assert_eq!(state.forget_ended(), 1);
    assert!(state.rejected.is_empty() && state.workflows.contains_key("wf-3"));
    assert_eq!(state.decided_workflows(), 2);
    let mut restored: State = serde_json::from_value(serde_json::to_value(&state).unwrap()).unwrap();
    for s in [&mut state, &mut restored] {
        assert_eq!(apply(s, accepted(2)), Applied::Ignored("workflow already decided"));
        assert_eq!(apply(s, rejected(2)), Applied::Ignored("workflow already decided"));
        assert!(s.rejected.is_empty() && !s.workflows.contains_key("wf-2"));
    }
}

#[test]
fn a_checkpoint_that_lists_forgotten_ids_still_reads() {
    let mut state = State::default();
    apply(&mut state, rejected(1));
    state.forget_ended();
    let mut json = serde_json::to_value(&state).unwrap();
    assert_eq!(json["forgotten"], json!({"ranges": [[1, 1]], "others": []}));
    // How a router before `WorkflowIds` wrote them.
    json["forgotten"] = json!(["wf-1"]);
    let mut older: State = serde_json::from_value(json).unwrap();
    assert_eq!(older, state);
    assert_eq!(apply(&mut older, accepted(1)), Applied::Ignored("workflow already decided"));
}
