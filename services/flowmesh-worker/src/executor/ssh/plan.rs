//! The pure half of the `ssh` executor: everything that decides a task's container without
//! talking to the engine — the caps over the request (`limits`, `Clamp`), the GPUs, the mounts,
//! the environment, the command, the deadline and an interactive `Session` — as one `Plan`.

use crate::executor::context::{Contract, ExecError, TaskContext, command_line, device_id, task_env};
use crate::gpu_subset;
use bollard::models::{ContainerCreateBody, DeviceRequest, HostConfig, Mount, MountType, PortBinding};
use flowmesh_domain::fleet::{Gpu, Hardware, SshLimits};
use flowmesh_domain::placement::{self, Request};
use flowmesh_domain::units::format_bytes;
use flowmesh_domain::validate::ssh_interactive;
use serde::Serialize;
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tracing::info;

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
/// Where an interactive container finds the session's authorized keys (read-only); the same keys
/// are in `$FLOWMESH_AUTHORIZED_KEYS`. The image's own entrypoint runs an SSH server on port 22.
pub const KEYS_MOUNT: &str = "/flowmesh/ssh";
/// The container port of an interactive session's SSH server.
pub const SSH_PORT: &str = "22/tcp";

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

    // The container sees its mounts, not the worker's paths: no task or result file, no inputs
    // folder; CUDA_VISIBLE_DEVICES only when it is given GPUs, renumbered from 0 in the order given.
    let mut env = task_env(
        &ctx.order,
        &Contract {
            output_dir: &output_mount,
            work_dir: None,
            visible_gpus: (!gpus.is_empty()).then(|| (0..gpus.len()).map(|i| i.to_string()).collect()),
        },
    );
    if let Some(session) = &session {
        env.insert("FLOWMESH_AUTHORIZED_KEYS".into(), session.authorized_keys.join("\n"));
        env.insert("FLOWMESH_SSH_USER".into(), session.user.clone());
    }
    let mut device_requests = None;
    if !gpus.is_empty() {
        if settings.simulated {
            info!(gpus = gpus.len(), "simulated hardware: no device request for GPUs that do not exist");
        } else {
            device_requests = Some(vec![DeviceRequest {
                // Host UUIDs: the probe's indices are renumbered after CUDA_VISIBLE_DEVICES.
                device_ids: Some(gpus.iter().map(device_id).collect()),
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

/// `repo[:tag]` or `repo@digest` → what the pull API takes. A missing tag means `latest`: without
/// one the engine would pull every tag of the repository.
pub fn split_image(image: &str) -> (String, Option<String>) {
    if image.contains('@') {
        return (image.to_owned(), None);
    }
    let name_start = image.rfind('/').map_or(0, |i| i + 1);
    match image[name_start..].rfind(':') {
        Some(i) => (image[..name_start + i].to_owned(), Some(image[name_start + i + 1..].to_owned())),
        None => (image.to_owned(), Some("latest".to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowmesh_domain::work::WorkOrder;
    use serde_json::json;
    use std::collections::BTreeMap;

    const GIB: u64 = 1 << 30;
    const DIR: &str = "/srv/results/wf-1-run";
    /// The task's maximum runtime in every row (`TaskContext::max_runtime`).
    const MAX_RUNTIME: Duration = Duration::from_secs(900);

    /// One task in, the plan (or the error) out.
    struct Case {
        name: &'static str,
        spec: Value,
        /// The worker's GPUs.
        gpus: Vec<Gpu>,
        /// `ENABLE_SSH_GPU_LIMIT`.
        gpu_limit: bool,
        /// `SSH_MAX_CPU`, `SSH_MAX_MEMORY`, `SSH_MAX_PIDS`.
        caps: SshLimits,
        /// The plan, or a fragment of its permanent error.
        want: Result<Want, &'static str>,
    }

    /// Everything a row expects of a plan; `check` compares every field.
    struct Want {
        cmd: Option<&'static [&'static str]>,
        entrypoint: Option<&'static [&'static str]>,
        /// The container's whole environment, sorted.
        env: &'static [&'static str],
        /// The device ids of the GPU request; `None`: no request.
        devices: Option<&'static [&'static str]>,
        /// (host folder, container path, read-only), the output folder first.
        mounts: &'static [(&'static str, &'static str, bool)],
        /// Nano-CPUs, memory bytes, pids: on the plan and in the host config.
        limits: (Option<i64>, Option<i64>, Option<i64>),
        clamped: &'static [&'static str],
        max_output_bytes: Option<u64>,
        deadline: Option<Duration>,
        /// The user of an interactive session; `None`: a batch container.
        session_user: Option<&'static str>,
    }

    /// `{"image": "img", "command": "true"}` plus `extra`.
    fn batch(extra: Value) -> Value {
        let mut spec = json!({"taskType": "ssh", "image": "img", "command": "true"});
        spec.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        spec
    }

    /// What `batch(json!({}))` plans to on a worker without GPUs or caps.
    fn batch_plan() -> Want {
        Want {
            cmd: Some(&["/bin/sh", "-c", "true"]),
            entrypoint: None,
            env: &["FLOWMESH_ATTEMPT=2", "FLOWMESH_OUTPUT_DIR=/flowmesh/output", "FLOWMESH_TASK_ID=wf-1-run"],
            devices: None,
            mounts: &[("/srv/results/wf-1-run/output", "/flowmesh/output", false)],
            limits: (None, None, None),
            clamped: &[],
            max_output_bytes: None,
            deadline: Some(MAX_RUNTIME),
            session_user: None,
        }
    }

    fn h100(index: u32) -> Gpu {
        Gpu { index, uuid: format!("GPU-h100-{index}"), name: "NVIDIA H100".into(), memory_bytes: 80 * GIB }
    }

    fn context(spec: Value) -> (flowmesh_nats::Trigger, TaskContext) {
        let (trigger, cancel) = flowmesh_nats::shutdown::channel();
        let order = WorkOrder {
            workflow_id: "wf-1".into(),
            task_id: "wf-1-run".into(),
            stage: "run".into(),
            attempt: 2,
            task_type: "ssh".into(),
            spec: spec.into(),
            upstream: BTreeMap::new(),
            upstream_artifacts: BTreeMap::new(),
            upstream_results: BTreeMap::new(),
        };
        let ctx = TaskContext {
            order: std::sync::Arc::new(order),
            work_dir: PathBuf::from(DIR),
            output_dir: Path::new(DIR).join("output"),
            gpus: Vec::new(),
            cancel,
            max_runtime: Some(MAX_RUNTIME),
            updates: None,
        };
        (trigger, ctx)
    }

    fn settings(gpus: Vec<Gpu>, gpu_limit: bool, limits: SshLimits) -> SshSettings {
        SshSettings {
            worker_id: "w-1".into(),
            limits,
            gpu_limit,
            hardware: Hardware { cpu_cores: 8, memory_bytes: 32 * GIB, gpus, ..Hardware::default() },
            simulated: false,
            public_host: "localhost".into(),
            bind_address: "127.0.0.1".into(),
            home: "/tmp/w-1".into(),
        }
    }

    fn check(case: Case) {
        let name = case.name;
        let (_trigger, ctx) = context(case.spec);
        let planned = plan(&ctx, &settings(case.gpus, case.gpu_limit, case.caps));
        let (want, plan) = match (case.want, planned) {
            (Ok(want), Ok(got)) => (want, got),
            (Err(fragment), Err(ExecError::Permanent(m))) => {
                assert!(m.contains(fragment), "{name}: {m:?} should mention {fragment:?}");
                return;
            }
            (Err(fragment), other) => {
                panic!("{name}: expected a permanent error mentioning {fragment:?}, got {:?}", other.map(|p| p.name))
            }
            (Ok(_), Err(e)) => panic!("{name}: expected a plan, got {e:?}"),
        };
        let owned = |items: Option<&[&str]>| items.map(|i| i.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
        let body = &plan.body;
        assert_eq!(plan.image, body.image.clone().unwrap(), "{name}: image");
        assert_eq!(plan.name, "flowmesh-wf-1-run-a2", "{name}: container name");
        assert_eq!(body.cmd, owned(want.cmd), "{name}: cmd");
        assert_eq!(body.entrypoint, owned(want.entrypoint), "{name}: entrypoint");
        let mut env = body.env.clone().unwrap();
        env.sort();
        assert_eq!(env, owned(Some(want.env)).unwrap(), "{name}: env");
        let labels = body.labels.clone().unwrap();
        assert_eq!(labels[LABEL_TASK_ID], "wf-1-run", "{name}");
        assert_eq!(labels[LABEL_ATTEMPT], "2", "{name}");
        assert_eq!(labels[LABEL_WORKER_ID], "w-1", "{name}");
        assert_eq!(labels[LABEL_WORKER_HOME], "/tmp/w-1", "{name}");
        assert_eq!(labels[LABEL_MANAGED], "true", "{name}");
        let host = body.host_config.clone().unwrap();
        let devices = host.device_requests.clone();
        assert_eq!(devices.as_ref().map(Vec::len).unwrap_or(1), 1, "{name}: one device request at most");
        let device = devices.as_ref().map(|d| &d[0]);
        assert_eq!(device.and_then(|d| d.device_ids.clone()), owned(want.devices), "{name}: device ids");
        if let Some(device) = device {
            assert_eq!(device.capabilities, Some(vec![vec!["gpu".to_owned()]]), "{name}: capabilities");
        }
        let mounts: Vec<(String, String, bool)> = host
            .mounts
            .clone()
            .unwrap()
            .into_iter()
            .map(|m| (m.source.unwrap(), m.target.unwrap(), m.read_only.unwrap()))
            .collect();
        let want_mounts: Vec<(String, String, bool)> =
            want.mounts.iter().map(|(s, t, r)| ((*s).to_owned(), (*t).to_owned(), *r)).collect();
        assert_eq!(mounts, want_mounts, "{name}: mounts");
        let (cpu, memory, pids) = want.limits;
        assert_eq!((plan.limits.nano_cpus, plan.limits.memory_bytes, plan.limits.pids), want.limits, "{name}: limits");
        assert_eq!((host.nano_cpus, host.memory, host.pids_limit), (cpu, memory, pids), "{name}: host config");
        let clamped: Vec<&str> = plan.limits.clamped.iter().map(|c| c.field).collect();
        assert_eq!(clamped, want.clamped, "{name}: clamped");
        assert_eq!(plan.max_output_bytes, want.max_output_bytes, "{name}: max output bytes");
        assert_eq!(plan.deadline, want.deadline, "{name}: deadline");
        assert_eq!(plan.session.as_ref().map(|s| s.user.as_str()), want.session_user, "{name}: session");
        let ports = plan.session.as_ref().map(|_| vec![SSH_PORT.to_owned()]);
        assert_eq!(body.exposed_ports, ports, "{name}: a session exposes its SSH port, a batch task none");
    }

    #[test]
    fn the_plan_follows_the_spec() {
        let caps = SshLimits { max_cpu: Some(2.0), max_memory_bytes: Some(4 * GIB), max_pids: Some(256) };
        let none = SshLimits::default();
        let four_gib = Some(4 * GIB as i64);
        let cases = vec![
            Case {
                name: "command, entrypoint, env, inputs, output, ttl and one GPU under the limit",
                spec: json!({
                    "taskType": "ssh",
                    "image": "python:3.12-slim",
                    "command": "echo hi",
                    "entrypoint": ["/usr/bin/env"],
                    "env": {"BATCH_SIZE": 32, "LOG_LEVEL": "info"},
                    "ttlSeconds": 60,
                    "inputs": [{"stage": "collect", "mountPath": "/mnt/in"}, {"stage": "other"}],
                    "sshOutput": {"mountPath": "/mnt/out", "maxBytes": "1024"},
                    "resources": {"hardware": {"gpu": {"count": 1}}},
                }),
                gpus: vec![h100(0), h100(1)],
                gpu_limit: true,
                caps: none,
                want: Ok(Want {
                    cmd: Some(&["/bin/sh", "-c", "echo hi"]),
                    entrypoint: Some(&["/usr/bin/env"]),
                    env: &[
                        "BATCH_SIZE=32",
                        "CUDA_VISIBLE_DEVICES=0",
                        "FLOWMESH_ATTEMPT=2",
                        "FLOWMESH_OUTPUT_DIR=/mnt/out",
                        "FLOWMESH_TASK_ID=wf-1-run",
                        "LOG_LEVEL=info",
                    ],
                    devices: Some(&["GPU-h100-0"]),
                    mounts: &[
                        ("/srv/results/wf-1-run/output", "/mnt/out", false),
                        ("/srv/results/wf-1-run/inputs/collect", "/mnt/in", true),
                        ("/srv/results/wf-1-run/inputs/other", "/flowmesh/inputs/other", true),
                    ],
                    max_output_bytes: Some(1024),
                    // ttlSeconds is earlier than the maximum runtime.
                    deadline: Some(Duration::from_secs(60)),
                    ..batch_plan()
                }),
            },
            Case {
                name: "without the GPU limit: every GPU, renumbered from 0",
                spec: batch(json!({})),
                gpus: vec![h100(0), h100(1)],
                gpu_limit: false,
                caps: none,
                want: Ok(Want {
                    env: &[
                        "CUDA_VISIBLE_DEVICES=0,1",
                        "FLOWMESH_ATTEMPT=2",
                        "FLOWMESH_OUTPUT_DIR=/flowmesh/output",
                        "FLOWMESH_TASK_ID=wf-1-run",
                    ],
                    devices: Some(&["GPU-h100-0", "GPU-h100-1"]),
                    ..batch_plan()
                }),
            },
            Case {
                name: "no GPUs: no device request, no CUDA_VISIBLE_DEVICES; neither caps nor spec: nothing set",
                spec: batch(json!({})),
                gpus: vec![],
                gpu_limit: true,
                caps: none,
                want: Ok(batch_plan()),
            },
            Case {
                name: "the contract's variables override the spec's env; CUDA_VISIBLE_DEVICES only with GPUs",
                spec: batch(json!({"env": {"FLOWMESH_TASK_ID": "mine", "CUDA_VISIBLE_DEVICES": "7"}})),
                gpus: vec![],
                gpu_limit: true,
                caps: none,
                want: Ok(Want {
                    env: &[
                        "CUDA_VISIBLE_DEVICES=7",
                        "FLOWMESH_ATTEMPT=2",
                        "FLOWMESH_OUTPUT_DIR=/flowmesh/output",
                        "FLOWMESH_TASK_ID=wf-1-run",
                    ],
                    ..batch_plan()
                }),
            },
            Case {
                name: "under the caps: the spec",
                spec: batch(json!({"resources": {"hardware": {"cpu": 1.5, "memory": "1Gi"}}})),
                gpus: vec![],
                gpu_limit: true,
                caps,
                want: Ok(Want { limits: (Some(1_500_000_000), Some(GIB as i64), Some(256)), ..batch_plan() }),
            },
            Case {
                name: "over the caps: clamped",
                spec: batch(json!({"resources": {"hardware": {"cpu": 8, "memory": "16Gi"}}})),
                gpus: vec![],
                gpu_limit: true,
                caps,
                want: Ok(Want {
                    limits: (Some(2_000_000_000), four_gib, Some(256)),
                    clamped: &["cpu", "memory"],
                    ..batch_plan()
                }),
            },
            Case {
                name: "unset spec takes the caps",
                spec: batch(json!({})),
                gpus: vec![],
                gpu_limit: true,
                caps,
                want: Ok(Want { limits: (Some(2_000_000_000), four_gib, Some(256)), ..batch_plan() }),
            },
            Case {
                name: "no caps: the spec",
                spec: batch(json!({"resources": {"hardware": {"cpu": 3, "memory": "2Gi"}}})),
                gpus: vec![],
                gpu_limit: true,
                caps: none,
                want: Ok(Want { limits: (Some(3_000_000_000), Some(2 * GIB as i64), None), ..batch_plan() }),
            },
            Case {
                name: "an interactive session: the image's own entrypoint, the keys mounted and in the env",
                spec: json!({
                    "taskType": "ssh",
                    "image": "img",
                    "authorizedKeys": [" ssh-ed25519 AAAA me "],
                    "user": "dev",
                    "ttlSeconds": 120,
                }),
                gpus: vec![],
                gpu_limit: true,
                caps: none,
                want: Ok(Want {
                    cmd: None,
                    env: &[
                        "FLOWMESH_ATTEMPT=2",
                        "FLOWMESH_AUTHORIZED_KEYS=ssh-ed25519 AAAA me",
                        "FLOWMESH_OUTPUT_DIR=/flowmesh/output",
                        "FLOWMESH_SSH_USER=dev",
                        "FLOWMESH_TASK_ID=wf-1-run",
                    ],
                    mounts: &[
                        ("/srv/results/wf-1-run/output", "/flowmesh/output", false),
                        ("/srv/results/wf-1-run/ssh", "/flowmesh/ssh", true),
                    ],
                    deadline: Some(Duration::from_secs(120)),
                    session_user: Some("dev"),
                    ..batch_plan()
                }),
            },
        ];
        let errors = [
            (batch(json!({"resources": {"hardware": {"gpu": {"count": 1}}}})), "this worker has no GPUs"),
            (json!({"taskType": "ssh", "command": "true"}), "needs an image"),
            (batch(json!({"sshOutput": {"maxBytes": "lots"}})), "sshOutput.maxBytes"),
            (batch(json!({"resources": {"hardware": {"memory": "1.5Gi"}}})), "resources.hardware"),
            (json!({"taskType": "ssh", "image": "img", "interactive": true}), "needs authorizedKeys"),
        ];
        let errors = errors.into_iter().map(|(spec, fragment)| Case {
            name: fragment,
            spec,
            gpus: vec![],
            gpu_limit: true,
            caps: none,
            want: Err(fragment),
        });
        for case in cases.into_iter().chain(errors) {
            check(case);
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
}
