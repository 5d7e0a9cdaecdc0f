//! Hostile sizes: the graph checks stay bounded, and what is over the limits is rejected with a
//! message that says so.

use flowmesh_domain::validate::MAX_STAGES;
use flowmesh_domain::validate_submission;

/// A chain of `n` echo stages; every stage after the first reads the first one's result.
fn chain(n: usize) -> String {
    let mut doc = String::from(
        "apiVersion: flowmesh/v1\nkind: Workflow\nmetadata: {name: chain}\nspec:\n  taskType: echo\n  stages:\n",
    );
    for i in 0..n {
        if i == 0 {
            doc.push_str("    - {name: s0, spec: {data: {type: list, items: [a]}}}\n");
        } else {
            doc.push_str(&format!(
                "    - {{name: s{i}, dependsOn: [s{}], spec: {{data: {{type: list, items: ['${{s0.count}}']}}}}}}\n",
                i - 1
            ));
        }
    }
    doc
}

#[test]
fn a_chain_at_the_limit_validates_and_every_stage_may_read_the_first() {
    let workflow = validate_submission(chain(MAX_STAGES).as_bytes(), "wf-1").expect("a chain at the limit is valid");
    assert_eq!(workflow.tasks.len(), MAX_STAGES);
    assert_eq!(workflow.tasks.last().unwrap().depends_on, vec![format!("s{}", MAX_STAGES - 2)]);
}

#[test]
fn a_placeholder_naming_a_stage_that_is_not_upstream_is_still_caught_in_a_long_chain() {
    // s5 reads s900, which runs after it.
    let doc = chain(MAX_STAGES).replace(
        "- {name: s5, dependsOn: [s4], spec: {data: {type: list, items: ['${s0.count}']}}}",
        "- {name: s5, dependsOn: [s4], spec: {data: {type: list, items: ['${s900.count}']}}}",
    );
    let problems = validate_submission(doc.as_bytes(), "wf-1").expect_err("s900 is downstream of s5");
    assert!(problems.iter().any(|p| p.message.contains("\"s900\", which is not upstream of \"s5\"")), "{problems:?}");
}

#[test]
fn more_stages_than_the_limit_are_rejected_by_count() {
    let n = MAX_STAGES + 1;
    let problems = validate_submission(chain(n).as_bytes(), "wf-1").expect_err("over the limit");
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].path, "/spec");
    assert!(problems[0].message.contains(&format!("has {n} stages; at most {MAX_STAGES}")), "{problems:?}");
}

/// The hostile case: tens of thousands of stages in well under 1 MiB. The decoder's
/// budgets or the stage limit refuse it; either way it is one bounded rejection.
#[test]
fn a_document_of_tens_of_thousands_of_stages_gets_one_rejection() {
    let mut doc = String::from(
        "apiVersion: flowmesh/v1\nkind: Workflow\nspec:\n  taskType: echo\n  data: {type: list, items: [a]}\n  stages:\n    - {name: s0}\n",
    );
    for i in 1..20_000 {
        doc.push_str(&format!("    - {{name: s{i}, dependsOn: [s{}]}}\n", i - 1));
    }
    assert!(doc.len() < 1 << 20, "{} bytes", doc.len());
    let problems = validate_submission(doc.as_bytes(), "wf-1").expect_err("hostile");
    assert_eq!(problems.len(), 1, "{problems:?}");
}
