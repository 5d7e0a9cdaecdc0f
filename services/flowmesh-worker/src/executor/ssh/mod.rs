//! The `ssh` executor: runs a task's container through the Docker engine (`bollard`) under the
//! operator's caps, with the chosen GPUs, upstream inputs mounted read-only and an output folder
//! whose files become the task's artifacts. This file is the engine; `plan` decides the container.

pub mod plan;

pub use plan::SshSettings;

use crate::executor::context::{ExecError, TaskContext, deadline};
use crate::executor::process::{EXIT_RETRYABLE, tail};
use bollard::Docker;
use bollard::container::LogOutput;
use bollard::errors::Error as DockerError;
use bollard::query_parameters::{
    CreateContainerOptions, CreateImageOptions, KillContainerOptions, ListContainersOptions, LogsOptions,
    RemoveContainerOptions, StatsOptions,
};
use flowmesh_domain::units::format_bytes;
use futures_util::StreamExt;
use plan::{
    LABEL_MANAGED, LABEL_TASK_ID, LABEL_WORKER_HOME, LABEL_WORKER_ID, Plan, SSH_PORT, Session, plan, split_image,
};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::sync::Semaphore;
use tracing::{info, warn};

/// A hung daemon must not hold up the worker's start: past this, Docker counts as absent.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the log copy may lag behind the container's end before it is cut off.
const LOG_DRAIN: Duration = Duration::from_secs(10);
const STDOUT_TAIL_BYTES: usize = 4096;

/// The `ssh` executor. Exists only when the Docker engine answered at start-up.
pub struct SshExecutor {
    docker: Docker,
    settings: SshSettings,
    /// One `ssh` task per worker at a time (SPEC §6): a second one waits for its turn.
    one_at_a_time: Semaphore,
}

/// How the container's run ended.
enum End {
    Exited(i64),
    Cancelled,
    TimedOut(Duration),
}

impl SshExecutor {
    /// Connects to the local Docker engine (`DOCKER_HOST` or the default socket) and checks that
    /// it answers; the error (with the debug form of the cause) says why the executor is absent.
    /// Removes the containers an earlier run of this worker left behind (a crash skips cleanup).
    pub async fn connect(settings: SshSettings) -> Result<SshExecutor, String> {
        let docker =
            Docker::connect_with_local_defaults().map_err(|e| format!("no Docker endpoint could be set up: {e:?}"))?;
        let docker = tokio::time::timeout(CONNECT_TIMEOUT, async {
            docker.ping().await.map_err(|e| format!("the Docker engine did not answer a ping: {e:?}"))?;
            // bollard speaks a newer API than many engines; settle on the engine's own version.
            docker.negotiate_version().await.map_err(|e| format!("the Docker engine did not report its version: {e:?}"))
        })
        .await
        .map_err(|_| format!("the Docker engine did not answer within {}s", CONNECT_TIMEOUT.as_secs()))??;
        let executor = SshExecutor { docker, settings, one_at_a_time: Semaphore::new(1) };
        let leftovers = executor.remove_labelled(&[]).await;
        if leftovers > 0 {
            info!(containers = leftovers, "removed ssh containers a previous run of this worker left behind");
        }
        Ok(executor)
    }

