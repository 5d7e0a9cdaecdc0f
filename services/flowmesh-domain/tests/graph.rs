//! Graph semantics as FlowMesh defines them: graph roots run side by side, stages chain,
//! `node_execution_order` epochs are barriers (and are validated), `selected_worker` names
//! only stages that exist.

use flowmesh_domain::validate_submission;

/// A document with `body` under `spec:` (echo tasks) and `hint` under `schedule_hint:`.
fn doc(hint: &str, body: &str) -> String {
    let hint = if hint.is_empty() {
        String::new()
    } else {
        format!("  annotations:\n    schedule_hint:\n{}", indent(hint, 6))
    };
    format!(
        "apiVersion: flowmesh/v1\nkind: Workflow\nmetadata:\n  name: g\n{hint}spec:\n  taskType: echo\n{}",
        indent(body, 2)
    )
}

fn indent(text: &str, n: usize) -> String {
    text.lines().map(|l| format!("{}{l}\n", " ".repeat(n))).collect()
}

enum Want {
    /// The tasks in dispatch order, each with its dependencies (sorted).
    Tasks(&'static [(&'static str, &'static [&'static str])]),
    /// (path, a fragment of the message) for each expected problem.
    Problems(&'static [(&'static str, &'static str)]),
}

fn check(name: &str, hint: &str, body: &str, want: Want) {
    let text = doc(hint, body);
    let result = validate_submission(text.as_bytes(), "wf-1");
    match (want, result) {
        (Want::Tasks(expected), Ok(wf)) => {
            let got: Vec<(String, Vec<String>)> = wf
                .tasks
                .iter()
                .map(|t| {
                    let mut deps = t.depends_on.clone();
                    deps.sort();
                    (t.stage.clone(), deps)
                })
                .collect();
            let expected: Vec<(String, Vec<String>)> =
                expected.iter().map(|(s, d)| (s.to_string(), d.iter().map(|x| x.to_string()).collect())).collect();
            assert_eq!(got, expected, "{name}\n{text}");
        }
        (Want::Problems(expected), Err(problems)) => {
            for (path, fragment) in expected {
                assert!(
                    problems.iter().any(|p| p.path == *path && p.message.contains(fragment)),
                    "{name}: expected a problem at {path} saying {fragment:?}, got {problems:#?}\n{text}"
                );
            }
        }
        (Want::Tasks(_), Err(problems)) => panic!("{name}: expected valid, got {problems:#?}\n{text}"),
        (Want::Problems(_), Ok(wf)) => panic!("{name}: expected problems, got {wf:#?}\n{text}"),
    }
}

const THREE_NODES: &str = "graph:\n  nodes:\n    - {name: a, spec: {data: {items: [a]}}}\n    - {name: b, spec: {data: {items: [b]}}}\n    - {name: c, dependsOn: [a], spec: {data: {items: [c]}}}\n";

#[test]
fn graph_roots_run_side_by_side_and_stages_chain() {
    check(
        "graph nodes without dependsOn are roots",
        "",
        THREE_NODES,
        Want::Tasks(&[("a", &[]), ("b", &[]), ("c", &["a"])]),
    );
    check(
        "an empty dependsOn is a root too",
        "",
        "graph:\n  nodes:\n    - {name: a, spec: {data: {items: [a]}}}\n    - {name: b, dependsOn: [], spec: {data: {items: [b]}}}\n",
        Want::Tasks(&[("a", &[]), ("b", &[])]),
    );
    check(
        "stages without dependsOn follow the previous stage",
        "",
        "stages:\n  - {name: a, spec: {data: {items: [a]}}}\n  - {name: b, spec: {data: {items: [b]}}}\n  - {name: c, spec: {data: {items: [c]}}}\n",
        Want::Tasks(&[("a", &[]), ("b", &["a"]), ("c", &["b"])]),
    );
}

#[test]
fn node_execution_order_epochs_are_barriers_in_the_listed_order() {
    check(
        "epochs: each waits for the whole previous epoch; listed order within an epoch",
        "node_execution_order:\n  - [b, a]\n  - [c]\n",
        THREE_NODES,
        Want::Tasks(&[("b", &[]), ("a", &[]), ("c", &["a", "b"])]),
    );
    check(
        "a flat list is one epoch: the listed order, no barriers",
        "node_execution_order: [c, b, a]\n",
        "graph:\n  nodes:\n    - {name: a, spec: {data: {items: [a]}}}\n    - {name: b, spec: {data: {items: [b]}}}\n    - {name: c, spec: {data: {items: [c]}}}\n",
        Want::Tasks(&[("c", &[]), ("b", &[]), ("a", &[])]),
    );
    check(
        "three epochs chain through the middle one",
        "node_execution_order: [[a], [b], [c]]\n",
        THREE_NODES,
        Want::Tasks(&[("a", &[]), ("b", &["a"]), ("c", &["a", "b"])]),
    );
}

#[test]
fn node_execution_order_must_name_every_stage_exactly_once() {
    check(
        "an unknown name",
        "node_execution_order: [[a, b], [c, d]]\n",
        THREE_NODES,
        Want::Problems(&[("/metadata/annotations/schedule_hint/node_execution_order/1/1", "unknown stage \"d\"")]),
    );
    check(
        "a name twice",
        "node_execution_order: [[a, b], [c, a]]\n",
        THREE_NODES,
        Want::Problems(&[("/metadata/annotations/schedule_hint/node_execution_order/1/1", "more than once")]),
    );
    check(
        "a stage left out",
        "node_execution_order: [[a], [c]]\n",
        THREE_NODES,
        Want::Problems(&[("/metadata/annotations/schedule_hint/node_execution_order", "missing: b")]),
    );
    check(
        "an epoch before the stage it depends on",
        "node_execution_order: [[c, b], [a]]\n",
        THREE_NODES,
        Want::Problems(&[("/spec/graph/nodes/2/dependsOn/0", "a later epoch")]),
    );
    check(
        "a dependency within one epoch",
        "node_execution_order: [[a, c, b]]\n",
        THREE_NODES,
        Want::Problems(&[("/spec/graph/nodes/2/dependsOn/0", "the same epoch")]),
    );
}

#[test]
fn selected_worker_may_name_only_existing_stages() {
    check(
        "a known stage",
        "selected_worker: {selected: {c: w1}}\n",
        THREE_NODES,
        Want::Tasks(&[("a", &[]), ("b", &[]), ("c", &["a"])]),
    );
    check(
        "an unknown stage",
        "selected_worker: {global: [w1], selected: {z: w2}}\n",
        THREE_NODES,
        Want::Problems(&[("/metadata/annotations/schedule_hint/selected_worker/selected/z", "not in the workflow")]),
    );
}
