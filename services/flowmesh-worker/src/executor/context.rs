//! What every executor is given and gives back: the task's context, its progress updates, the
//! error that decides a retry, and the helpers they share (the task environment, a JSON value as
//! text, a command line, the deadline). A leaf: it imports no other executor file.

use flowmesh_domain::fleet::Gpu;
use flowmesh_domain::work::WorkOrder;
use flowmesh_nats::Shutdown;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Why a task did not produce a result.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ExecError {
    #[error("{0}")]
    Retryable(String),
    #[error("{0}")]
    Permanent(String),
    #[error("cancelled")]
    Cancelled,
    #[error("exceeded the maximum runtime of {0:?}")]
    TimedOut(Duration),
}

/// Everything an executor may use for one task. `run_command` and `run_command_with` (the
/// process contract) are in `process`.
pub struct TaskContext {
    /// Shared with the worker's own handling of the task, not copied for the executor.
    pub order: Arc<WorkOrder>,
    /// `RESULTS_DIR/<task_id>/`: the working directory, logs and `results.json`.
    pub work_dir: PathBuf,
    /// `RESULTS_DIR/<task_id>/output/`: every file here becomes an artifact.
    pub output_dir: PathBuf,
    pub gpus: Vec<Gpu>,
    pub cancel: Shutdown,
    pub max_runtime: Option<Duration>,
    /// Progress the worker reports as `task.updated` (message, structured data).
    pub updates: Option<tokio::sync::mpsc::UnboundedSender<Update>>,
}

/// One `task.updated` report from an executor.
#[derive(Debug, Clone, PartialEq)]
pub struct Update {
    pub message: String,
    pub data: Option<Value>,
}

impl TaskContext {
    /// Reports progress; dropped silently when nobody listens (tests, `--collect-hw`).
    pub fn update(&self, message: impl Into<String>, data: Option<Value>) {
        if let Some(tx) = &self.updates {
            let _ = tx.send(Update { message: message.into(), data });
        }
    }

    /// The environment of a task process on this worker: host paths, every GPU it was given.
    pub(crate) fn env(&self) -> BTreeMap<String, String> {
        let output_dir = self.output_dir.display().to_string();
        task_env(
            &self.order,
            &Contract {
                output_dir: &output_dir,
                work_dir: Some(&self.work_dir),
                visible_gpus: Some(self.gpus.iter().map(device_id).collect()),
            },
        )
    }
}

/// What the contract variables name, as the task's process sees it. A process on the worker sees
/// host paths and has a task file, a result file and an inputs folder; an `ssh` container sees its
/// mounts and has none of the three (it mounts each input on its own).
pub struct Contract<'a> {
    /// `FLOWMESH_OUTPUT_DIR`.
    pub output_dir: &'a str,
    /// The folder holding `task.json`, `result.json` and `inputs/`: `FLOWMESH_TASK_FILE`,
    /// `FLOWMESH_RESULT_FILE`, `FLOWMESH_INPUTS_DIR`. `None` sets none of them.
    pub work_dir: Option<&'a Path>,
    /// `CUDA_VISIBLE_DEVICES`, joined with commas. `None` leaves it out, so a value in the spec's
    /// `env` stands.
    pub visible_gpus: Option<Vec<String>>,
}

/// A task's environment: the spec's `env`, then the FlowMesh contract variables over it.
pub fn task_env(order: &WorkOrder, contract: &Contract<'_>) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    if let Some(Value::Object(vars)) = order.spec.get("env") {
        for (k, v) in vars {
            env.insert(k.clone(), text(v));
        }
    }
    if let Some(work_dir) = contract.work_dir {
        env.insert("FLOWMESH_TASK_FILE".into(), work_dir.join("task.json").display().to_string());
        env.insert("FLOWMESH_RESULT_FILE".into(), work_dir.join("result.json").display().to_string());
        env.insert("FLOWMESH_INPUTS_DIR".into(), work_dir.join("inputs").display().to_string());
    }
    env.insert("FLOWMESH_OUTPUT_DIR".into(), contract.output_dir.to_owned());
    env.insert("FLOWMESH_TASK_ID".into(), order.task_id.clone());
    env.insert("FLOWMESH_ATTEMPT".into(), order.attempt.to_string());
    if let Some(visible) = &contract.visible_gpus {
        env.insert("CUDA_VISIBLE_DEVICES".into(), visible.join(","));
    }
    env
}

