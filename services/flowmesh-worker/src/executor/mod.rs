//! Executors: what turns a work order into a result. Each declares its task types and exists
//! only when its runtime dependency does; the worker advertises the union of their types.

pub mod plugin;
pub mod process;
pub mod python;
pub mod runner;
pub mod ssh;

use flowmesh_domain::fleet::{ExecutorInfo, Gpu};
use flowmesh_domain::work::WorkOrder;
use flowmesh_nats::Shutdown;
use plugin::Plugin;
use process::Command;
use runner::{Runner, Unavailable};
use serde_json::Value;
use ssh::SshExecutor;
use std::collections::BTreeMap;
use std::path::PathBuf;
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

/// Everything an executor may use for one task.
pub struct TaskContext {
    pub order: WorkOrder,
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
}

impl TaskContext {
    /// The environment of a task process: the worker's own plus the FlowMesh contract variables.
    fn env(&self) -> BTreeMap<String, String> {
        let mut env = BTreeMap::new();
        if let Some(Value::Object(vars)) = self.order.spec.get("env") {
            for (k, v) in vars {
                env.insert(k.clone(), v.as_str().map_or_else(|| v.to_string(), str::to_owned));
            }
        }
        env.insert("FLOWMESH_TASK_FILE".into(), self.work_dir.join("task.json").display().to_string());
        env.insert("FLOWMESH_RESULT_FILE".into(), self.work_dir.join("result.json").display().to_string());
        env.insert("FLOWMESH_OUTPUT_DIR".into(), self.output_dir.display().to_string());
        env.insert("FLOWMESH_INPUTS_DIR".into(), self.work_dir.join("inputs").display().to_string());
        env.insert("FLOWMESH_TASK_ID".into(), self.order.task_id.clone());
        env.insert("FLOWMESH_ATTEMPT".into(), self.order.attempt.to_string());
        let visible: Vec<String> =
            self.gpus.iter().map(|g| if g.uuid.is_empty() { g.index.to_string() } else { g.uuid.clone() }).collect();
        env.insert("CUDA_VISIBLE_DEVICES".into(), visible.join(","));
        env
    }

    /// Runs an external command under the process contract and reads its result file.
    pub async fn run_command(&self, argv: &[String]) -> Result<Value, ExecError> {
        self.run_command_with(argv, &BTreeMap::new()).await
    }

    /// `run_command` with variables that override the contract's (a runner's GPU subset, threads).
    pub async fn run_command_with(
        &self,
        argv: &[String],
        extra: &BTreeMap<String, String>,
    ) -> Result<Value, ExecError> {
        let task_file = self.work_dir.join("task.json");
        let task_json = serde_json::to_vec_pretty(&self.order).expect("work orders serialize");
        std::fs::write(&task_file, task_json).map_err(|e| ExecError::Retryable(format!("writing task.json: {e}")))?;
        let mut env = self.env();
        env.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
        let result = process::run(
            Command { argv, env: &env, cwd: &self.work_dir, log_dir: &self.work_dir, max_runtime: self.max_runtime },
            self.cancel.clone(),
        )
        .await;
        if let Err(ExecError::Permanent(message)) = &result {
            let tail = process::tail(&self.work_dir.join("stderr.log"), 400);
            if !tail.is_empty() {
                return Err(ExecError::Permanent(format!("{message}; stderr ends: {tail}")));
            }
        }
        result?;
        let result_file = self.work_dir.join("result.json");
        match std::fs::read(&result_file) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| ExecError::Permanent(format!("the command wrote a result file that is not JSON: {e}"))),
            Err(_) => Ok(serde_json::json!({
                "ok": true,
                "stdout": process::tail(&self.work_dir.join("stdout.log"), 4096),
            })),
        }
    }
}

/// Every executor kind, matched exhaustively.
pub enum Executor {
    Echo,
    Python {
        interpreter: String,
    },
    Plugin(Plugin),
    Ssh(Box<SshExecutor>),
    /// An ML runner of the `flowmesh_runners` package that initialised here.
    Runner(Runner),
    /// A runner that did not initialise: listed with its reason, serves nothing.
    Unavailable(Unavailable),
}

impl Executor {
    pub fn name(&self) -> &str {
        match self {
            Executor::Echo => "echo",
            Executor::Python { .. } => "python",
            Executor::Plugin(p) => &p.name,
            Executor::Ssh(_) => "ssh",
            Executor::Runner(r) => &r.name,
            Executor::Unavailable(u) => &u.name,
        }
    }

    pub fn task_types(&self) -> Vec<String> {
        match self {
            Executor::Echo => vec!["echo".to_owned()],
            Executor::Python { .. } => vec!["python".to_owned()],
            Executor::Plugin(p) => p.task_types.clone(),
            Executor::Ssh(_) => vec!["ssh".to_owned()],
            Executor::Runner(r) => r.task_types.clone(),
            Executor::Unavailable(_) => Vec::new(),
        }
    }

    /// Whether a task of this executor has a folder, logs and files to store. An echo runs in
    /// the worker and produces only its result: no per-task file system work, no uploads (its
    /// result travels inline in `task.completed`).
    pub fn uses_files(&self) -> bool {
        match self {
            Executor::Echo => false,
            Executor::Python { .. }
            | Executor::Plugin(_)
            | Executor::Ssh(_)
            | Executor::Runner(_)
            | Executor::Unavailable(_) => true,
        }
    }

    /// The inference backends it serves; empty means not declared (any).
    pub fn backends(&self) -> Vec<String> {
        match self {
            Executor::Plugin(p) => p.backends.clone(),
            Executor::Runner(r) => r.backends.clone(),
            Executor::Echo | Executor::Python { .. } | Executor::Ssh(_) | Executor::Unavailable(_) => Vec::new(),
        }
    }

    pub fn info(&self) -> ExecutorInfo {
        let unavailable = match self {
            Executor::Unavailable(u) if u.task_types.is_empty() => Some(u.reason.clone()),
            Executor::Unavailable(u) => Some(format!("serves none of {:?}: {}", u.task_types, u.reason)),
            _ => None,
        };
        ExecutorInfo {
            name: self.name().to_owned(),
            task_types: self.task_types(),
            backends: self.backends(),
            unavailable,
        }
    }

    pub async fn run(&self, ctx: &TaskContext) -> Result<Value, ExecError> {
        match self {
            Executor::Echo => flowmesh_domain::echo::run(&ctx.order.spec).map_err(ExecError::Permanent),
            Executor::Python { interpreter } => python::run(interpreter, ctx).await,
            Executor::Plugin(p) => ctx.run_command(&p.command).await,
            Executor::Ssh(s) => s.run(ctx).await,
            Executor::Runner(r) => r.run(ctx).await,
            Executor::Unavailable(u) => {
                Err(ExecError::Permanent(format!("runner {} is not available: {}", u.name, u.reason)))
            }
        }
    }
}