    /// Runs one `ssh` task to its end. The container is removed whatever happens.
    pub async fn run(&self, ctx: &TaskContext) -> Result<Value, ExecError> {
        let plan = plan(ctx, &self.settings)?;
        for c in &plan.limits.clamped {
            warn!(
                field = c.field,
                requested = %c.requested,
                cap = %c.cap,
                variable = c.variable,
                "ssh task asks for more than the worker's cap; clamped"
            );
        }
        let mut cancel = ctx.cancel.clone();
        let _turn = tokio::select! {
            permit = self.one_at_a_time.acquire() => {
                permit.map_err(|_| ExecError::Retryable("the ssh executor is shutting down".to_owned()))?
            }
            _ = cancel.wait() => return Err(ExecError::Cancelled),
        };
        prepare_host_dirs(&plan)?;
        if let Some(session) = &plan.session {
            let file = session.keys_dir.join("authorized_keys");
            std::fs::write(&file, session.authorized_keys.join("\n") + "\n")
                .map_err(|e| ExecError::Retryable(format!("writing {}: {e}", file.display())))?;
        }
        tokio::select! {
            ready = self.ensure_image(&plan.image) => ready?,
            _ = cancel.wait() => return Err(ExecError::Cancelled),
        }
        self.remove_labelled(&[(LABEL_TASK_ID, &ctx.order.task_id)]).await;
        let created = self
            .docker
            .create_container(
                Some(CreateContainerOptions { name: Some(plan.name.clone()), ..Default::default() }),
                plan.body.clone(),
            )
            .await
            .map_err(|e| engine_error(&format!("creating a container from {}", plan.image), e))?;
        for w in &created.warnings {
            warn!(container = %created.id, warning = %w, "docker warned about the container");
        }
        let mut removal = Removal { docker: self.docker.clone(), id: Some(created.id.clone()) };
        if let Some(session) = &plan.session {
            let outcome = self.serve(&created.id, ctx, &plan, session).await;
            removal.now().await;
            return outcome;
        }
        let end = self.drive(&created.id, ctx, &plan).await;
        let oom_killed = match &end {
            Ok(End::Exited(code)) if *code != 0 => self
                .docker
                .inspect_container(&created.id, None)
                .await
                .ok()
                .and_then(|c| c.state?.oom_killed)
                .unwrap_or(false),
            _ => false,
        };
        removal.now().await;
        let code = match end? {
            End::Exited(code) => code,
            End::Cancelled => return Err(ExecError::Cancelled),
            End::TimedOut(limit) => return Err(ExecError::TimedOut(limit)),
        };
        let stderr_tail = || tail(&ctx.work_dir.join("stderr.log"), 400);
        match code {
            0 => {}
            c if c == i64::from(EXIT_RETRYABLE) => {
                return Err(ExecError::Retryable(format!("the container exited with {EXIT_RETRYABLE} (retryable)")));
            }
            c if oom_killed => {
                let limit = plan.limits.memory_bytes.map_or("none".to_owned(), |m| format_bytes(m as u64));
                return Err(ExecError::Permanent(format!(
                    "the container ran out of memory (limit {limit}) and was killed (status {c})"
                )));
            }
            c => {
                let ends = stderr_tail();
                let mut message = format!("the container exited with status {c}");
                if !ends.is_empty() {
                    message += &format!("; stderr ends: {ends}");
                }
                return Err(ExecError::Permanent(message));
            }
        }
        let output_bytes = folder_size(&plan.output_dir);
        if let Some(max) = plan.max_output_bytes
            && output_bytes > max
        {
            return Err(ExecError::Permanent(format!(
                "the output in {} holds {output_bytes} bytes, more than sshOutput.maxBytes ({max})",
                plan.output_mount
            )));
        }
        Ok(json!({
            "ok": true,
            "exit_code": code,
            "stdout": tail(&ctx.work_dir.join("stdout.log"), STDOUT_TAIL_BYTES),
            "image": plan.image,
            "output_bytes": output_bytes,
            "gpus": plan.gpus.iter().map(|g| g.index).collect::<Vec<_>>(),
            "clamped": plan.limits.clamped,
        }))
    }

