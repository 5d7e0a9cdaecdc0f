//! The `ssh` executor: runs a task's container through the Docker engine (`bollard`) under the
//! operator's caps, with the chosen GPUs, upstream inputs mounted read-only and an output folder
//! whose files become the task's artifacts.

use crate::executor::process::{self, EXIT_RETRYABLE};
use crate::executor::{ExecError, TaskContext};
use crate::gpu_subset;
use bollard::Docker;
use bollard::container::LogOutput;
use bollard::errors::Error as DockerError;
use bollard::models::{ContainerCreateBody, DeviceRequest, HostConfig, Mount, MountType, PortBinding};
use bollard::query_parameters::{
    CreateContainerOptions, CreateImageOptions, KillContainerOptions, ListContainersOptions, LogsOptions,
    RemoveContainerOptions, StatsOptions,
};
use flowmesh_domain::fleet::{Gpu, Hardware, SshLimits};
use flowmesh_domain::placement::{self, Request};
use flowmesh_domain::units::format_bytes;
use flowmesh_domain::validate::ssh_interactive;
use futures_util::StreamExt;
use serde::Serialize;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::sync::Semaphore;
use tracing::{info, warn};

pub const LABEL_TASK_ID: &str = "flowmesh.task_id";
pub const LABEL_ATTEMPT: &str = "flowmesh.attempt";
pub const LABEL_WORKER_ID: &str = "flowmesh.worker_id";
/// Which installation of the worker (its results folder): two workers that share an id and an
/// engine by mistake, or two test stacks, never sweep each other's containers.
pub const LABEL_WORKER_HOME: &str = "flowmesh.worker_home";
pub const LABEL_MANAGED: &str = "flowmesh.managed";
/// Where the output folder appears in the container when `sshOutput.mountPath` is not given.
pub const DEFAULT_OUTPUT_MOUNT: &str = "/flowmesh/output";
/// Where an input appears, under its stage name, when `inputs[].mountPath` is not given.
pub const DEFAULT_INPUTS_ROOT: &str = "/flowmesh/inputs";
/// The answer to an interactive session until this worker can host one (sshd, keys, access modes).
/// Where an interactive container finds the session's authorized keys (read-only); the same keys
/// are in `$FLOWMESH_AUTHORIZED_KEYS`. The image's own entrypoint runs an SSH server on port 22.
pub const KEYS_MOUNT: &str = "/flowmesh/ssh";
/// The container port of an interactive session's SSH server.
pub const SSH_PORT: &str = "22/tcp";

/// A hung daemon must not hold up the worker's start: past this, Docker counts as absent.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the log copy may lag behind the container's end before it is cut off.
const LOG_DRAIN: Duration = Duration::from_secs(10);
const STDOUT_TAIL_BYTES: usize = 4096;

/// What the executor needs from the worker's configuration and probe.
#[derive(Debug, Clone, PartialEq)]
pub struct SshSettings {
    pub worker_id: String,
    /// `SSH_MAX_CPU`, `SSH_MAX_MEMORY`, `SSH_MAX_PIDS`.
    pub limits: SshLimits,
    /// `ENABLE_SSH_GPU_LIMIT`: give a container only the GPUs it asked for.
    pub gpu_limit: bool,
    pub hardware: Hardware,
    /// The hardware came from `FLOWMESH_SIMULATE_HW`: its GPUs do not exist, so no device request
    /// names them (the container still gets `CUDA_VISIBLE_DEVICES`, for demos).
    pub simulated: bool,
    /// The host name users connect to for interactive sessions (`SSH_PUBLIC_HOST`).
    pub public_host: String,
    /// The host address an interactive session's port is published on (`SSH_BIND_ADDRESS`).
    pub bind_address: String,
    /// The worker's results folder, recorded on its containers (see [`LABEL_WORKER_HOME`]).
    pub home: String,
}

