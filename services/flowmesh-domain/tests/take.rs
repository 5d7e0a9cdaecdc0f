//! `work::take`: what a worker makes of a message of its work queue. One table.

use flowmesh_domain::EventBody;
use flowmesh_domain::event::{Event, TaskDispatched, TaskRef, TaskStarted};
use flowmesh_domain::work::{WorkOrder, take};
use serde_json::json;

fn order(spec: serde_json::Value) -> WorkOrder {
    WorkOrder {
        workflow_id: "wf-1".into(),
        task_id: "wf-1-main".into(),
        stage: "main".into(),
        attempt: 1,
        task_type: "echo".into(),
        spec: spec.into(),
        upstream: Default::default(),
        upstream_artifacts: Default::default(),
        upstream_results: Default::default(),
    }
}

fn task() -> TaskRef {
    TaskRef { workflow_id: "wf-1".into(), task_id: "wf-1-main".into(), stage: "main".into(), attempt: 1 }
}

fn dispatch(worker: &str, order: Option<WorkOrder>) -> Event {
    let body = EventBody::TaskDispatched(TaskDispatched {
        task: task(),
        worker_id: worker.into(),
        task_type: "echo".into(),
        message: "placed".into(),
        order: order.map(Box::new),
    });
    Event::new(body, "2026-11-24T00:00:00Z".into(), 0)
}

fn json(e: &impl serde::Serialize) -> Vec<u8> {
    serde_json::to_vec(e).unwrap()
}

/// What `take` returns, reduced to what a row checks: the order's spec, no order, or a piece of
/// the error.
#[derive(Debug, PartialEq)]
enum Want {
    Order(serde_json::Value),
    OnWorkSubject,
    Refused(&'static str),
}

#[test]
fn a_worker_takes_only_orders_meant_for_it() {
    let spec = json!({"data": {"items": [1]}});
    let started = Event::new(
        EventBody::TaskStarted(TaskStarted { task: task(), worker_id: "w1".into() }),
        "2026-11-24T00:00:00Z".into(),
        0,
    );
    let rows: Vec<(&str, Option<&str>, Vec<u8>, Want)> = vec![
        (
            "a dispatch carrying its order",
            Some("w1.wf-1.wf-1-main.task.dispatched"),
            json(&dispatch("w1", Some(order(spec.clone())))),
            Want::Order(spec.clone()),
        ),
        (
            "a dispatch whose order holds a secret",
            Some("w1.wf-1.wf-1-main.task.dispatched"),
            json(&dispatch("w1", None)),
            Want::OnWorkSubject,
        ),
        ("an order on the work subject", None, json(&order(spec.clone())), Want::Order(spec.clone())),
        (
            "a dispatch for another worker",
            Some("w2.wf-1.wf-1-main.task.dispatched"),
            json(&dispatch("w2", Some(order(spec.clone())))),
            Want::Refused("for worker w2"),
        ),
        (
            "a body naming another worker than its subject",
            Some("w1.wf-1.wf-1-main.task.dispatched"),
            json(&dispatch("w2", Some(order(spec.clone())))),
            Want::Refused("unreadable dispatch"),
        ),
        (
            "a worker's report where a dispatch was expected",
            Some("w1.wf-1.wf-1-main.task.started"),
            json(&started),
            Want::Refused("not a dispatch"),
        ),
        (
            "garbage on the dispatch subject",
            Some("w1.wf-1.wf-1-main.task.dispatched"),
            b"{".to_vec(),
            Want::Refused("unreadable"),
        ),
        ("garbage on the work subject", None, b"[]".to_vec(), Want::Refused("not a work order")),
    ];
    for (what, suffix, payload, want) in rows {
        let got = match take("w1", suffix, &payload) {
            Ok(Some(order)) => Want::Order(serde_json::Value::clone(&order.spec)),
            Ok(None) => Want::OnWorkSubject,
            Err(e) => match &want {
                Want::Refused(piece) if e.contains(piece) => Want::Refused(piece),
                _ => panic!("{what}: unexpected error {e}"),
            },
        };
        assert_eq!(got, want, "{what}");
    }
}

/// An order with a secret placeholder never goes into the log.
#[test]
fn an_order_holding_a_secret_says_so() {
    assert!(!order(json!({"model": "m"})).needs_secrets());
    assert!(order(json!({"apiKey": flowmesh_domain::secret::REDACTED})).needs_secrets());
}