    /// Starts the container and waits for its end, the cancel signal or the deadline; kills it on
    /// the last two. Logs are copied to `stdout.log` and `stderr.log` while it runs.
    async fn drive(&self, id: &str, ctx: &TaskContext, plan: &Plan) -> Result<End, ExecError> {
        self.docker.start_container(id, None).await.map_err(|e| engine_error("starting the container", e))?;
        let logs = tokio::spawn(copy_logs(self.docker.clone(), id.to_owned(), ctx.work_dir.clone()));
        let mut cancel = ctx.cancel.clone();
        let mut wait = self.docker.wait_container(id, None);
        let end = tokio::select! {
            status = wait.next() => match status {
                Some(Ok(response)) => Ok(End::Exited(response.status_code)),
                Some(Err(DockerError::DockerContainerWaitError { code, .. })) => Ok(End::Exited(code)),
                Some(Err(e)) => Err(engine_error("waiting for the container", e)),
                None => Err(ExecError::Retryable("the engine ended the wait without an exit status".to_owned())),
            },
            _ = cancel.wait() => Ok(End::Cancelled),
            _ = deadline(plan.deadline) => Ok(End::TimedOut(plan.deadline.unwrap_or_default())),
        };
        if !matches!(end, Ok(End::Exited(_))) {
            let kill = KillContainerOptions { signal: "SIGKILL".to_owned() };
            if let Err(e) = self.docker.kill_container(id, Some(kill)).await {
                warn!(container = %id, error = %e, "killing the container failed; removal will force it");
            }
        }
        match tokio::time::timeout(LOG_DRAIN, logs).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => warn!(error = %e, "writing the container's logs failed"),
            Ok(Err(e)) => warn!(error = %e, "the log copy stopped"),
            Err(_) => warn!("the container's logs did not end with it; they may be cut short"),
        }
        end
    }

    /// Runs an interactive session: starts the SSH server container, reports where to connect
    /// (`task.updated`), and ends it at `ttlSeconds`, after `idleTimeoutSeconds` without network
    /// traffic, on cancel, or when the server exits. Reaching the TTL or the idle limit is a
    /// normal end of a session, not a failure.
    async fn serve(&self, id: &str, ctx: &TaskContext, plan: &Plan, session: &Session) -> Result<Value, ExecError> {
        self.docker.start_container(id, None).await.map_err(|e| engine_error("starting the session container", e))?;
        let logs = tokio::spawn(copy_logs(self.docker.clone(), id.to_owned(), ctx.work_dir.clone()));
        let inspected =
            self.docker.inspect_container(id, None).await.map_err(|e| engine_error("inspecting the session", e))?;
        let port = inspected
            .network_settings
            .and_then(|n| n.ports)
            .and_then(|ports| ports.get(SSH_PORT).cloned().flatten())
            .and_then(|bindings| bindings.into_iter().find_map(|b| b.host_port))
            .and_then(|p| p.parse::<u16>().ok())
            .ok_or_else(|| ExecError::Retryable("the engine published no port for the session".to_owned()))?;
        let host = &self.settings.public_host;
        let connect = json!({
            "host": host,
            "port": port,
            "user": session.user,
            "command": format!("ssh -p {port} {}@{host}", session.user),
            "ttl_seconds": plan.deadline.map(|d| d.as_secs()),
            "idle_timeout_seconds": session.idle_timeout.map(|d| d.as_secs()),
        });
        info!(port, user = %session.user, "ssh session ready");
        ctx.update(format!("ssh session ready: ssh -p {port} {}@{host}", session.user), Some(connect));

        let mut cancel = ctx.cancel.clone();
        let ttl = deadline(plan.deadline);
        tokio::pin!(ttl);
        let check_every = session.idle_timeout.map_or(Duration::from_secs(3600), |idle| {
            (idle / 4).clamp(Duration::from_millis(250), Duration::from_secs(5))
        });
        let mut tick = tokio::time::interval(check_every);
        let mut traffic = None;
        let mut last_active = tokio::time::Instant::now();
        let mut wait = self.docker.wait_container(id, None);
        let (ended, exit_code) = loop {
            tokio::select! {
                status = wait.next() => break match status {
                    Some(Ok(response)) => ("exited", Some(response.status_code)),
                    Some(Err(DockerError::DockerContainerWaitError { code, .. })) => ("exited", Some(code)),
                    Some(Err(e)) => return Err(engine_error("waiting for the session", e)),
                    None => ("exited", None),
                },
                _ = cancel.wait() => {
                    self.kill(id).await;
                    let _ = tokio::time::timeout(LOG_DRAIN, logs).await;
                    return Err(ExecError::Cancelled);
                }
                _ = &mut ttl => break ("ttl", None),
                _ = tick.tick(), if session.idle_timeout.is_some() => {
                    let now_traffic = self.network_bytes(id).await;
                    if now_traffic != traffic {
                        traffic = now_traffic;
                        last_active = tokio::time::Instant::now();
                    } else if last_active.elapsed() >= session.idle_timeout.unwrap_or_default() {
                        break ("idle", None);
                    }
                }
            }
        };
        if ended != "exited" {
            self.kill(id).await;
        }
        let _ = tokio::time::timeout(LOG_DRAIN, logs).await;
        info!(ended, "ssh session ended");
        Ok(json!({
            "ok": true,
            "interactive": true,
            "ended": ended,
            "exit_code": exit_code,
            "port": port,
            "user": session.user,
            "image": plan.image,
            "clamped": plan.limits.clamped,
        }))
    }

    async fn kill(&self, id: &str) {
        let kill = KillContainerOptions { signal: "SIGKILL".to_owned() };
        if let Err(e) = self.docker.kill_container(id, Some(kill)).await {
            warn!(container = %id, error = %e, "killing the container failed; removal will force it");
        }
    }

    /// Bytes received plus sent on every network of the container, from one stats sample.
    async fn network_bytes(&self, id: &str) -> Option<u64> {
        let options = StatsOptions { stream: false, one_shot: true };
        let sample = self.docker.stats(id, Some(options)).next().await?.ok()?;
        Some(sample.networks?.values().map(|n| n.rx_bytes.unwrap_or(0) + n.tx_bytes.unwrap_or(0)).sum())
    }

    /// Makes sure the image is present, pulling it (one tag, never the whole repository) if not.
    async fn ensure_image(&self, image: &str) -> Result<(), ExecError> {
        match self.docker.inspect_image(image).await {
            Ok(_) => return Ok(()),
            Err(DockerError::DockerResponseServerError { status_code: 404, .. }) => {}
            Err(e) => return Err(engine_error(&format!("looking up image {image}"), e)),
        }
        info!(image, "pulling the image");
        let (from_image, tag) = split_image(image);
        let options = CreateImageOptions { from_image: Some(from_image), tag, ..Default::default() };
        let mut pull = self.docker.create_image(Some(options), None, None);
        while let Some(step) = pull.next().await {
            if let Err(e) = step {
                let missing = match &e {
                    DockerError::DockerResponseServerError { status_code, .. } => (400..500).contains(status_code),
                    other => {
                        let text = other.to_string().to_lowercase();
                        text.contains("not found") || text.contains("denied") || text.contains("does not exist")
                    }
                };
                let message = format!("image {image} is not on this worker and could not be pulled: {e}");
                return Err(if missing { ExecError::Permanent(message) } else { ExecError::Retryable(message) });
            }
        }
        Ok(())
    }

    /// Force-removes this worker's managed containers that carry every label given; returns how many.
    async fn remove_labelled(&self, labels: &[(&str, &str)]) -> usize {
        let mut filter = vec![
            format!("{LABEL_MANAGED}=true"),
            format!("{LABEL_WORKER_ID}={}", self.settings.worker_id),
            format!("{LABEL_WORKER_HOME}={}", self.settings.home),
        ];
        filter.extend(labels.iter().map(|(k, v)| format!("{k}={v}")));
        let options = ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([("label".to_owned(), filter)])),
            ..Default::default()
        };
        let found = match self.docker.list_containers(Some(options)).await {
            Ok(found) => found,
            Err(e) => {
                warn!(error = %e, "listing leftover ssh containers failed");
                return 0;
            }
        };
        let mut removed = 0;
        for id in found.into_iter().filter_map(|c| c.id) {
            match self.docker.remove_container(&id, Some(force_remove())).await {
                Ok(()) => removed += 1,
                Err(e) => warn!(container = %id, error = %e, "removing a leftover ssh container failed"),
            }
        }
        removed
    }
}