/// The `ssh` executor. Exists only when the Docker engine answered at start-up.
pub struct SshExecutor {
    docker: Docker,
    settings: SshSettings,
    /// One `ssh` task per worker at a time (SPEC §6): a second one waits for its turn.
    one_at_a_time: Semaphore,
}

/// A resource cap that lowered what a spec asked for.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Clamp {
    /// `cpu` or `memory` (as in `resources.hardware`).
    pub field: &'static str,
    pub requested: String,
    pub cap: String,
    /// The setting that holds the cap.
    pub variable: &'static str,
}

/// The container's resource limits: `min(spec, cap)` per field, `None` where neither is set.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Limits {
    pub nano_cpus: Option<i64>,
    pub memory_bytes: Option<i64>,
    pub pids: Option<i64>,
    pub clamped: Vec<Clamp>,
}

/// Applies the operator's caps to a task's request. A spec field of 0 counts as unset.
pub fn limits(request: &Request, caps: &SshLimits) -> Limits {
    let mut clamped = Vec::new();
    let cpu = match (request.cpu > 0.0, caps.max_cpu) {
        (false, cap) => cap,
        (true, None) => Some(request.cpu),
        (true, Some(cap)) if request.cpu > cap => {
            clamped.push(Clamp {
                field: "cpu",
                requested: request.cpu.to_string(),
                cap: cap.to_string(),
                variable: "SSH_MAX_CPU",
            });
            Some(cap)
        }
        (true, Some(_)) => Some(request.cpu),
    };
    let memory = match (request.memory_bytes > 0, caps.max_memory_bytes) {
        (false, cap) => cap,
        (true, None) => Some(request.memory_bytes),
        (true, Some(cap)) if request.memory_bytes > cap => {
            clamped.push(Clamp {
                field: "memory",
                requested: format_bytes(request.memory_bytes),
                cap: format_bytes(cap),
                variable: "SSH_MAX_MEMORY",
            });
            Some(cap)
        }
        (true, Some(_)) => Some(request.memory_bytes),
    };
    Limits {
        nano_cpus: cpu.map(|c| (c * 1e9).round() as i64),
        memory_bytes: memory.map(|m| i64::try_from(m).unwrap_or(i64::MAX)),
        pids: caps.max_pids,
        clamped,
    }
}

/// The host folder and container path of each `inputs[]` entry: `<work_dir>/inputs/<stage>/` at
/// `mountPath` (default `/flowmesh/inputs/<stage>`). The executor creates the folders and mounts
/// them read-only; the worker fills them with the upstream stage's stored files beforehand.
pub fn input_mounts(spec: &Value, work_dir: &Path) -> Vec<(PathBuf, String)> {
    let Some(inputs) = spec.get("inputs").and_then(Value::as_array) else {
        return Vec::new();
    };
    inputs
        .iter()
        .map(|input| {
            let stage = input.get("stage").and_then(Value::as_str).unwrap_or("input");
            let target = input
                .get("mountPath")
                .and_then(Value::as_str)
                .map_or_else(|| format!("{DEFAULT_INPUTS_ROOT}/{stage}"), str::to_owned);
            // The worker downloads the stage's stored files here before the run (`fetch_inputs`).
            (work_dir.join("inputs").join(stage), target)
        })
        .collect()
}

/// Where the output folder appears in the container.
pub fn output_mount(spec: &Value) -> String {
    spec.pointer("/sshOutput/mountPath").and_then(Value::as_str).unwrap_or(DEFAULT_OUTPUT_MOUNT).to_owned()
}

/// `sshOutput.maxBytes`: an integer, or a string holding one (a resolved placeholder may be either).
pub fn max_output_bytes(spec: &Value) -> Result<Option<u64>, String> {
    match spec.pointer("/sshOutput/maxBytes") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("sshOutput.maxBytes must be a whole number of bytes >= 0, found {n}")),
        Some(Value::String(s)) => s
            .trim()
            .parse::<u64>()
            .map(Some)
            .map_err(|_| format!("sshOutput.maxBytes must be a whole number of bytes >= 0, found {s:?}")),
        Some(other) => Err(format!("sshOutput.maxBytes must be a whole number of bytes, found {other}")),
    }
}

