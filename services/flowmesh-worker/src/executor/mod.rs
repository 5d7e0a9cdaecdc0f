//! Executors: what turns a work order into a result. Each declares its task types and exists
//! only when its runtime dependency does; the worker advertises the union of their types.
//! This file is the registry (`Executor`); each executor is a file of its own, and what they
//! share is in `context` (`TaskContext`, `ExecError`) and `process` (the process contract).

mod context;
mod echo;
pub mod plugin;
mod process;
pub(crate) mod python;
pub mod runner;
pub mod ssh;

#[cfg(test)]
pub(crate) use context::order;
pub use context::{ExecError, TaskContext, Update};

use flowmesh_domain::fleet::ExecutorInfo;
use plugin::Plugin;
use runner::{Runner, Unavailable};
use serde_json::Value;
use ssh::SshExecutor;
use std::path::Path;

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
        let (fixed, listed) = self.types();
        fixed.into_iter().map(str::to_owned).chain(listed.iter().cloned()).collect()
    }

    /// Whether it runs tasks of `task_type`: `task_types` without copying them, asked per task.
    pub fn serves(&self, task_type: &str) -> bool {
        let (fixed, listed) = self.types();
        fixed == Some(task_type) || listed.iter().any(|t| t == task_type)
    }

    /// The task types it runs: the one an executor built in runs, or the ones a plugin or a
    /// runner is configured with.
    fn types(&self) -> (Option<&'static str>, &[String]) {
        match self {
            Executor::Echo => (Some("echo"), &[]),
            Executor::Python { .. } => (Some("python"), &[]),
            Executor::Ssh(_) => (Some("ssh"), &[]),
            Executor::Plugin(p) => (None, &p.task_types),
            Executor::Runner(r) => (None, &r.task_types),
            Executor::Unavailable(_) => (None, &[]),
        }
    }

    /// Whether a task of this executor answers at once, inside the worker: no process, no
    /// progress updates, nothing to wait for (echo). Such a task needs no update forwarder and
    /// no progress acks.
    pub fn answers_at_once(&self) -> bool {
        matches!(self, Executor::Echo)
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

    /// Runs one task. The executors that start processes or containers hold kilobytes of state
    /// while they wait; their futures are boxed, so a worker's task (moved whole when it is
    /// spawned, and at each await that builds a future) stays small for the echo that holds none.
    pub async fn run(&self, ctx: &TaskContext) -> Result<Value, ExecError> {
        match self {
            Executor::Echo => echo::run(ctx),
            Executor::Python { interpreter } => Box::pin(python::run(interpreter, ctx)).await,
            Executor::Plugin(p) => Box::pin(p.run(ctx)).await,
            Executor::Ssh(s) => Box::pin(s.run(ctx)).await,
            Executor::Runner(r) => Box::pin(r.run(ctx)).await,
            Executor::Unavailable(u) => {
                Err(ExecError::Permanent(format!("runner {} is not available: {}", u.name, u.reason)))
            }
        }
    }
}

/// What a worker lists while its ML runners are being asked: one entry, serving nothing.
pub fn initialising(python: &str) -> Executor {
    Executor::Unavailable(runner::initialising(python))
}

/// The executors for `FLOWMESH_RUNNERS`: one per runner that initialised, and one listing each
/// that did not (it serves nothing).
pub async fn runners(python: &str, cache: Option<&Path>, machine: &str) -> Vec<Executor> {
    let (ready, missing) = runner::discover(python, cache, machine).await;
    ready.into_iter().map(Executor::Runner).chain(missing.into_iter().map(Executor::Unavailable)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `serves` answers per task what `task_types` lists, without copying it.
    #[test]
    fn an_executor_serves_exactly_the_task_types_it_lists() {
        let plugin: Plugin = serde_json::from_value(
            serde_json::json!({"name": "p", "task_types": ["embed", "rerank"], "command": ["x"]}),
        )
        .unwrap();
        let runner = Runner {
            name: "trl".into(),
            task_types: vec!["training".into(), "lora_finetune".into()],
            backends: Vec::new(),
            python: "python3".into(),
        };
        let unavailable =
            Unavailable { name: "vllm".into(), task_types: vec!["inference".into()], reason: "not installed".into() };
        let executors = [
            Executor::Echo,
            Executor::Python { interpreter: "python3".into() },
            Executor::Plugin(plugin),
            Executor::Runner(runner),
            Executor::Unavailable(unavailable),
        ];
        let types = ["echo", "python", "ssh", "embed", "rerank", "training", "lora_finetune", "inference", "", "ech"];
        for executor in &executors {
            for task_type in types {
                let listed = executor.task_types().iter().any(|t| t == task_type);
                assert_eq!(executor.serves(task_type), listed, "{} and {task_type:?}", executor.name());
            }
        }
        assert!(executors[2].serves("embed") && executors[3].serves("training") && !executors[4].serves("inference"));
    }
}