/// How the driver and the engine name a GPU: its UUID, or its index when the probe has none.
pub fn device_id(gpu: &Gpu) -> String {
    if gpu.uuid.is_empty() { gpu.index.to_string() } else { gpu.uuid.clone() }
}

/// A JSON value as an argument or an environment value: a string as itself, anything else as JSON.
pub fn text(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_owned)
}

/// A command line as a spec gives it: a string runs through `/bin/sh -c`, a list as is (each item
/// as `text`); anything else is no command.
pub fn command_line(value: Option<&Value>) -> Option<Vec<String>> {
    match value? {
        Value::String(line) => Some(vec!["/bin/sh".into(), "-c".into(), line.clone()]),
        Value::Array(items) => Some(items.iter().map(text).collect()),
        _ => None,
    }
}

/// Resolves once `limit` has passed; never without a limit.
pub async fn deadline(limit: Option<Duration>) {
    match limit {
        Some(limit) => tokio::time::sleep(limit).await,
        None => std::future::pending().await,
    }
}

/// A work order for unit tests: task `wf-1-main`, attempt 3, of `task_type` with `spec`.
#[cfg(test)]
pub(crate) fn order(task_type: &str, spec: Value) -> WorkOrder {
    serde_json::from_value(serde_json::json!({
        "workflow_id": "wf-1", "task_id": "wf-1-main", "stage": "main", "attempt": 3,
        "task_type": task_type, "spec": spec,
    }))
    .expect("a work order")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A process on the worker gets host paths and always `CUDA_VISIBLE_DEVICES` (empty without
    /// GPUs); the contract's variables override the spec's `env`, whose values become text.
    #[test]
    fn a_process_on_the_worker_sees_host_paths_and_its_gpus() {
        let spec = json!({"env": {"N": 2, "NAME": "x", "FLOWMESH_TASK_ID": "mine", "CUDA_VISIBLE_DEVICES": "7"}});
        let (_trigger, cancel) = flowmesh_nats::shutdown::channel();
        let gpu = |index, uuid: &str| Gpu { index, uuid: uuid.to_owned(), name: "GPU".to_owned(), memory_bytes: 0 };
        let mut ctx = TaskContext {
            order: Arc::new(order("python", spec)),
            work_dir: PathBuf::from("/r/wf-1-main"),
            output_dir: PathBuf::from("/r/wf-1-main/output"),
            gpus: vec![gpu(0, "GPU-a"), gpu(1, "")],
            cancel,
            max_runtime: None,
            updates: None,
        };
        let want = BTreeMap::from(
            [
                ("CUDA_VISIBLE_DEVICES", "GPU-a,1"),
                ("FLOWMESH_ATTEMPT", "3"),
                ("FLOWMESH_INPUTS_DIR", "/r/wf-1-main/inputs"),
                ("FLOWMESH_OUTPUT_DIR", "/r/wf-1-main/output"),
                ("FLOWMESH_RESULT_FILE", "/r/wf-1-main/result.json"),
                ("FLOWMESH_TASK_FILE", "/r/wf-1-main/task.json"),
                ("FLOWMESH_TASK_ID", "wf-1-main"),
                ("N", "2"),
                ("NAME", "x"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned())),
        );
        assert_eq!(ctx.env(), want);
        ctx.gpus.clear();
        assert_eq!(ctx.env()["CUDA_VISIBLE_DEVICES"], "", "no GPUs: none visible, whatever the spec says");
    }

    #[test]
    fn command_lines() {
        assert_eq!(command_line(Some(&json!("echo hi"))), Some(vec!["/bin/sh".into(), "-c".into(), "echo hi".into()]));
        assert_eq!(command_line(Some(&json!(["run", 3, true]))), Some(vec!["run".into(), "3".into(), "true".into()]));
        assert_eq!(command_line(Some(&json!({"run": 1}))), None);
        assert_eq!(command_line(None), None);
    }
}