/// A command line as the container takes it: a string runs through `/bin/sh -c`, a list as is.
fn command_line(value: Option<&Value>) -> Option<Vec<String>> {
    match value? {
        Value::String(line) => Some(vec!["/bin/sh".into(), "-c".into(), line.clone()]),
        Value::Array(items) => {
            Some(items.iter().map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned)).collect())
        }
        _ => None,
    }
}

/// Everything decided before the engine is called: pure over the task and the settings.
#[derive(Debug, Clone)]
pub struct Plan {
    pub image: String,
    pub name: String,
    pub body: ContainerCreateBody,
    pub limits: Limits,
    pub gpus: Vec<Gpu>,
    /// Host folders to create before the container starts (inputs, output).
    pub host_dirs: Vec<PathBuf>,
    pub output_dir: PathBuf,
    pub output_mount: String,
    pub max_output_bytes: Option<u64>,
    /// The earlier of `ttlSeconds` and the maximum runtime: past it the container is killed.
    pub deadline: Option<Duration>,
    /// Set for an interactive session (authorized keys, no command).
    pub session: Option<Session>,
}

/// An interactive session: an SSH server in the container, reachable on a published port.
#[derive(Debug, Clone, PartialEq)]
pub struct Session {
    pub user: String,
    pub authorized_keys: Vec<String>,
    /// Host folder holding `authorized_keys`, mounted read-only at [`KEYS_MOUNT`].
    pub keys_dir: PathBuf,
    /// Without network traffic for this long, the session ends.
    pub idle_timeout: Option<Duration>,
}

