//! A router's fold forgets the workflows that ended (`State::forget_ended`): it holds what runs,
//! not the whole history, and still refuses what it refused while it held them.

use flowmesh_domain::event::{
    Event, EventBody, SubmissionAccepted, SubmissionRef, SubmissionRejected, TaskCompleted, TaskRef, WorkflowsPurged,
};
use flowmesh_domain::fleet::WorkerSnapshot;
use flowmesh_domain::ids::WorkflowIds;
use flowmesh_domain::problem::Problem;
use flowmesh_domain::schedule::{Action, Config, decide};
use flowmesh_domain::state::{Applied, State, TaskStatus, WorkflowStatus};
use flowmesh_domain::validate_submission;
use serde_json::json;
mod common;
use common::ASK;

fn apply(state: &mut State, body: EventBody) -> Applied {
    apply_at(state, body, "t")
}

/// As written at `time` (RFC 3339): retention counts from an end's time.
fn apply_at(state: &mut State, body: EventBody, time: &str) -> Applied {
    state.apply(&Event::new(body, time.into(), 0))
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

/// The fleet of one inference worker, `w1`, with `slots` batch slots.
fn one_worker(slots: u32) -> [WorkerSnapshot; 1] {
    let mut worker = common::worker("w1", &["inference"], 8, 32, &[]);
    worker.slots.batch.total = slots;
    [worker]
}

/// One round of the router, every action folded back in.
fn route(state: &mut State, fleet: &[WorkerSnapshot]) {
    route_at(state, fleet, "t")
}

/// One round of the router, its events written at `time`.
fn route_at(state: &mut State, fleet: &[WorkerSnapshot], time: &str) {
    let config = Config { no_worker_grace_ms: 60_000, ..Default::default() };
    for action in decide(state, fleet, 1_000, &config) {
        match action {
            Action::Publish(body) => {
                apply_at(state, body, time);
            }
            Action::Dispatch { event, .. } => {
                apply_at(state, EventBody::TaskDispatched(event), time);
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
    let fleet = one_worker(1);
    // Whether the fold had forgotten once before the merge: the first time, it finds the
    // workflows with merged tasks by walking what runs; after that, it notes each merge as it
    // is folded.
    for forgot_before in [false, true] {
        let mut state = State::default();
        apply(&mut state, accepted(1));
        apply(&mut state, accepted(2));
        if forgot_before {
            assert_eq!(state.forget_ended(), 0);
        }
        route(&mut state, &fleet);
        assert_eq!(state.task("wf-2-a").map(|t| t.status), Some(TaskStatus::Merged));

        // The leader's workflow ends first; the merged task still needs its result. So it
        // stays, in this fold, in one restored from its checkpoint, and in one restored from a
        // checkpoint written before the fold noted merges.
        apply(&mut state, completed("wf-1", "w1"));
        assert_eq!(state.workflows["wf-1"].status, WorkflowStatus::Completed);
        let mut older = serde_json::to_value(&state).unwrap();
        older.as_object_mut().unwrap().remove("merging");
        let mut restored: State = serde_json::from_value(serde_json::to_value(&state).unwrap()).unwrap();
        let mut older: State = serde_json::from_value(older).unwrap();
        for (s, which) in [(&mut state, "the fold"), (&mut restored, "restored"), (&mut older, "an older checkpoint")] {
            assert_eq!(s.forget_ended(), 0, "{which}, forgot before the merge: {forgot_before}");
            assert!(s.task("wf-1-a").is_some(), "{which}");
        }
        finish_merged(state, &fleet);
    }
}

/// The second half of `a_shared_execution_s_workflow_is_kept_until_its_merged_tasks_took_their_result`:
/// the merged task takes its result, its workflow ends, and both workflows go.
fn finish_merged(mut state: State, fleet: &[WorkerSnapshot]) {
    // The router hands the result on, then ends the merged task's workflow; both go.
    route(&mut state, fleet);
    assert_eq!(state.task("wf-2-a").map(|t| t.status), Some(TaskStatus::Completed));
    route(&mut state, fleet);
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

/// `2026-11-26T10:<minute>:<second>Z`.
fn at(minute: u32, second: u32) -> String {
    format!("2026-11-26T10:{minute:02}:{second:02}.000Z")
}

/// Milliseconds since the epoch of 10:00 plus `minutes`.
fn ms(minutes: u64) -> u64 {
    flowmesh_domain::trace::unix_ms(&at(0, 0)).unwrap() + minutes * 60_000
}

fn ids(list: &[&str]) -> WorkflowIds {
    let mut set = WorkflowIds::default();
    list.iter().for_each(|id| set.insert(id));
    set
}

#[test]
fn retention_purges_what_ended_before_the_kept_period_and_nothing_a_running_workflow_needs() {
    let fleet = one_worker(1);
    let mut state = State::default();
    // wf-1 completes at 10:00:30; wf-2 is rejected at 10:01:10; wf-3 runs; wf-4 and wf-5 ask the
    // same, so wf-5's task shares wf-4's execution.
    apply_at(&mut state, accepted(1), &at(0, 0));
    route_at(&mut state, &fleet, &at(0, 1));
    apply_at(&mut state, completed("wf-1", "w1"), &at(0, 30));
    apply_at(&mut state, rejected(2), &at(1, 10));
    for seq in [4, 5] {
        apply_at(&mut state, accepted(seq), &at(0, 40));
    }
    route_at(&mut state, &fleet, &at(0, 41));
    assert_eq!(state.task("wf-5-a").map(|t| t.status), Some(TaskStatus::Merged));
    apply_at(&mut state, completed("wf-4", "w1"), &at(0, 50));
    // wf-5's task takes wf-4's result; wf-5 itself has not ended yet.
    route_at(&mut state, &fleet, &at(0, 51));
    assert_eq!(state.task("wf-5-a").map(|t| t.status), Some(TaskStatus::Completed));
    assert_eq!(state.workflows["wf-5"].status, WorkflowStatus::Running);
    apply_at(&mut state, accepted(3), &at(2, 0));

    // Ended but still held: nothing is due until the fold dropped it. The same in a fold
    // restored from a checkpoint written before the fold noted merges: wf-5's task took its
    // result already, and wf-5 still counts as sharing wf-4's execution.
    assert_eq!(state.due_for_purge(ms(60), 100), Vec::<String>::new());
    let mut older = serde_json::to_value(&state).unwrap();
    older.as_object_mut().unwrap().remove("merging");
    let mut older: State = serde_json::from_value(older).unwrap();
    state.forget_ended();
    older.forget_ended();
    assert!(!state.workflows.contains_key("wf-4"), "wf-4 is forgotten");
    // (ended before, limit, due): a minute is due once its last end (10:00:50, wf-4's) lies
    // before; wf-4 holds the execution whose result wf-5, still running, took; wf-3 runs.
    for (before, limit, due) in [
        (ms(0), 100, vec![]),
        (ms(0) + 50_000, 100, vec![]),
        (ms(0) + 50_001, 100, vec!["wf-1"]),
        (ms(1) + 10_000, 100, vec!["wf-1"]),
        (ms(1) + 10_001, 100, vec!["wf-1", "wf-2"]),
        (ms(2), 1, vec!["wf-1"]),
        (ms(60), 100, vec!["wf-1", "wf-2"]),
    ] {
        assert_eq!(state.due_for_purge(before, limit), due, "ended before {before}, up to {limit}");
        assert_eq!(older.due_for_purge(before, limit), due, "an older checkpoint, ended before {before}");
    }
    // Once wf-5 ends (10:03), wf-4 may go with it, and no sooner: wf-4's files are wf-5's
    // results too, so wf-4 counts as ended when wf-5 did.
    route_at(&mut state, &fleet, &at(3, 0));
    assert_eq!(state.workflows["wf-5"].status, WorkflowStatus::Completed);
    state.forget_ended();
    assert_eq!(state.due_for_purge(ms(3), 100), ["wf-1", "wf-2"]);
    assert_eq!(state.due_for_purge(ms(4), 100), ["wf-1", "wf-2", "wf-4", "wf-5"]);

    // The record of a purge takes them out of what is due, and survives a checkpoint. The
    // fold keeps what the latest record's round removes, and only that: each record is stored
    // once the round before it removed all it named.
    let record = |all: &[&str], removing: &[&str]| {
        EventBody::WorkflowsPurged(WorkflowsPurged { workflows: ids(all), removing: ids(removing) })
    };
    assert_eq!(apply_at(&mut state, record(&["wf-1", "wf-2"], &["wf-1", "wf-2"]), &at(5, 0)), Applied::Changed);
    assert_eq!(apply_at(&mut state, record(&["wf-1", "wf-2", "wf-4"], &["wf-4"]), &at(5, 1)), Applied::Changed);
    assert_eq!(state.due_for_purge(ms(60), 100), ["wf-5"]);
    assert_eq!(state.removing(), &ids(&["wf-4"]));
    let mut json = serde_json::to_value(&state).unwrap();
    let restored: State = serde_json::from_value(json.clone()).unwrap();
    assert_eq!(restored, state);
    assert_eq!(restored.due_for_purge(ms(60), 100), ["wf-5"]);
    assert!(restored.purged().contains("wf-4") && !restored.purged().contains("wf-5"));
    assert_eq!(restored.removing(), &ids(&["wf-4"]));
    // A checkpoint from before retention knows no ends: it does not read, and the log is replayed.
    json.as_object_mut().unwrap().remove("unpurged");
    assert!(serde_json::from_value::<State>(json).is_err());
}

#[test]
fn a_reader_that_took_part_of_a_purged_workflow_drops_it_at_the_record() {
    let fleet = [common::worker("w1", &["inference"], 8, 32, &[])];
    // A reader behind the purge: it folded wf-1's verdict and dispatch, then the rest of wf-1's
    // events were purged, and the record is what it reads next.
    let mut behind = State::default();
    apply(&mut behind, accepted(1));
    route(&mut behind, &fleet);
    apply(&mut behind, accepted(2));
    assert_eq!(behind.task("wf-1-a").map(|t| t.status), Some(TaskStatus::Dispatched));
    assert!(behind.workers_holding_tasks().contains("w1"));
    let record = EventBody::WorkflowsPurged(WorkflowsPurged { workflows: ids(&["wf-1"]), removing: ids(&["wf-1"]) });
    assert_eq!(apply(&mut behind, record), Applied::Changed);
    assert!(behind.workflow("wf-1").is_none() && behind.task("wf-1-a").is_none());
    assert_eq!(behind.running_workflows().map(|wf| wf.workflow_id.as_str()).collect::<Vec<_>>(), ["wf-2"]);
    assert!(behind.workers_holding_tasks().is_empty(), "nothing pins w1 any more");
    // What of it still comes is ignored, a verdict included.
    assert_eq!(apply(&mut behind, completed("wf-1", "w1")), Applied::Ignored("unknown task"));
    assert_eq!(apply(&mut behind, accepted(1)), Applied::Ignored("workflow already decided"));
    assert_eq!(behind.due_for_purge(u64::MAX, 100), Vec::<String>::new());

    // A reader that starts after the purge sees only the record, and agrees.
    let mut fresh = State::default();
    apply(&mut fresh, accepted(2));
    apply(
        &mut fresh,
        EventBody::WorkflowsPurged(WorkflowsPurged { workflows: ids(&["wf-1"]), removing: ids(&["wf-1"]) }),
    );
    assert_eq!(fresh.running_workflows().count(), 1);
    assert_eq!(apply(&mut fresh, accepted(1)), Applied::Ignored("workflow already decided"));
    assert_eq!(fresh.decided_workflows(), behind.decided_workflows());
}

#[test]
fn the_running_workflows_walked_in_place_are_those_walked_in_order() {
    let fleet = one_worker(8);
    let mut state = State::default();
    for seq in 1..=5 {
        // Each asks something else, so that none is merged into another's execution.
        let EventBody::SubmissionAccepted(mut accepted) = accepted(seq) else { unreachable!() };
        let spec = std::sync::Arc::make_mut(&mut accepted.workflow.tasks[0].spec);
        spec["data"]["items"] = json!([format!("question {seq}")]);
        apply(&mut state, EventBody::SubmissionAccepted(accepted));
    }
    route(&mut state, &fleet);
    // Two end and are not yet forgotten; one is rejected.
    apply(&mut state, completed("wf-2", "w1"));
    apply(&mut state, completed("wf-4", "w1"));
    apply(&mut state, rejected(6));
    let ids = |walk: &mut dyn Iterator<Item = &flowmesh_domain::state::WorkflowState>| {
        let mut ids: Vec<String> = walk.map(|wf| wf.workflow_id.clone()).collect();
        ids.sort();
        ids
    };
    let in_order = ids(&mut state.running_workflows());
    assert_eq!(in_order, ["wf-1", "wf-3", "wf-5"]);
    assert_eq!(ids(&mut state.running_workflows_unordered()), in_order, "ended and rejected workflows are left out");
    state.forget_ended();
    assert_eq!(ids(&mut state.running_workflows_unordered()), in_order);
}