fn force_remove() -> RemoveContainerOptions {
    RemoveContainerOptions { force: true, v: true, ..Default::default() }
}

/// Removes the container when dropped, so a run abandoned half-way (its future dropped) still
/// cleans up; `now` does it in line so the caller knows it is gone.
struct Removal {
    docker: Docker,
    id: Option<String>,
}

impl Removal {
    async fn now(&mut self) {
        if let Some(id) = self.id.take() {
            remove(&self.docker, &id).await;
        }
    }
}

impl Drop for Removal {
    fn drop(&mut self) {
        if let Some(id) = self.id.take()
            && let Ok(handle) = tokio::runtime::Handle::try_current()
        {
            let docker = self.docker.clone();
            handle.spawn(async move { remove(&docker, &id).await });
        }
    }
}

async fn remove(docker: &Docker, id: &str) {
    match docker.remove_container(id, Some(force_remove())).await {
        Ok(()) | Err(DockerError::DockerResponseServerError { status_code: 404, .. }) => {}
        Err(e) => warn!(container = %id, error = %e, "removing the ssh container failed"),
    }
}

/// An engine error as the worker decides on it: a request the engine refuses (4xx) will be
/// refused again; anything else (engine down, timeouts, 5xx) may pass on another try.
fn engine_error(doing: &str, e: DockerError) -> ExecError {
    match &e {
        DockerError::DockerResponseServerError { status_code, message } if (400..500).contains(status_code) => {
            ExecError::Permanent(format!("{doing}: {message}"))
        }
        _ => ExecError::Retryable(format!("{doing}: {e}")),
    }
}