/// Builds the container a batch `ssh` task runs in. Errors are permanent: the spec cannot run here.
pub fn plan(ctx: &TaskContext, settings: &SshSettings) -> Result<Plan, ExecError> {
    let spec = &ctx.order.spec;
    let image = match spec.get("image").and_then(Value::as_str).map(str::trim) {
        Some(image) if !image.is_empty() => image.to_owned(),
        _ => return Err(ExecError::Permanent("an ssh task needs an image to run".to_owned())),
    };
    let request = placement::request_for("ssh", spec, None)
        .map_err(|e| ExecError::Permanent(format!("resources.hardware: {e}")))?;
    let limits = limits(&request, &settings.limits);
    let gpus =
        gpu_subset::select(&request.gpu, &settings.hardware, settings.gpu_limit).map_err(ExecError::Permanent)?;
    let max_output_bytes = max_output_bytes(spec).map_err(ExecError::Permanent)?;
    let absolute =
        |p: &Path| std::path::absolute(p).map_err(|e| ExecError::Retryable(format!("resolving {}: {e}", p.display())));
    let output_dir = absolute(&ctx.output_dir)?;
    let output_mount = output_mount(spec);
    let bind = |source: &Path, target: &str, read_only: bool| Mount {
        target: Some(target.to_owned()),
        source: Some(source.display().to_string()),
        typ: Some(MountType::BIND),
        read_only: Some(read_only),
        ..Default::default()
    };
    let mut mounts = vec![bind(&output_dir, &output_mount, false)];
    let mut host_dirs = vec![output_dir.clone()];
    for (host, target) in input_mounts(spec, &ctx.work_dir) {
        let host = absolute(&host)?;
        mounts.push(bind(&host, &target, true));
        host_dirs.push(host);
    }

    let session = if ssh_interactive(spec) {
        let authorized_keys: Vec<String> = spec
            .get("authorizedKeys")
            .and_then(Value::as_array)
            .map(|keys| keys.iter().filter_map(Value::as_str).map(|k| k.trim().to_owned()).collect())
            .unwrap_or_default();
        if authorized_keys.is_empty() {
            return Err(ExecError::Permanent("an interactive ssh session needs authorizedKeys".to_owned()));
        }
        let keys_dir = absolute(&ctx.work_dir.join("ssh"))?;
        mounts.push(bind(&keys_dir, KEYS_MOUNT, true));
        host_dirs.push(keys_dir.clone());
        Some(Session {
            user: spec.get("user").and_then(Value::as_str).unwrap_or("root").to_owned(),
            authorized_keys,
            keys_dir,
            idle_timeout: spec
                .get("idleTimeoutSeconds")
                .and_then(Value::as_f64)
                .filter(|s| s.is_finite() && *s > 0.0)
                .map(Duration::from_secs_f64),
        })
    } else {
        None
    };

    let mut env: BTreeMap<String, String> = BTreeMap::new();
    if let Some(Value::Object(vars)) = spec.get("env") {
        for (k, v) in vars {
            env.insert(k.clone(), v.as_str().map_or_else(|| v.to_string(), str::to_owned));
        }
    }
    env.insert("FLOWMESH_TASK_ID".into(), ctx.order.task_id.clone());
    env.insert("FLOWMESH_ATTEMPT".into(), ctx.order.attempt.to_string());
    env.insert("FLOWMESH_OUTPUT_DIR".into(), output_mount.clone());
    if let Some(session) = &session {
        env.insert("FLOWMESH_AUTHORIZED_KEYS".into(), session.authorized_keys.join("\n"));
        env.insert("FLOWMESH_SSH_USER".into(), session.user.clone());
    }
    let mut device_requests = None;
    if !gpus.is_empty() {
        // Inside the container the devices are renumbered from 0 in the order given.
        let visible: Vec<String> = (0..gpus.len()).map(|i| i.to_string()).collect();
        env.insert("CUDA_VISIBLE_DEVICES".into(), visible.join(","));
        if settings.simulated {
            info!(gpus = gpus.len(), "simulated hardware: no device request for GPUs that do not exist");
        } else {
            device_requests = Some(vec![DeviceRequest {
                // Host UUIDs: the probe's indices are renumbered after CUDA_VISIBLE_DEVICES.
                device_ids: Some(
                    gpus.iter().map(|g| if g.uuid.is_empty() { g.index.to_string() } else { g.uuid.clone() }).collect(),
                ),
                capabilities: Some(vec![vec!["gpu".into()]]),
                ..Default::default()
            }]);
        }
    }

    let labels: HashMap<String, String> = [
        (LABEL_TASK_ID, ctx.order.task_id.clone()),
        (LABEL_ATTEMPT, ctx.order.attempt.to_string()),
        (LABEL_WORKER_ID, settings.worker_id.clone()),
        (LABEL_WORKER_HOME, settings.home.clone()),
        (LABEL_MANAGED, "true".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let seconds = |key: &str| spec.get(key).and_then(Value::as_f64).filter(|s| s.is_finite() && *s > 0.0);
    let ttl = seconds("ttlSeconds").map(Duration::from_secs_f64);
    let deadline = match (ttl, ctx.max_runtime) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let port_bindings = session.as_ref().map(|_| {
        // An empty host port asks the engine for a free one; the session reports which.
        let binding = PortBinding { host_ip: Some(settings.bind_address.clone()), host_port: Some(String::new()) };
        HashMap::from([(SSH_PORT.to_owned(), Some(vec![binding]))])
    });
    let body = ContainerCreateBody {
        image: Some(image.clone()),
        // A session runs the image's own entrypoint: its SSH server.
        cmd: if session.is_some() { None } else { command_line(spec.get("command")) },
        entrypoint: if session.is_some() { None } else { command_line(spec.get("entrypoint")) },
        exposed_ports: session.as_ref().map(|_| vec![SSH_PORT.to_owned()]),
        env: Some(env.into_iter().map(|(k, v)| format!("{k}={v}")).collect()),
        labels: Some(labels),
        host_config: Some(HostConfig {
            nano_cpus: limits.nano_cpus,
            memory: limits.memory_bytes,
            pids_limit: limits.pids,
            device_requests,
            mounts: Some(mounts),
            port_bindings,
            ..Default::default()
        }),
        ..Default::default()
    };
    Ok(Plan {
        image,
        name: format!("flowmesh-{}-a{}", ctx.order.task_id, ctx.order.attempt),
        body,
        limits,
        gpus,
        host_dirs,
        output_dir,
        output_mount,
        max_output_bytes,
        deadline,
        session,
    })
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
        let stderr_tail = || process::tail(&ctx.work_dir.join("stderr.log"), 400);
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
                let tail = stderr_tail();
                let mut message = format!("the container exited with status {c}");
                if !tail.is_empty() {
                    message += &format!("; stderr ends: {tail}");
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
            "stdout": process::tail(&ctx.work_dir.join("stdout.log"), STDOUT_TAIL_BYTES),
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
        let deadline = async {
            match plan.deadline {
                Some(limit) => tokio::time::sleep(limit).await,
                None => std::future::pending().await,
            }
        };
        let mut wait = self.docker.wait_container(id, None);
        let end = tokio::select! {
            status = wait.next() => match status {
                Some(Ok(response)) => Ok(End::Exited(response.status_code)),
                Some(Err(DockerError::DockerContainerWaitError { code, .. })) => Ok(End::Exited(code)),
                Some(Err(e)) => Err(engine_error("waiting for the container", e)),
                None => Err(ExecError::Retryable("the engine ended the wait without an exit status".to_owned())),
            },
            _ = cancel.wait() => Ok(End::Cancelled),
            _ = deadline => Ok(End::TimedOut(plan.deadline.unwrap_or_default())),
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
        let deadline = async {
            match plan.deadline {
                Some(limit) => tokio::time::sleep(limit).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(deadline);
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
                _ = &mut deadline => break ("ttl", None),
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

/// `repo[:tag]` or `repo@digest` → what the pull API takes. A missing tag means `latest`: without
/// one the engine would pull every tag of the repository.
fn split_image(image: &str) -> (String, Option<String>) {
    if image.contains('@') {
        return (image.to_owned(), None);
    }
    let name_start = image.rfind('/').map_or(0, |i| i + 1);
    match image[name_start..].rfind(':') {
        Some(i) => (image[..name_start + i].to_owned(), Some(image[name_start + i + 1..].to_owned())),
        None => (image.to_owned(), Some("latest".to_owned())),
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
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(current) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&current) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.path().symlink_metadata() else {
                continue;
            };
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                total += meta.len();
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowmesh_domain::work::WorkOrder;

    const GIB: u64 = 1 << 30;

    fn request(cpu: f64, memory_bytes: u64) -> Request {
        Request { task_type: "ssh".into(), cpu, memory_bytes, ..Request::default() }
    }

    /// (case, request, caps, then the container's nano_cpus, memory, pids and the clamped fields)
    type Case = (&'static str, Request, SshLimits, Option<i64>, Option<i64>, Option<i64>, &'static [&'static str]);

    #[test]
    fn caps_clamp_what_the_spec_asks() {
        let caps = SshLimits { max_cpu: Some(2.0), max_memory_bytes: Some(4 * GIB), max_pids: Some(256) };
        let none = SshLimits::default();
        let cases: &[Case] = &[
            ("under the caps", request(1.5, GIB), caps, Some(1_500_000_000), Some(GIB as i64), Some(256), &[]),
            (
                "over the caps",
                request(8.0, 16 * GIB),
                caps,
                Some(2_000_000_000),
                Some(4 * GIB as i64),
                Some(256),
                &["cpu", "memory"],
            ),
            (
                "unset spec takes the caps",
                request(0.0, 0),
                caps,
                Some(2_000_000_000),
                Some(4 * GIB as i64),
                Some(256),
                &[],
            ),
            ("no caps: the spec", request(3.0, 2 * GIB), none, Some(3_000_000_000), Some(2 * GIB as i64), None, &[]),
            ("neither: nothing set", request(0.0, 0), none, None, None, None, &[]),
        ];
        for (name, req, caps, cpu, memory, pids, clamped) in cases {
            let got = limits(req, caps);
            assert_eq!(got.nano_cpus, *cpu, "{name}: nano_cpus");
            assert_eq!(got.memory_bytes, *memory, "{name}: memory");
            assert_eq!(got.pids, *pids, "{name}: pids");
            assert_eq!(got.clamped.iter().map(|c| c.field).collect::<Vec<_>>(), *clamped, "{name}: clamped");
        }
    }

    #[test]
    fn image_references_name_one_tag() {
        let cases = [
            ("python:3.12-slim", ("python", Some("3.12-slim"))),
            ("ubuntu", ("ubuntu", Some("latest"))),
            ("registry.local:5000/team/img", ("registry.local:5000/team/img", Some("latest"))),
            ("registry.local:5000/team/img:v2", ("registry.local:5000/team/img", Some("v2"))),
            ("img@sha256:abc", ("img@sha256:abc", None)),
        ];
        for (image, (repo, tag)) in cases {
            assert_eq!(split_image(image), (repo.to_owned(), tag.map(str::to_owned)), "{image}");
        }
    }

    fn context(spec: Value, work_dir: &Path) -> (flowmesh_nats::Trigger, TaskContext) {
        let (trigger, cancel) = flowmesh_nats::shutdown::channel();
        let order = WorkOrder {
            workflow_id: "wf-1".into(),
            task_id: "wf-1-run".into(),
            stage: "run".into(),
            attempt: 2,
            task_type: "ssh".into(),
            spec,
            upstream: BTreeMap::new(),
            upstream_artifacts: BTreeMap::new(),
            upstream_results: BTreeMap::new(),
        };
        let ctx = TaskContext {
            order,
            work_dir: work_dir.to_path_buf(),
            output_dir: work_dir.join("output"),
            gpus: Vec::new(),
            cancel,
            max_runtime: Some(Duration::from_secs(900)),
            updates: None,
        };
        (trigger, ctx)
    }

    fn settings(gpus: Vec<Gpu>, gpu_limit: bool) -> SshSettings {
        SshSettings {
            worker_id: "w-1".into(),
            limits: SshLimits::default(),
            gpu_limit,
            hardware: Hardware { cpu_cores: 8, memory_bytes: 32 * GIB, gpus, ..Hardware::default() },
            simulated: false,
            public_host: "localhost".into(),
            bind_address: "127.0.0.1".into(),
            home: "/tmp/w-1".into(),
        }
    }

    fn h100(index: u32) -> Gpu {
        Gpu { index, uuid: format!("GPU-h100-{index}"), name: "NVIDIA H100".into(), memory_bytes: 80 * GIB }
    }

    #[test]
    fn the_plan_follows_the_spec() {
        let dir = Path::new("/srv/results/wf-1-run");
        let spec = json!({
            "taskType": "ssh",
            "image": "python:3.12-slim",
            "command": "echo hi",
            "entrypoint": ["/usr/bin/env"],
            "env": {"BATCH_SIZE": 32, "LOG_LEVEL": "info"},
            "ttlSeconds": 60,
            "inputs": [{"stage": "collect", "mountPath": "/mnt/in"}, {"stage": "other"}],
            "sshOutput": {"mountPath": "/mnt/out", "maxBytes": "1024"},
            "resources": {"hardware": {"gpu": {"count": 1}}},
        });
        let (_trigger, ctx) = context(spec, dir);
        let plan = plan(&ctx, &settings(vec![h100(0), h100(1)], true)).expect("plans");
        let body = &plan.body;
        assert_eq!(body.cmd.as_deref(), Some(&["/bin/sh".to_owned(), "-c".into(), "echo hi".into()][..]));
        assert_eq!(body.entrypoint.as_deref(), Some(&["/usr/bin/env".to_owned()][..]));
        let env = body.env.clone().unwrap();
        for want in ["BATCH_SIZE=32", "LOG_LEVEL=info", "CUDA_VISIBLE_DEVICES=0", "FLOWMESH_OUTPUT_DIR=/mnt/out"] {
            assert!(env.iter().any(|e| e == want), "env {env:?} lacks {want}");
        }
        let labels = body.labels.clone().unwrap();
        assert_eq!(labels[LABEL_TASK_ID], "wf-1-run");
        assert_eq!(labels[LABEL_ATTEMPT], "2");
        assert_eq!(labels[LABEL_WORKER_ID], "w-1");
        assert_eq!(labels[LABEL_MANAGED], "true");
        let host = body.host_config.clone().unwrap();
        let devices = host.device_requests.unwrap();
        assert_eq!(devices[0].device_ids, Some(vec!["GPU-h100-0".to_owned()]));
        assert_eq!(devices[0].capabilities, Some(vec![vec!["gpu".to_owned()]]));
        let mounts: Vec<(String, String, bool)> = host
            .mounts
            .unwrap()
            .into_iter()
            .map(|m| (m.source.unwrap(), m.target.unwrap(), m.read_only.unwrap()))
            .collect();
        assert_eq!(
            mounts,
            vec![
                ("/srv/results/wf-1-run/output".to_owned(), "/mnt/out".to_owned(), false),
                ("/srv/results/wf-1-run/inputs/collect".to_owned(), "/mnt/in".to_owned(), true),
                ("/srv/results/wf-1-run/inputs/other".to_owned(), "/flowmesh/inputs/other".to_owned(), true),
            ]
        );
        assert_eq!(plan.max_output_bytes, Some(1024));
        assert_eq!(plan.deadline, Some(Duration::from_secs(60)), "ttlSeconds is earlier than the max runtime");
        assert_eq!((host.nano_cpus, host.memory, host.pids_limit), (None, None, None));
    }

    #[test]
    fn gpus_without_the_limit_and_errors() {
        let dir = Path::new("/srv/results/wf-1-run");
        let batch = |extra: Value| {
            let mut spec = json!({"taskType": "ssh", "image": "img", "command": "true"});
            spec.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            spec
        };
        let (_t, ctx) = context(batch(json!({})), dir);
        let all = plan(&ctx, &settings(vec![h100(0), h100(1)], false)).expect("plans");
        let devices = all.body.host_config.unwrap().device_requests.unwrap();
        assert_eq!(devices[0].device_ids, Some(vec!["GPU-h100-0".to_owned(), "GPU-h100-1".to_owned()]));
        let none = plan(&ctx, &settings(vec![], true)).expect("plans");
        assert_eq!(none.body.host_config.unwrap().device_requests, None, "no GPUs, no device request");
        assert!(!none.body.env.unwrap().iter().any(|e| e.starts_with("CUDA_VISIBLE_DEVICES=")));

        let cases = [
            (batch(json!({"resources": {"hardware": {"gpu": {"count": 1}}}})), "this worker has no GPUs"),
            (json!({"taskType": "ssh", "command": "true"}), "needs an image"),
            (batch(json!({"sshOutput": {"maxBytes": "lots"}})), "sshOutput.maxBytes"),
            (batch(json!({"resources": {"hardware": {"memory": "1.5Gi"}}})), "resources.hardware"),
        ];
        for (spec, fragment) in cases {
            let (_t, ctx) = context(spec, dir);
            match plan(&ctx, &settings(vec![], true)) {
                Err(ExecError::Permanent(m)) => assert!(m.contains(fragment), "{m:?} should mention {fragment:?}"),
                other => panic!("expected a permanent error mentioning {fragment:?}, got {:?}", other.map(|p| p.name)),
            }
        }
    }
}
