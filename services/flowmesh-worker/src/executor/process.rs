//! Running an external command for a task: its own process group, logs to files, a deadline,
//! cancellation, and the exit-status contract (0 ok, 75 retryable, anything else permanent);
//! `TaskContext::run_command` runs one with the task's environment and reads its result file.

use crate::executor::context::{ExecError, TaskContext, deadline};
use flowmesh_nats::Shutdown;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

/// Exit status a command uses to ask for a retry (EX_TEMPFAIL).
pub const EXIT_RETRYABLE: i32 = 75;

pub struct Command<'a> {
    pub argv: &'a [String],
    pub env: &'a BTreeMap<String, String>,
    pub cwd: &'a Path,
    /// Where stdout and stderr go (`stdout.log`, `stderr.log`).
    pub log_dir: &'a Path,
    pub max_runtime: Option<Duration>,
}

/// Runs the command to its end, or kills its whole process group on cancel or deadline.
pub async fn run(cmd: Command<'_>, mut cancel: Shutdown) -> Result<(), ExecError> {
    let (program, args) = cmd.argv.split_first().ok_or_else(|| ExecError::Permanent("empty command".to_owned()))?;
    let stdout = std::fs::File::create(cmd.log_dir.join("stdout.log"))
        .map_err(|e| ExecError::Retryable(format!("creating stdout.log: {e}")))?;
    let stderr = std::fs::File::create(cmd.log_dir.join("stderr.log"))
        .map_err(|e| ExecError::Retryable(format!("creating stderr.log: {e}")))?;
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .envs(cmd.env)
        .current_dir(cmd.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::from(stderr))
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| ExecError::Permanent(format!("could not start {program:?}: {e}")))?;
    let pid = child.id();
    let outcome = tokio::select! {
        status = child.wait() => status.map_err(|e| ExecError::Retryable(format!("waiting for {program:?}: {e}")))?,
        _ = cancel.wait() => {
            kill_group(pid);
            let _ = child.wait().await;
            return Err(ExecError::Cancelled);
        }
        _ = deadline(cmd.max_runtime) => {
            kill_group(pid);
            let _ = child.wait().await;
            return Err(ExecError::TimedOut(cmd.max_runtime.unwrap_or_default()));
        }
    };
    match outcome.code() {
        Some(0) => Ok(()),
        Some(EXIT_RETRYABLE) => {
            Err(ExecError::Retryable(format!("{program:?} exited with {EXIT_RETRYABLE} (retryable)")))
        }
        Some(code) => Err(ExecError::Permanent(format!("{program:?} exited with status {code}; see stderr.log"))),
        None => Err(ExecError::Permanent(format!("{program:?} was killed by a signal"))),
    }
}

fn kill_group(pid: Option<u32>) {
    if let Some(pid) = pid {
        // The child leads its own group (process_group(0)), so this reaches every descendant.
        unsafe {
            libc::kill(-(pid as i32), libc::SIGKILL);
        }
    }
}

/// The last `max` bytes of a log, for a failure message.
pub fn tail(path: &Path, max: usize) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let start = text.len().saturating_sub(max);
    String::from_utf8_lossy(&text[start..]).trim().to_owned()
}

impl TaskContext {
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
        let task_json = serde_json::to_vec_pretty(&*self.order).expect("work orders serialize");
        std::fs::write(&task_file, task_json).map_err(|e| ExecError::Retryable(format!("writing task.json: {e}")))?;
        let mut env = self.env();
        env.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
        let result = run(
            Command { argv, env: &env, cwd: &self.work_dir, log_dir: &self.work_dir, max_runtime: self.max_runtime },
            self.cancel.clone(),
        )
        .await;
        if let Err(ExecError::Permanent(message)) = &result {
            let ends = tail(&self.work_dir.join("stderr.log"), 400);
            if !ends.is_empty() {
                return Err(ExecError::Permanent(format!("{message}; stderr ends: {ends}")));
            }
        }
        result?;
        let result_file = self.work_dir.join("result.json");
        match std::fs::read(&result_file) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| ExecError::Permanent(format!("the command wrote a result file that is not JSON: {e}"))),
            Err(_) => Ok(serde_json::json!({
                "ok": true,
                "stdout": tail(&self.work_dir.join("stdout.log"), 4096),
            })),
        }
    }
}
