//! Built-in ML runners: the `flowmesh_runners` Python package (`services/flowmesh-runners`), asked
//! at start what initialised here, then run as one process per task under the plugin contract,
//! with its GPU subset, CPU threads and progress lines (`$FLOWMESH_PROGRESS_FILE`) handled here.

use crate::executor::context::{ExecError, TaskContext, device_id};
use flowmesh_domain::fleet::{Gpu, Hardware};
use flowmesh_domain::placement::request_for;
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// How long the capability probe may take: importing torch and TRL on a busy machine is slow.
const PROBE_TIMEOUT: Duration = Duration::from_secs(180);

/// One runner that initialised: the worker advertises its task types.
#[derive(Debug, Clone, PartialEq)]
pub struct Runner {
    /// `transformers`, `vllm`, `trl`, `sentence-transformers`: inference picks by backend name.
    pub name: String,
    pub task_types: Vec<String>,
    /// The inference backends it serves (`transformers`, `vllm`), advertised for placement.
    pub backends: Vec<String>,
    /// The interpreter that imported the package.
    pub python: String,
}

/// A runner that did not initialise, by name, with the reason it gave (shown in `worker info`).
#[derive(Debug, Clone, PartialEq)]
pub struct Unavailable {
    pub name: String,
    pub task_types: Vec<String>,
    pub reason: String,
}

#[derive(Deserialize)]
struct Capabilities {
    runners: Vec<Entry>,
}

#[derive(Deserialize)]
struct Entry {
    name: String,
    task_types: Vec<String>,
    #[serde(default)]
    backends: Vec<String>,
    ok: bool,
    #[serde(default)]
    reason: Option<String>,
}

/// Reads the package's `capabilities` answer.
pub fn parse_capabilities(python: &str, text: &str) -> Result<(Vec<Runner>, Vec<Unavailable>), String> {
    let caps: Capabilities = serde_json::from_str(text.trim())
        .map_err(|e| format!("flowmesh_runners capabilities: expected JSON with \"runners\", {e}"))?;
    let mut ready = Vec::new();
    let mut missing = Vec::new();
    for e in caps.runners {
        if e.ok && !e.task_types.is_empty() {
            ready.push(Runner {
                name: e.name,
                task_types: e.task_types,
                backends: e.backends,
                python: python.to_owned(),
            });
        } else {
            let reason = e.reason.unwrap_or_else(|| "it serves no task type here".to_owned());
            missing.push(Unavailable { name: e.name, task_types: e.task_types, reason });
        }
    }
    Ok((ready, missing))
}

