//! Plugin executors from the TOML file named by `FLOWMESH_EXECUTORS`:
//! `[[executor]] name, task_types, requires_gpu, probe = [argv], command = [argv]`.

use crate::executor::context::{ExecError, TaskContext};
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plugin {
    pub name: String,
    pub task_types: Vec<String>,
    /// The inference backends it serves (`transformers`, `vllm`); absent: it picks its backend
    /// itself and is taken to serve any.
    #[serde(default)]
    pub backends: Vec<String>,
    #[serde(default)]
    pub requires_gpu: bool,
    /// Must exit 0 for the plugin to be constructed; absent means always.
    #[serde(default)]
    pub probe: Vec<String>,
    pub command: Vec<String>,
    /// Loads a model ahead of the tasks that need it, on a prewarm hint (`FLOWMESH_PREWARM_MODEL`,
    /// `FLOWMESH_MODEL_CACHE`); absent means this executor does not prewarm.
    #[serde(default)]
    pub prewarm: Vec<String>,
}

impl Plugin {
    /// Runs its command under the process contract.
    pub async fn run(&self, ctx: &TaskContext) -> Result<Value, ExecError> {
        ctx.run_command(&self.command).await
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    executor: Vec<Plugin>,
}

/// Parses the plugin file; errors name the file and say what is wrong.
pub fn parse(path: &Path, text: &str) -> Result<Vec<Plugin>, String> {
    let file: File = toml::from_str(text).map_err(|e| format!("{}: {e}", path.display()))?;
    for p in &file.executor {
        if p.command.is_empty() {
            return Err(format!("{}: executor {:?} has an empty command", path.display(), p.name));
        }
        if p.task_types.is_empty() {
            return Err(format!("{}: executor {:?} serves no task types", path.display(), p.name));
        }
    }
    Ok(file.executor)
}

/// Why a plugin is not constructed on this worker, or `None` when it is.
pub async fn unavailable(plugin: &Plugin, has_gpu: bool) -> Option<String> {
    if plugin.requires_gpu && !has_gpu {
        return Some("it requires a GPU and this worker has none".to_owned());
    }
    let (program, args) = plugin.probe.split_first()?;
    match tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .await
    {
        Ok(status) if status.success() => None,
        Ok(status) => Some(format!("its probe {:?} exited with {status}", plugin.probe)),
        Err(e) => Some(format!("its probe {:?} could not start: {e}", plugin.probe)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        let ok = parse(
            Path::new("x.toml"),
            "[[executor]]\nname = \"vllm\"\ntask_types = [\"inference\"]\nrequires_gpu = true\nprobe = [\"true\"]\ncommand = [\"run-vllm\"]\n",
        )
        .unwrap();
        assert_eq!(ok[0].task_types, vec!["inference"]);
        assert!(
            parse(Path::new("x.toml"), "[[executor]]\nname = \"a\"\ntask_types = [\"x\"]\ncommand = []\n").is_err()
        );
        assert!(
            parse(
                Path::new("x.toml"),
                "[[executor]]\nname = \"a\"\ntask_types = [\"x\"]\ncommand = [\"c\"]\nbogus = 1\n"
            )
            .is_err()
        );
    }
}
