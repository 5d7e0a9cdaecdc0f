//! A router's fold forgets the workflows that ended (`State::forget_ended`): it holds what runs,
//! not the whole history, and still refuses what it refused while it held them.

use flowmesh_domain::event::{Event, EventBody, SubmissionAccepted, SubmissionRef, TaskCompleted, TaskRef};
use flowmesh_domain::fleet::WorkerSnapshot;
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
    assert_eq!(state.accepted_workflows(), 1);
    // A checkpoint keeps what was forgotten.
    let mut restored: State = serde_json::from_value(serde_json::to_value(&state).unwrap()).unwrap();
    for s in [&mut state, &mut restored] {
        assert_eq!(apply(s, accepted(1)), Applied::Ignored("workflow already accepted"), "a second verdict");
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
    assert_eq!(state.forget_ended(), 2);
    assert!(state.workflows.is_empty());
}