/// How long the fingerprint may take: it reads package metadata and imports nothing heavy.
const FINGERPRINT_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs `python -m flowmesh_runners <command>` and returns what it printed. An error means the
/// package could not answer (not installed for this interpreter, or it failed).
async fn ask(python: &str, command: &str, limit: Duration) -> Result<String, String> {
    let run = tokio::process::Command::new(python)
        .args(["-m", "flowmesh_runners", command])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(limit, run)
        .await
        .map_err(|_| format!("{python} -m flowmesh_runners {command} took over {limit:?}"))?
        .map_err(|e| format!("{python} could not start: {e}"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr.lines().last().unwrap_or("").trim();
        return Err(format!("{python} -m flowmesh_runners {command} exited with {}: {last}", output.status));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The file that remembers a probe's answer: named after the package's fingerprint (interpreter,
/// search path, package versions, the package's own checks) and what the package cannot see from
/// there (`machine`: the GPUs the driver lists, `CUDA_VISIBLE_DEVICES`).
pub fn cache_file(dir: &Path, fingerprint: &str, machine: &str) -> std::path::PathBuf {
    let digest = flowmesh_nats::digest::sha256(format!("{}\n{machine}", fingerprint.trim()).as_bytes());
    let key: String =
        digest.trim_start_matches("SHA-256=").chars().filter(char::is_ascii_alphanumeric).take(32).collect();
    dir.join(format!("runners-{key}.json"))
}

/// Where the runners' answer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Probed,
    /// An earlier probe with the same fingerprint and GPUs.
    Remembered,
}

/// What initialised here: remembered from an earlier probe with the same fingerprint when
/// `cache` has one, else probed (and remembered). A package that cannot give its fingerprint
/// (an older one) is probed every time.
pub async fn probe(
    python: &str,
    cache: Option<&Path>,
    machine: &str,
) -> Result<(Vec<Runner>, Vec<Unavailable>, Source), String> {
    let file = match cache {
        Some(dir) => match ask(python, "fingerprint", FINGERPRINT_TIMEOUT).await {
            Ok(fingerprint) => Some(cache_file(dir, &fingerprint, machine)),
            Err(why) => {
                tracing::debug!(reason = %why, "no runner fingerprint; probing without the cache");
                None
            }
        },
        None => None,
    };
    if let Some(file) = &file
        && let Ok(text) = std::fs::read_to_string(file)
        && let Ok((ready, missing)) = parse_capabilities(python, &text)
    {
        return Ok((ready, missing, Source::Remembered));
    }
    let text = ask(python, "capabilities", PROBE_TIMEOUT).await?;
    let (ready, missing) = parse_capabilities(python, &text)?;
    if let Some(file) = &file
        && let Err(e) = remember(file, &text)
    {
        tracing::warn!(file = %file.display(), error = %e, "could not remember the runner probe");
    }
    Ok((ready, missing, Source::Probed))
}

/// Writes the answer whole or not at all (a rename), so a reader never sees half of it.
fn remember(file: &Path, text: &str) -> std::io::Result<()> {
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let partial = file.with_extension(format!("{}.partial", std::process::id()));
    std::fs::write(&partial, text)?;
    std::fs::rename(&partial, file)
}

/// What a worker lists while its runners are being asked: one entry, serving nothing.
pub fn initialising(python: &str) -> Unavailable {
    Unavailable {
        name: "flowmesh_runners".to_owned(),
        task_types: Vec::new(),
        reason: format!("initialising: asking {python} which runners can run here"),
    }
}

/// The runners for `FLOWMESH_RUNNERS`: those that initialised, and those that did not (listed,
/// serving nothing). A package that cannot be asked at all is listed as one that did not.
pub async fn discover(python: &str, cache: Option<&Path>, machine: &str) -> (Vec<Runner>, Vec<Unavailable>) {
    match probe(python, cache, machine).await {
        Ok((ready, missing, source)) => {
            for u in &missing {
                tracing::info!(executor = %u.name, reason = %u.reason, "runner not available");
            }
            let names: Vec<&str> = ready.iter().map(|r| r.name.as_str()).collect();
            tracing::info!(runners = ?names, ?source, "ML runners initialised");
            (ready, missing)
        }
        Err(why) => {
            tracing::warn!(reason = %why, "FLOWMESH_RUNNERS: no ML runners");
            (Vec::new(), vec![Unavailable { name: "flowmesh_runners".to_owned(), task_types: Vec::new(), reason: why }])
        }
    }
}

/// What a runner process gets from the task's request, on top of the plugin contract's variables.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub env: BTreeMap<String, String>,
}

/// The pure part: GPUs the task asked for (the smallest matching subset; none when it asked for
/// none, so a CPU task cannot grab a card) and CPU threads (its `cpu` request, rounded up).
pub fn plan(task_type: &str, spec: &Value, gpus: &[Gpu], progress_file: &Path) -> Result<Plan, String> {
    let request = request_for(task_type, spec, None)?;
    let hw = Hardware { gpus: gpus.to_vec(), ..Hardware::default() };
    let chosen = crate::gpu_subset::select(&request.gpu, &hw, true)?;
    let visible: Vec<String> = chosen.iter().map(device_id).collect();
    let mut env = BTreeMap::new();
    env.insert("CUDA_VISIBLE_DEVICES".to_owned(), visible.join(","));
    if request.cpu > 0.0 {
        let threads = (request.cpu.ceil() as u64).max(1).to_string();
        for var in ["OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"] {
            env.insert(var.to_owned(), threads.clone());
        }
    }
    env.insert("TOKENIZERS_PARALLELISM".to_owned(), "false".to_owned());
    env.insert("FLOWMESH_PROGRESS_FILE".to_owned(), progress_file.display().to_string());
    Ok(Plan { env })
}

/// One progress line as a `task.updated` message, e.g. `step 2/10 loss 1.234 lr 5e-5`.
pub fn describe_progress(p: &Value) -> String {
    let num = |k: &str| p.get(k).and_then(Value::as_f64);
    let mut parts = Vec::new();
    if let Some(step) = num("step") {
        match num("max_steps") {
            Some(max) if max > 0.0 => parts.push(format!("step {step}/{max}")),
            _ => parts.push(format!("step {step}")),
        }
    }
    if let Some(loss) = num("loss") {
        parts.push(format!("loss {loss:.4}"));
    }
    if let Some(lr) = num("learning_rate") {
        parts.push(format!("lr {lr:.3e}"));
    }
    if let (Some(item), Some(items)) = (num("item"), num("items")) {
        parts.push(format!("item {item}/{items}"));
    }
    if let Some(tps) = num("tokens_per_second") {
        parts.push(format!("{tps:.1} tokens/s"));
    }
    if let Some(message) = p.get("message").and_then(Value::as_str) {
        parts.push(message.to_owned());
    }
    if parts.is_empty() { "progress".to_owned() } else { parts.join(" ") }
}

impl Runner {
    pub async fn run(&self, ctx: &TaskContext) -> Result<Value, ExecError> {
        let progress_file = ctx.work_dir.join("progress.jsonl");
        let _ = std::fs::remove_file(&progress_file);
        let plan =
            plan(&ctx.order.task_type, &ctx.order.spec, &ctx.gpus, &progress_file).map_err(ExecError::Permanent)?;
        let argv: Vec<String> =
            [self.python.as_str(), "-m", "flowmesh_runners", "run", self.name.as_str()].map(str::to_owned).to_vec();
        let work = ctx.run_command_with(&argv, &plan.env);
        tokio::pin!(work);
        let mut offset = 0usize;
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tokio::select! {
                out = &mut work => {
                    forward_progress(ctx, &progress_file, &mut offset);
                    return out;
                }
                _ = tick.tick() => forward_progress(ctx, &progress_file, &mut offset),
            }
        }
    }
}

/// Sends the complete lines written since `offset` as `task.updated` events, data `{progress}`.
fn forward_progress(ctx: &TaskContext, path: &Path, offset: &mut usize) {
    let Ok(bytes) = std::fs::read(path) else { return };
    let Some(end) = bytes.iter().rposition(|b| *b == b'\n').map(|i| i + 1) else { return };
    if end <= *offset {
        return;
    }
    for line in bytes[*offset..end].split(|b| *b == b'\n') {
        if let Ok(value) = serde_json::from_slice::<Value>(line) {
            ctx.update(describe_progress(&value), Some(serde_json::json!({ "progress": value })));
        }
    }
    *offset = end;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn gpu(index: u32, name: &str) -> Gpu {
        Gpu { index, uuid: String::new(), name: name.to_owned(), memory_bytes: 80 << 30 }
    }

    #[test]
    fn capabilities_split_ready_from_unavailable() {
        let text = r#"{"protocol":1,"runners":[
            {"name":"transformers","task_types":["inference"],"backends":["transformers"],"ok":true},
            {"name":"vllm","task_types":["inference"],"ok":false,"reason":"ModuleNotFoundError: No module named 'vllm'"},
            {"name":"trl","task_types":[],"ok":true}]}"#;
        let (ready, missing) = parse_capabilities("python3", text).unwrap();
        assert_eq!(ready.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["transformers"]);
        assert_eq!(ready[0].backends, ["transformers"], "backends are advertised for placement");
        assert_eq!(missing.iter().map(|u| u.name.as_str()).collect::<Vec<_>>(), ["vllm", "trl"]);
        assert!(missing[0].reason.contains("vllm"));
        assert!(parse_capabilities("python3", "Traceback ...").is_err());
    }

    #[test]
    fn plan_gives_the_requested_gpus_and_threads() {
        let gpus = [gpu(0, "NVIDIA H100"), gpu(1, "NVIDIA H100")];
        let p = Path::new("/w/progress.jsonl");
        let one = json!({"resources": {"hardware": {"cpu": 2.5, "gpu": {"count": 1, "type": "h100"}}}});
        let plan1 = plan("sft", &one, &gpus, p).unwrap();
        assert_eq!(plan1.env["CUDA_VISIBLE_DEVICES"], "0");
        assert_eq!(plan1.env["OMP_NUM_THREADS"], "3");
        let cpu_only = plan("inference", &json!({"enforce_cpu": true}), &gpus, p).unwrap();
        assert_eq!(cpu_only.env["CUDA_VISIBLE_DEVICES"], "", "a task that asked for no GPU sees none");
        assert!(!cpu_only.env.contains_key("OMP_NUM_THREADS"));
        let too_many = json!({"resources": {"hardware": {"gpu": {"count": 3}}}});
        assert!(plan("sft", &too_many, &gpus, p).is_err());
    }

    #[test]
    fn progress_reads_as_a_line() {
        let train = json!({"kind": "train", "step": 2, "max_steps": 2, "loss": 4.25, "learning_rate": 0.0005});
        assert_eq!(describe_progress(&train), "step 2/2 loss 4.2500 lr 5.000e-4");
        let infer = json!({"kind": "inference", "item": 1, "items": 3, "tokens_per_second": 200.5});
        assert_eq!(describe_progress(&infer), "item 1/3 200.5 tokens/s");
    }
}
