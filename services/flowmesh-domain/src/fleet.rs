//! The fleet: worker capability snapshots as published in `flowmesh_workers`.

use serde::{Deserialize, Serialize};

/// A worker's self-description, refreshed every heartbeat (schema: `schemas/worker.schema.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerSnapshot {
    pub id: String,
    pub hostname: String,
    pub version: String,
    pub started_at: String,
    pub status: WorkerStatus,
    pub hardware: Hardware,
    pub supported_task_types: Vec<String>,
    pub executors: Vec<ExecutorInfo>,
    pub slots: Slots,
    /// Work orders it offers to hold beyond its batch slots now, each queued until a slot frees:
    /// as many as its slots are expected to start within 100 ms, at most `WORKER_PREFETCH`
    /// (0: none). The router fills such a place only when no eligible worker has a free slot, so
    /// a prefetched order never waits while another worker idles.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub prefetch: u32,
    /// Orders waiting in that queue now (a slot's `in_use` counts only what runs).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub queued: u32,
    pub ssh_limits: Option<SshLimits>,
    #[serde(default)]
    pub tags: Vec<String>,
    pub cost_per_hour: f64,
    #[serde(default)]
    pub load: f64,
    #[serde(default)]
    pub active_tasks: Vec<String>,
    #[serde(default)]
    pub simulated: bool,
    pub heartbeat_interval_sec: u64,
    pub ttl_sec: u64,
    /// When the worker last became idle (unix ms); the scorer prefers the longest idle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_since_ms: Option<u64>,
    /// Models it holds warm: placement prefers a worker that already has a task's model.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warm_models: Vec<WarmModel>,
}

pub(crate) fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl WorkerSnapshot {
    /// Reads the snapshot stored under `key` in the workers bucket. It is believed only under
    /// its own worker's key, which NATS permissions bind to that worker's user, as an event is
    /// only under its own subject: a snapshot naming another worker would put that worker's
    /// slots, hardware and task types in the fleet on the writer's word.
    pub fn read(key: &str, bytes: &[u8]) -> Result<WorkerSnapshot, String> {
        let snapshot: WorkerSnapshot = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if snapshot.id != key {
            return Err(format!("it names worker {:?} under the key of {key:?}", snapshot.id));
        }
        Ok(snapshot)
    }

    /// The warm entry for `model` (ids compare case-insensitively, as hub ids do).
    pub fn warm(&self, model: &str) -> Option<&WarmModel> {
        self.warm_models.iter().find(|m| m.id.eq_ignore_ascii_case(model))
    }

    /// Whether the worker serves `task_type` with `backend` (an inference backend, `vllm`):
    /// one of its executors for the type lists the backend, or lists none (a plugin that picks
    /// its backend itself). A snapshot that names no executor for the type (an older worker's)
    /// is taken to serve every backend of the types it advertises.
    pub fn serves_backend(&self, task_type: &str, backend: &str) -> bool {
        let mut serving = self.executors.iter().filter(|e| e.task_types.iter().any(|t| t == task_type)).peekable();
        serving.peek().is_none() || serving.any(|e| e.backends.is_empty() || e.backends.iter().any(|b| b == backend))
    }
}

/// A model a worker holds warm.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarmModel {
    /// The model id as specs name it (`model.source.identifier`, e.g. `Qwen/Qwen3-0.6B`).
    pub id: String,
    pub size_bytes: u64,
    pub state: WarmState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WarmState {
    /// In a runner's memory, ready to serve.
    Loaded,
    /// On local disk: no download needed.
    Cached,
}

impl WarmState {
    pub fn name(self) -> &'static str {
        match self {
            WarmState::Loaded => "loaded",
            WarmState::Cached => "cached",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkerStatus {
    Starting,
    Idle,
    Busy,
    Draining,
}

/// What a machine has. `FLOWMESH_SIMULATE_HW` takes exactly this shape.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hardware {
    pub cpu_cores: u32,
    pub memory_bytes: u64,
    #[serde(default)]
    pub gpus: Vec<Gpu>,
    /// GPUs share the system memory (GB10, Tegra): their budget is `shared_memory_bytes`.
    #[serde(default)]
    pub unified_memory: bool,
    #[serde(default)]
    pub shared_memory_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gpu {
    pub index: u32,
    #[serde(default)]
    pub uuid: String,
    pub name: String,
    pub memory_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutorInfo {
    pub name: String,
    pub task_types: Vec<String>,
    /// The inference backends it serves (`transformers`, `vllm`); empty: not declared, any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backends: Vec<String>,
    /// Why a known executor (an ML runner) is not constructed here; it then serves no task type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SlotCount {
    pub total: u32,
    pub in_use: u32,
}

/// Batch slots run finite tasks; service slots hold long-lived ones (`serve`, interactive `ssh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Slots {
    pub batch: SlotCount,
    pub service: SlotCount,
}

/// Operator caps for `ssh` containers; `None` in a field means unbounded.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct SshLimits {
    pub max_cpu: Option<f64>,
    pub max_memory_bytes: Option<u64>,
    pub max_pids: Option<i64>,
}

/// Task types that occupy a service slot rather than a batch slot.
pub fn uses_service_slot(task_type: &str) -> bool {
    task_type == "serve"
}