fn prepare_host_dirs(plan: &Plan) -> Result<(), ExecError> {
    for dir in &plan.host_dirs {
        std::fs::create_dir_all(dir).map_err(|e| ExecError::Retryable(format!("creating {}: {e}", dir.display())))?;
    }
    // Many images run as a user other than the worker's: the output folder must take their files.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&plan.output_dir, std::fs::Permissions::from_mode(0o777))
        .map_err(|e| ExecError::Retryable(format!("opening up {}: {e}", plan.output_dir.display())))?;
    Ok(())
}

/// Follows the container's output into `stdout.log` and `stderr.log` until it ends.
async fn copy_logs(docker: Docker, id: String, dir: PathBuf) -> std::io::Result<()> {
    let mut stdout = tokio::fs::File::create(dir.join("stdout.log")).await?;
    let mut stderr = tokio::fs::File::create(dir.join("stderr.log")).await?;
    let options = LogsOptions { follow: true, stdout: true, stderr: true, ..Default::default() };
    let mut stream = docker.logs(&id, Some(options));
    while let Some(item) = stream.next().await {
        match item {
            Ok(LogOutput::StdErr { message }) => stderr.write_all(&message).await?,
            Ok(LogOutput::StdOut { message } | LogOutput::Console { message }) => stdout.write_all(&message).await?,
            Ok(LogOutput::StdIn { .. }) => {}
            Err(e) => {
                warn!(container = %id, error = %e, "reading the container's logs failed");
                break;
            }
        }
    }
    stdout.flush().await?;
    stderr.flush().await
}

/// Bytes in the regular files under `dir`; links are counted as themselves, never followed.
fn folder_size(dir: &Path) -> u64 {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.metadata().ok())
        .filter(|meta| !meta.is_dir())
        .map(|meta| meta.len())
        .sum()
}
