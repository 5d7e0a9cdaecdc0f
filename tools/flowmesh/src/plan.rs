//! `flowmesh plan`: where each stage of a document would go now, and why not elsewhere — the
//! router's own placement code over the live fleet, without submitting anything.

use flowmesh_domain::fleet::WorkerSnapshot;
use flowmesh_domain::placement::{self, Candidate, Placement, Strategy};
use flowmesh_domain::{Problem, Workflow, template};
use serde::Serialize;
use std::collections::BTreeSet;

#[derive(Debug, Serialize)]
pub struct StagePlan {
    pub stage: String,
    pub task_type: String,
    /// The worker the router would choose now, if any.
    pub chosen: Option<String>,
    pub summary: String,
    /// Every live worker with the reasons it cannot take the stage (empty: it can).
    pub workers: Vec<WorkerFit>,
    /// The queued or running task an identical inference request would be merged with now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub merges_with: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct WorkerFit {
    pub worker_id: String,
    pub reasons: Vec<String>,
    /// `holds MODEL warm (cached, 1.2 GiB)` when it has the stage's model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warm: Option<String>,
}

/// Plans every stage of `workflow` on `fleet` (live workers; cordoned ones named in `cordoned`,
/// draining ones in `draining`; `leaders` from `schedule::merge_leaders`).
#[allow(clippy::too_many_arguments)]
pub fn plan(
    workflow: &Workflow,
    fleet: &[WorkerSnapshot],
    cordoned: &BTreeSet<String>,
    draining: &BTreeSet<String>,
    leaders: &std::collections::HashMap<String, String>,
    strategy: Strategy,
    now_ms: u64,
) -> Vec<StagePlan> {
    let candidates: Vec<Candidate<'_>> = fleet
        .iter()
        .map(|w| Candidate {
            snapshot: w,
            // What runs and what waits in its queue, as the router counts them.
            batch_in_use: w.slots.batch.in_use + w.queued,
            service_in_use: w.slots.service.in_use,
            cordoned: cordoned.contains(&w.id),
            draining: draining.contains(&w.id),
        })
        .collect();
    workflow
        .tasks
        .iter()
        .map(|t| {
            let request = match placement::request_for(&t.task_type, &t.spec, t.selected_workers.clone()) {
                Ok(r) => r,
                Err(e) if template::contains_placeholder(&t.spec) => {
                    return StagePlan {
                        stage: t.stage.clone(),
                        task_type: t.task_type.clone(),
                        chosen: None,
                        summary: format!("its resources depend on upstream results; placed at dispatch ({e})"),
                        workers: Vec::new(),
                        merges_with: None,
                    };
                }
                Err(e) => {
                    return StagePlan {
                        stage: t.stage.clone(),
                        task_type: t.task_type.clone(),
                        chosen: None,
                        summary: e,
                        workers: Vec::new(),
                        merges_with: None,
                    };
                }
            };
            let workers = candidates
                .iter()
                .map(|c| WorkerFit {
                    worker_id: c.snapshot.id.clone(),
                    reasons: placement::explain(&request, c).iter().map(|e| e.describe(&request, false)).collect(),
                    warm: request.model.as_deref().and_then(|m| c.snapshot.warm(m)).map(|held| {
                        format!(
                            "holds {} warm ({}, {})",
                            held.id,
                            held.state.name(),
                            flowmesh_domain::units::format_bytes(held.size_bytes)
                        )
                    }),
                })
                .collect();
            let (chosen, summary) =
                match placement::place(&request, &t.stage, &t.task_id, &candidates, strategy, &BTreeSet::new(), now_ms)
                {
                    Placement::Chosen { worker_id, explanation, .. } => {
                        let message = explanation.map(|e| e.message).unwrap_or_default();
                        let summary = format!("{message} → {worker_id}");
                        (Some(worker_id), summary)
                    }
                    Placement::Pending(explanation) => (None, explanation.message),
                };
            let merges_with = flowmesh_domain::schedule::merge_key_of(&t.task_type, serde_json::Value::clone(&t.spec))
                .and_then(|key| leaders.get(&key).cloned());
            let summary = match &merges_with {
                Some(leader) => format!("would be merged with {leader} (an identical request already queued or running); otherwise {summary}"),
                None => summary,
            };
            StagePlan { stage: t.stage.clone(), task_type: t.task_type.clone(), chosen, summary, workers, merges_with }
        })
        .collect()
}

/// The plan for people.
pub fn render(plans: &[StagePlan]) -> String {
    let mut out = String::new();
    for p in plans {
        out += &format!("stage {:?} ({}): {}\n", p.stage, p.task_type, p.summary);
        for w in &p.workers {
            let mut verdict = if w.reasons.is_empty() { "can run it".to_owned() } else { w.reasons.join("; ") };
            if let Some(warm) = &w.warm {
                verdict += &format!("; {warm}");
            }
            let mark = if p.chosen.as_deref() == Some(w.worker_id.as_str()) { "*" } else { " " };
            out += &format!("  {mark} {:<20} {verdict}\n", w.worker_id);
        }
    }
    out
}

/// Problems as lines, for a document that does not validate.
pub fn render_problems(problems: &[Problem]) -> String {
    problems.iter().map(|p| format!("  {p}\n")).collect()
}
