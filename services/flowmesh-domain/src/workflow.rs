//! The normalized workflow: what an accepted submission expands to, one `TaskDef` per stage.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::Arc;

/// An accepted workflow, as recorded in `submission.accepted`. Tasks are in a topological order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workflow {
    pub workflow_id: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    pub tasks: Vec<TaskDef>,
}

/// One stage of a workflow with its fully merged spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskDef {
    pub task_id: String,
    pub stage: String,
    pub task_type: String,
    /// Stage names this task waits for (direct dependencies only).
    #[serde(default)]
    pub depends_on: Vec<String>,
    /// The stage spec deep-merged over the root spec; placeholders are still unresolved. Shared
    /// with the work order of every attempt whose resolution rewrites nothing
    /// (`schedule::resolve_spec`): dispatching copies no spec.
    pub spec: Arc<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<Condition>,
    pub max_attempts: u32,
    /// Worker ids this task may run on (`schedule_hint.selected_worker`); `None` means any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selected_workers: Option<Vec<String>>,
    /// Where this stage's spec sits in the submitted document, for problems found at dispatch.
    pub spec_path: String,
}

/// Run the task only when the upstream `node`'s result at `field` equals `equals` (compared as text).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Condition {
    pub node: String,
    pub field: String,
    pub equals: Value,
}

/// The default number of attempts a task gets (SPEC §7).
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;

/// A scalar as the text a condition compares: strings as they are, everything else as JSON.
pub fn condition_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Merges `over` into `base`: objects merge key by key, anything else in `over` replaces.
pub fn deep_merge(base: &Value, over: &Value) -> Value {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            let mut merged = b.clone();
            for (key, value) in o {
                let next = match b.get(key) {
                    Some(existing) => deep_merge(existing, value),
                    None => value.clone(),
                };
                merged.insert(key.clone(), next);
            }
            Value::Object(merged)
        }
        _ => over.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn stage_fields_override_root_defaults_deeply() {
        let root = json!({"taskType": "sft", "resources": {"hardware": {"cpu": 4, "gpu": {"count": 1}}}});
        let stage = json!({"resources": {"hardware": {"gpu": {"count": 2}}}, "data": [1]});
        let merged = deep_merge(&root, &stage);
        assert_eq!(
            merged,
            json!({"taskType": "sft", "resources": {"hardware": {"cpu": 4, "gpu": {"count": 2}}}, "data": [1]})
        );
    }

    #[test]
    fn condition_text_compares_scalars_as_text() {
        assert_eq!(condition_text(&json!("yes")), "yes");
        assert_eq!(condition_text(&json!(true)), "true");
        assert_eq!(condition_text(&json!(3)), "3");
    }
}
