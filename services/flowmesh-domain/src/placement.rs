//! Placement: which workers can run a task, why the others cannot, and which one is best.
//!
//! `explain` checks one worker; `place` checks the fleet, scores the eligible workers and either
//! picks one or explains, counted per reason, why the task has to wait.

use crate::fleet::{WorkerSnapshot, WorkerStatus, uses_service_slot};
use crate::units::{self, format_bytes};
use crate::validate::{InferenceBackend, inference_backend};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

/// What a task needs from a worker.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Request {
    pub task_type: String,
    pub cpu: f64,
    pub memory_bytes: u64,
    pub gpu: GpuRequest,
    /// Only these workers may take it (`schedule_hint.selected_worker`).
    pub selected: Option<Vec<String>>,
    /// The spec's `workerTags` selector: each term a tag the worker must have (`gpu-pool`) or,
    /// with a leading `!`, must not have (`!spot`).
    pub tags: Vec<String>,
    /// The model the task loads (`model.source.identifier`): a worker holding it warm is
    /// preferred among the eligible ones, never chosen over a rule.
    pub model: Option<String>,
    /// The inference backend the spec's fields select (`validate::inference_backend`, the
    /// validator's own classifier); a worker must serve it. `None`: not inference, or auto.
    pub backend: Option<InferenceBackend>,
    /// It may wait in a worker's queue (`prefetch`) when no slot is free. Not a task given back
    /// from a queue: it waits in the router for the first free slot instead.
    pub queue: bool,
}

/// The model a spec loads, as workers advertise warm ones: `model.source.identifier`, else
/// `model.identifier` or `model.name`.
pub fn model_of(spec: &Value) -> Option<String> {
    ["/model/source/identifier", "/model/identifier", "/model/name"]
        .iter()
        .find_map(|p| crate::pointer::get(spec, p).and_then(Value::as_str))
        .filter(|id| !id.is_empty() && crate::template::placeholders(id).is_empty())
        .map(str::to_owned)
}

/// Whether a worker's tags satisfy every term of a `workerTags` selector.
pub fn tags_match(selector: &[String], worker_tags: &[String]) -> bool {
    selector.iter().all(|term| match term.strip_prefix('!') {
        Some(forbidden) => !worker_tags.iter().any(|t| t == forbidden),
        None => worker_tags.iter().any(|t| t == term),
    })
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct GpuRequest {
    pub count: u32,
    /// Lower-cased name fragment; `None` for the wildcards `any`, `auto`, `*` and empty.
    pub kind: Option<String>,
    /// Per device.
    pub memory_bytes: u64,
}

impl GpuRequest {
    fn describe(&self) -> String {
        let mut text = self.kind.as_deref().map(str::to_uppercase).unwrap_or_else(|| "any type".to_owned());
        if self.memory_bytes > 0 {
            text += &format!(" >= {}", format_bytes(self.memory_bytes));
        }
        text
    }
}

/// Reads the request from a resolved spec (`resources.hardware`).
pub fn request_for(task_type: &str, spec: &Value, selected: Option<Vec<String>>) -> Result<Request, String> {
    let hw = crate::pointer::get(spec, "/resources/hardware");
    let field = |key: &str| hw.and_then(|h| h.get(key));
    let cpu = match field("cpu") {
        None | Some(Value::Null) => 0.0,
        Some(Value::Number(n)) => n.as_f64().unwrap_or(0.0),
        Some(Value::String(s)) => s.trim().parse::<f64>().map_err(|_| format!("cpu {s:?} is not a number"))?,
        Some(other) => return Err(format!("cpu must be a number, found {other}")),
    };
    if !(cpu.is_finite() && cpu >= 0.0) {
        return Err(format!("cpu must be a non-negative number, found {cpu}"));
    }
    let memory_bytes = match field("memory") {
        None | Some(Value::Null) => 0,
        Some(v) => units::memory_value(v)?,
    };
    let gpu = match field("gpu") {
        None | Some(Value::Null) => GpuRequest::default(),
        Some(g) => GpuRequest {
            count: g.get("count").and_then(Value::as_u64).unwrap_or(0).min(u32::MAX as u64) as u32,
            kind: g
                .get("type")
                .and_then(Value::as_str)
                .map(|t| t.trim().to_lowercase())
                .filter(|t| !matches!(t.as_str(), "" | "any" | "auto" | "*")),
            memory_bytes: match g.get("memory") {
                None | Some(Value::Null) => 0,
                Some(v) => units::memory_value(v)?,
            },
        },
    };
    let tags = match spec.get("workerTags") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(terms)) => terms
            .iter()
            .map(|t| t.as_str().map(str::to_owned).ok_or_else(|| format!("workerTags holds {t}, not a tag")))
            .collect::<Result<_, _>>()?,
        Some(other) => return Err(format!("workerTags must be a list of tags, found {other}")),
    };
    let backend = Some(inference_backend(spec)).filter(|b| task_type == "inference" && b.name().is_some());
    Ok(Request {
        task_type: task_type.to_owned(),
        cpu,
        memory_bytes,
        gpu,
        selected,
        tags,
        model: model_of(spec),
        backend,
        queue: true,
    })
}

/// What the scheduler knows of a worker beyond its snapshot.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    pub snapshot: &'a WorkerSnapshot,
    /// Tasks the router has given it that have not ended (its own count, fresher than the snapshot).
    pub batch_in_use: u32,
    pub service_in_use: u32,
    pub cordoned: bool,
    /// An operator asked it to drain (`flowmesh worker drain`): no new work, running work finishes.
    pub draining: bool,
}

/// Why one worker cannot take a task. The order of the variants is the order of the checks.
#[derive(Debug, Clone, PartialEq)]
pub enum Exclusion {
    NotSelected,
    TaskType,
    /// It serves the task type, but not with the inference backend the spec selects.
    Backend(InferenceBackend),
    Tags,
    Cpu {
        have: f64,
        need: f64,
    },
    Memory {
        have: u64,
        need: u64,
    },
    Gpu {
        matching: u32,
        need: u32,
    },
    Cordoned,
    Draining,
    NoFreeSlot {
        service: bool,
    },
}

impl Exclusion {
    /// Whether waiting could help: a permanent exclusion holds for as long as the worker lives.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            Exclusion::NotSelected
                | Exclusion::TaskType
                | Exclusion::Backend(_)
                | Exclusion::Tags
                | Exclusion::Cpu { .. }
                | Exclusion::Memory { .. }
                | Exclusion::Gpu { .. }
        )
    }

    /// A stable code for scripts.
    pub fn code(&self) -> &'static str {
        match self {
            Exclusion::NotSelected => "not_selected",
            Exclusion::TaskType => "task_type",
            Exclusion::Backend(_) => "backend",
            Exclusion::Tags => "tags",
            Exclusion::Cpu { .. } => "cpu",
            Exclusion::Memory { .. } => "memory",
            Exclusion::Gpu { .. } => "gpu",
            Exclusion::Cordoned => "cordoned",
            Exclusion::Draining => "draining",
            Exclusion::NoFreeSlot { .. } => "no_free_slot",
        }
    }

    /// A phrase that completes "N workers ...".
    pub fn describe(&self, request: &Request, plural: bool) -> String {
        let (is, has, do_) = if plural { ("are", "have", "do") } else { ("is", "has", "does") };
        match self {
            Exclusion::NotSelected => format!("{is} not in selected_worker"),
            Exclusion::TaskType => format!("{do_} not serve task type {:?}", request.task_type),
            Exclusion::Backend(backend) => format!(
                "{do_} not serve the {:?} inference backend ({} select it)",
                backend.name().unwrap_or("auto"),
                backend.selected_by()
            ),
            Exclusion::Tags => format!("{do_} not match workerTags [{}]", request.tags.join(", ")),
            Exclusion::Cpu { have, need } => format!("{has} {have} of {need} CPU cores"),
            Exclusion::Memory { have, need } => {
                format!("{has} {} of {} memory", format_bytes(*have), format_bytes(*need))
            }
            Exclusion::Gpu { matching, need } => {
                format!("{has} {matching} of {need} GPUs matching {}", request.gpu.describe())
            }
            Exclusion::Cordoned => format!("{is} cordoned"),
            Exclusion::Draining => format!("{is} draining"),
            Exclusion::NoFreeSlot { service } => {
                format!("{has} no free {} slot", if *service { "service" } else { "batch" })
            }
        }
    }
}

/// The worker's GPU names lower-cased, as `count_matching` compares them.
fn lower_gpu_names(snapshot: &WorkerSnapshot) -> Vec<String> {
    snapshot.hardware.gpus.iter().map(|g| g.name.to_lowercase()).collect()
}

/// How many of the worker's GPUs match the request, each judged on its own; the device names
/// come lower-cased (the index keeps them so).
fn count_matching(request: &GpuRequest, snapshot: &WorkerSnapshot, lower_names: &[String]) -> u32 {
    let hw = &snapshot.hardware;
    let unified_share = if hw.unified_memory { hw.shared_memory_bytes / u64::from(request.count.max(1)) } else { 0 };
    hw.gpus
        .iter()
        .zip(lower_names)
        .filter(|(gpu, name)| {
            let memory = if hw.unified_memory { unified_share.max(gpu.memory_bytes) } else { gpu.memory_bytes };
            request.kind.as_deref().is_none_or(|kind| name.contains(kind)) && memory >= request.memory_bytes
        })
        .count() as u32
}

/// Every reason this worker cannot take the task now; empty when it can.
pub fn explain(request: &Request, c: &Candidate<'_>) -> Vec<Exclusion> {
    let w = c.snapshot;
    let mut out = Vec::new();
    if let Some(selected) = &request.selected
        && !selected.iter().any(|id| id == &w.id)
    {
        out.push(Exclusion::NotSelected);
    }
    if !w.supported_task_types.iter().any(|t| t == &request.task_type) {
        out.push(Exclusion::TaskType);
    }
    capacity_checks(request, c, &lower_gpu_names(w), &mut |e| out.push(e));
    out
}

/// The checks after selection and task type, in order: the inference backend, worker tags, CPU
/// and memory (clamped by the ssh caps for `ssh` tasks), GPUs, cordon, drain, a free slot.
/// Shared by `explain` and the index.
fn capacity_checks(request: &Request, c: &Candidate<'_>, lower_gpu_names: &[String], note: &mut dyn FnMut(Exclusion)) {
    let w = c.snapshot;
    if let Some(backend) = request.backend
        && let Some(name) = backend.name()
        && !w.serves_backend(&request.task_type, name)
    {
        note(Exclusion::Backend(backend));
    }
    if !tags_match(&request.tags, &w.tags) {
        note(Exclusion::Tags);
    }
    let ssh_caps = if request.task_type == "ssh" { w.ssh_limits } else { None };
    let mut cores = f64::from(w.hardware.cpu_cores);
    let mut memory = w.hardware.memory_bytes;
    if let Some(caps) = ssh_caps {
        cores = caps.max_cpu.map_or(cores, |cap| cores.min(cap));
        memory = caps.max_memory_bytes.map_or(memory, |cap| memory.min(cap));
    }
    if request.cpu > cores {
        note(Exclusion::Cpu { have: cores, need: request.cpu });
    }
    if request.memory_bytes > memory {
        note(Exclusion::Memory { have: memory, need: request.memory_bytes });
    }
    if request.gpu.count > 0 {
        let matching = count_matching(&request.gpu, w, lower_gpu_names);
        if matching < request.gpu.count {
            note(Exclusion::Gpu { matching, need: request.gpu.count });
        }
    }
    if c.cordoned {
        note(Exclusion::Cordoned);
    }
    if c.draining || w.status == WorkerStatus::Draining {
        note(Exclusion::Draining);
    }
    let service = uses_service_slot(&request.task_type);
    let slot = if service { w.slots.service } else { w.slots.batch };
    let in_use = if service { c.service_in_use } else { c.batch_in_use };
    if in_use >= slot.total {
        note(Exclusion::NoFreeSlot { service });
    }
}

/// How the best eligible worker is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum), value(rename_all = "snake_case"))]
pub enum Strategy {
    /// Throughput against cost (FlowMesh's default), then longest idle, then id.
    #[default]
    BestFit,
    /// The first eligible worker by id.
    FirstFit,
    /// The smallest eligible worker: least capacity left idle.
    MinSatisfying,
}

/// A worker's throughput estimate: 100 per GPU, plus VRAM GiB, RAM GiB / 2 and cores / 2.
pub fn throughput(w: &WorkerSnapshot) -> f64 {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    // Summed as GiB: a snapshot is its worker's word, and bytes summed as u64 can overflow.
    let vram: f64 = w.hardware.gpus.iter().map(|g| gib(g.memory_bytes)).sum();
    100.0 * w.hardware.gpus.len() as f64
        + vram
        + gib(w.hardware.memory_bytes) / 2.0
        + 0.5 * f64::from(w.hardware.cpu_cores)
}

/// The weight of throughput against cost: inference 0.4, training 0.8, anything else 0.5.
pub fn throughput_weight(task_type: &str) -> f64 {
    match task_type {
        "inference" | "serve" | "rag" | "embedding" | "diffusion" | "api" => 0.4,
        t if t.starts_with("omni_") => 0.4,
        "sft" | "lora_sft" | "ppo" | "dpo" | "image_classification_training" => 0.8,
        _ => 0.5,
    }
}

/// FNV-1a: a stable hash for the deterministic jitter (std's hasher may change between releases).
fn fnv(parts: &[&str]) -> u64 {
    let mut hash: u64 = 0xcbf29ce484222325;
    for part in parts {
        for byte in part.bytes().chain(std::iter::once(0)) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x100000001b3);
        }
    }
    hash
}

/// Per-reason counts across the fleet, and the sentence built from them.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Explanation {
    pub workers: usize,
    pub eligible: usize,
    /// Workers that could run the task once a transient obstacle clears (busy, cordoned, draining).
    pub capable: usize,
    pub reasons: Vec<ReasonCount>,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReasonCount {
    pub code: String,
    pub count: usize,
    pub text: String,
}

/// The outcome of placing one task.
#[derive(Debug, Clone, PartialEq)]
pub enum Placement {
    /// `explanation` is filled by [`place`] (every worker visited) and left out by the fast
    /// [`FleetIndex::place`], which stops as soon as no later worker can win.
    Chosen {
        worker_id: String,
        score: f64,
        explanation: Option<Explanation>,
        /// Every eligible slot was busy: it goes into the worker's queue (`prefetch`).
        queued: bool,
    },
    Pending(Explanation),
}

/// Places one task on the fleet. Workers in `avoid` (they failed this task) are used only when no
/// other eligible worker exists. `now_ms` feeds the idle bonus; the jitter hashes `task_id`.
/// For many tasks against one fleet, build a [`FleetIndex`] once and call its `place`.
pub fn place(
    request: &Request,
    stage: &str,
    task_id: &str,
    candidates: &[Candidate<'_>],
    strategy: Strategy,
    avoid: &BTreeSet<String>,
    now_ms: u64,
) -> Placement {
    FleetIndex::new(candidates).place_explained(request, stage, task_id, strategy, avoid, now_ms)
}

/// The live fleet prepared for placement, and kept between scheduling rounds so that a round
/// costs what changed, not the size of the fleet: workers sorted by id with their GPU names
/// lower-cased once, grouped by the task types they serve, ranked per task type and strategy
/// (built on first use), and counted by free slot (so "is every slot of this kind taken" is a
/// lookup).
///
/// A router `put`s each snapshot it receives for a live worker and `remove`s a worker it no longer
/// counts live; each round sets the slots in use (`set_usage`) and cordons (`set_flags`) and calls
/// `prepare` before placing. A snapshot that changes only what varies from heartbeat to heartbeat
/// (status, load, idle time, warm models, slot totals) is taken in place; a worker that joins,
/// leaves, or changes the task types it serves, its hardware or its cost rebuilds the grouping,
/// the rankings and the counts once, in the next `prepare`.
#[derive(Default)]
pub struct FleetIndex {
    workers: Vec<Member>,
    by_type: HashMap<String, Vec<usize>>,
    /// Per task type and strategy: the serving workers by static score, best first (built on
    /// first use). The static score is everything but the idle bonus and the jitter.
    rankings: Mutex<HashMap<(String, Strategy), Arc<Ranking>>>,
    /// Requests found unplaceable this round, with their explanation (its message left empty). A
    /// backlog of alike tasks costs one walk of the fleet, not one each. Still exact after
    /// `occupy`: a request that had to wait had no eligible worker, and a taken slot is the last
    /// check, so it cannot change any worker's first exclusion for that request, nor whether it is
    /// permanent. Emptied by `prepare`.
    unplaceable: Mutex<HashMap<RequestKey, Explanation>>,
    /// Workers joined, left or changed what they serve since `by_type`, the rankings and the
    /// counts were built: `prepare` rebuilds them.
    stale: bool,
    /// `signature()`, while nothing it digests has changed.
    signature: OnceLock<u64>,
    /// Workers that may take work (not cordoned, not draining) with room for a (batch, service) task.
    free_takers: (usize, usize),
    /// Per task type: the workers serving it with room (a free slot of its kind, or a free place
    /// in their queue), and those with a free slot.
    free_by_type: HashMap<String, (usize, usize)>,
    /// Workers that left the fleet themselves (a clean stop) and have not come back since.
    departed: HashSet<String>,
}

/// A `Request` made hashable: the CPU count by its bits (requests come from the same parser, so
/// equal values have equal bits).
#[derive(PartialEq, Eq, Hash)]
struct RequestKey {
    task_type: String,
    cpu_bits: u64,
    memory_bytes: u64,
    gpu_count: u32,
    gpu_kind: Option<String>,
    gpu_memory_bytes: u64,
    selected: Option<Vec<String>>,
    tags: Vec<String>,
    model: Option<String>,
    backend: Option<InferenceBackend>,
    queue: bool,
}

impl RequestKey {
    fn of(r: &Request) -> RequestKey {
        RequestKey {
            task_type: r.task_type.clone(),
            cpu_bits: r.cpu.to_bits(),
            memory_bytes: r.memory_bytes,
            gpu_count: r.gpu.count,
            gpu_kind: r.gpu.kind.clone(),
            gpu_memory_bytes: r.gpu.memory_bytes,
            selected: r.selected.clone(),
            tags: r.tags.clone(),
            model: r.model.clone(),
            backend: r.backend,
            queue: r.queue,
        }
    }
}

/// The serving workers of one task type under one strategy.
struct Ranking {
    /// (static score, worker index), best first.
    order: Vec<(f64, usize)>,
    /// Static score by worker index (`-inf` for workers that do not serve the type).
    by_index: Vec<f64>,
}

/// One worker of the index: its snapshot and what the scheduler knows beyond it.
struct Member {
    snapshot: WorkerSnapshot,
    gpu_names: Vec<String>,
    batch_in_use: u32,
    service_in_use: u32,
    cordoned: bool,
    draining: bool,
}

impl Member {
    fn new(snapshot: WorkerSnapshot) -> Member {
        Member {
            gpu_names: lower_gpu_names(&snapshot),
            snapshot,
            batch_in_use: 0,
            service_in_use: 0,
            cordoned: false,
            draining: false,
        }
    }

    fn candidate(&self) -> Candidate<'_> {
        Candidate {
            snapshot: &self.snapshot,
            batch_in_use: self.batch_in_use,
            service_in_use: self.service_in_use,
            cordoned: self.cordoned,
            draining: self.draining,
        }
    }

    /// Not cordoned and not draining.
    fn takes_work(&self) -> bool {
        !self.cordoned && !self.draining && self.snapshot.status != WorkerStatus::Draining
    }

    /// Whether it has room for one more task of the kind: a free slot, or for anything but a
    /// service a free place in its queue (`prefetch`).
    fn has_room(&self, service: bool) -> bool {
        self.slot_free(service) || (!service && self.queues())
    }

    /// Whether a slot of the kind is free, queues aside.
    fn slot_free(&self, service: bool) -> bool {
        let slots = &self.snapshot.slots;
        if service { self.service_in_use < slots.service.total } else { self.batch_in_use < slots.batch.total }
    }

    /// More batch tasks than batch slots: some wait in its queue.
    fn queue_taken(&self) -> bool {
        self.batch_in_use > self.snapshot.slots.batch.total
    }

    /// Every batch slot taken, a place in its queue free.
    fn queues(&self) -> bool {
        let total = self.snapshot.slots.batch.total;
        self.batch_in_use >= total && self.batch_in_use < total.saturating_add(self.snapshot.prefetch)
    }

    /// Whether a task whose first exclusion here is `first` can go into this worker's queue. A
    /// busy slot is the last check, so as the first exclusion it is the only one.
    fn takes_into_queue(&self, first: &Exclusion) -> bool {
        *first == Exclusion::NoFreeSlot { service: false } && self.queues()
    }
}

/// The caches behind `&self` are plain maps: a panic while one was held left nothing half-made
/// that matters (an entry is inserted whole), so a poisoned lock is taken as it is.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether a snapshot change leaves the grouping and the rankings as they are: the same task
/// types, hardware and cost.
fn same_shape(a: &WorkerSnapshot, b: &WorkerSnapshot) -> bool {
    a.supported_task_types == b.supported_task_types
        && a.hardware == b.hardware
        && a.cost_per_hour.to_bits() == b.cost_per_hour.to_bits()
}

/// Whether a snapshot change leaves `FleetIndex::signature` as it is.
fn same_signature(a: &WorkerSnapshot, b: &WorkerSnapshot) -> bool {
    a.started_at == b.started_at
        && a.supported_task_types == b.supported_task_types
        && a.tags == b.tags
        && a.executors.len() == b.executors.len()
        && (a.status == WorkerStatus::Draining) == (b.status == WorkerStatus::Draining)
}

impl FleetIndex {
    /// An index of `candidates` (their snapshots copied), ready to place.
    pub fn new(candidates: &[Candidate<'_>]) -> FleetIndex {
        let mut workers: Vec<Member> = candidates
            .iter()
            .map(|c| Member {
                batch_in_use: c.batch_in_use,
                service_in_use: c.service_in_use,
                cordoned: c.cordoned,
                draining: c.draining,
                ..Member::new(c.snapshot.clone())
            })
            .collect();
        workers.sort_by(|a, b| a.snapshot.id.cmp(&b.snapshot.id));
        let mut index = FleetIndex { workers, stale: true, ..FleetIndex::default() };
        index.prepare();
        index
    }

    /// An index of `fleet` with no slot in use, nothing cordoned, ready to place.
    pub fn of<'s>(fleet: impl IntoIterator<Item = &'s WorkerSnapshot>) -> FleetIndex {
        let mut index = FleetIndex::default();
        for snapshot in fleet {
            index.put(snapshot);
        }
        index.prepare();
        index
    }

    fn position(&self, worker_id: &str) -> Result<usize, usize> {
        self.workers.binary_search_by(|m| m.snapshot.id.as_str().cmp(worker_id))
    }

    pub fn contains(&self, worker_id: &str) -> bool {
        self.position(worker_id).is_ok()
    }

    /// The workers as candidates, by id.
    pub fn candidates(&self) -> impl Iterator<Item = Candidate<'_>> {
        self.workers.iter().map(Member::candidate)
    }

    /// Takes in a live worker's snapshot (a new worker, or a newer snapshot of a known one; the
    /// slots in use and cordons stay as they were set).
    pub fn put(&mut self, snapshot: &WorkerSnapshot) {
        match self.position(&snapshot.id) {
            Ok(i) => {
                let old = &self.workers[i].snapshot;
                if !same_signature(old, snapshot) {
                    self.signature = OnceLock::new();
                }
                if same_shape(old, snapshot) {
                    self.change(i, |m| m.snapshot.clone_from(snapshot));
                } else {
                    let m = &mut self.workers[i];
                    m.snapshot.clone_from(snapshot);
                    m.gpu_names = lower_gpu_names(snapshot);
                    self.stale = true;
                }
            }
            Err(i) => {
                self.departed.remove(&snapshot.id);
                self.workers.insert(i, Member::new(snapshot.clone()));
                self.stale = true;
                self.signature = OnceLock::new();
            }
        }
    }

    /// Drops a worker that left the fleet itself, in a clean stop: it ran every order it took
    /// or handed it back unrun (`departed`).
    pub fn depart(&mut self, worker_id: &str) {
        self.remove(worker_id);
        // Looked at on every tick while it is remembered: no new string each time.
        if !self.departed.contains(worker_id) {
            self.departed.insert(worker_id.to_owned());
        }
    }

    /// Whether `worker_id` left the fleet in a clean stop (`depart`) and has not come back. A task
    /// it held that never reported a start was handed back unrun: a worker that stops cleanly
    /// finishes (or reports) what runs and hands back what waits in its queue.
    pub fn departed(&self, worker_id: &str) -> bool {
        self.departed.contains(worker_id)
    }

    /// The workers that left in a clean stop and are still remembered as such.
    pub fn departed_ids(&self) -> impl Iterator<Item = &String> {
        self.departed.iter()
    }

    /// Drops everything the index knows of a worker, its clean departure included: nothing it
    /// held is left to decide about.
    pub fn forget(&mut self, worker_id: &str) {
        self.remove(worker_id);
        self.departed.remove(worker_id);
    }

    /// Drops a worker that is no longer live.
    pub fn remove(&mut self, worker_id: &str) {
        if let Ok(i) = self.position(worker_id) {
            self.workers.remove(i);
            self.stale = true;
            self.signature = OnceLock::new();
        }
    }

    /// Sets the slots a worker has in use by the router's count (batch, service).
    pub fn set_usage(&mut self, worker_id: &str, batch: u32, service: u32) {
        if let Ok(i) = self.position(worker_id) {
            self.set_usage_at(i, (batch, service));
        }
    }

    /// Sets every worker's slots in use from `usage` (absent: none).
    pub fn set_all_usage(&mut self, usage: impl Fn(&str) -> (u32, u32)) {
        for i in 0..self.workers.len() {
            self.set_usage_at(i, usage(&self.workers[i].snapshot.id));
        }
    }

    fn set_usage_at(&mut self, i: usize, in_use: (u32, u32)) {
        if (self.workers[i].batch_in_use, self.workers[i].service_in_use) != in_use {
            self.change(i, |m| (m.batch_in_use, m.service_in_use) = in_use);
        }
    }

    /// Sets every worker's cordon and drain from the sets of ids that have them.
    pub fn set_flags(&mut self, cordoned: &BTreeSet<String>, draining: &BTreeSet<String>) {
        for i in 0..self.workers.len() {
            let id = &self.workers[i].snapshot.id;
            let flags = (cordoned.contains(id), draining.contains(id));
            if (self.workers[i].cordoned, self.workers[i].draining) != flags {
                self.signature = OnceLock::new();
                self.change(i, |m| (m.cordoned, m.draining) = flags);
            }
        }
    }

    /// Records that a task was just placed on `worker_id`: its slot is taken until the usage is set again.
    pub fn occupy(&mut self, worker_id: &str, service: bool) {
        if let Ok(i) = self.position(worker_id) {
            self.change(i, |m| if service { m.service_in_use += 1 } else { m.batch_in_use += 1 });
        }
    }

    /// Readies the index for a round: rebuilds what joins, leaves and changes of shape made stale,
    /// and forgets the last round's unplaceable requests. Returns whether it rebuilt.
    pub fn prepare(&mut self) -> bool {
        self.unplaceable.get_mut().unwrap_or_else(PoisonError::into_inner).clear();
        if !self.stale {
            return false;
        }
        self.by_type.clear();
        for (i, m) in self.workers.iter().enumerate() {
            for t in &m.snapshot.supported_task_types {
                match self.by_type.get_mut(t.as_str()) {
                    Some(list) if list.last() == Some(&i) => {}
                    Some(list) => list.push(i),
                    None => {
                        self.by_type.insert(t.clone(), vec![i]);
                    }
                }
            }
        }
        self.rankings.get_mut().unwrap_or_else(PoisonError::into_inner).clear();
        let takers = self.workers.iter().filter(|m| m.takes_work());
        self.free_takers =
            takers.fold((0, 0), |(b, s), m| (b + usize::from(m.has_room(false)), s + usize::from(m.has_room(true))));
        let workers = &self.workers;
        self.free_by_type = self
            .by_type
            .iter()
            .map(|(t, serving)| {
                let service = uses_service_slot(t);
                let count = |f: fn(&Member, bool) -> bool| serving.iter().filter(|&&i| f(&workers[i], service)).count();
                (t.clone(), (count(Member::has_room), count(Member::slot_free)))
            })
            .collect();
        self.stale = false;
        true
    }

    /// Changes one worker in place, keeping the free-slot counts true.
    fn change(&mut self, i: usize, f: impl FnOnce(&mut Member)) {
        self.count(i, false);
        f(&mut self.workers[i]);
        self.count(i, true);
    }

    /// Adds worker `i` to the free-slot counts, or takes it out of them (nothing while stale:
    /// `prepare` counts afresh).
    fn count(&mut self, i: usize, add: bool) {
        if self.stale {
            return;
        }
        let FleetIndex { workers, free_takers, free_by_type, .. } = self;
        let m = &workers[i];
        let step = |n: &mut usize| if add { *n += 1 } else { *n -= 1 };
        if m.takes_work() {
            if m.has_room(false) {
                step(&mut free_takers.0);
            }
            if m.has_room(true) {
                step(&mut free_takers.1);
            }
        }
        let types = &m.snapshot.supported_task_types;
        for (k, t) in types.iter().enumerate() {
            let service = uses_service_slot(t);
            if !types[..k].contains(t)
                && let Some((room, slots)) = free_by_type.get_mut(t.as_str())
            {
                if m.has_room(service) {
                    step(room);
                }
                if m.slot_free(service) {
                    step(slots);
                }
            }
        }
    }

    /// Whether `worker_id` holds more batch tasks than it has batch slots: some wait in its queue.
    pub fn queue_taken(&self, worker_id: &str) -> bool {
        self.position(worker_id).is_ok_and(|i| self.workers[i].queue_taken())
    }

    /// Whether any worker holds more batch tasks than it has batch slots.
    pub fn any_queue_taken(&self) -> bool {
        self.workers.iter().any(Member::queue_taken)
    }

    /// Whether a worker other than `holder` passes every rule for the request but, at most, a
    /// free batch slot: it could run the task once one of its slots frees.
    pub fn could_run_elsewhere(&self, request: &Request, holder: &str) -> bool {
        let serving: &[usize] = self.by_type.get(request.task_type.as_str()).map_or(&[], Vec::as_slice);
        serving.iter().any(|&i| {
            let w = &self.workers[i];
            w.snapshot.id != holder
                && self.check(request, w).is_none_or(|(first, _)| first == Exclusion::NoFreeSlot { service: false })
        })
    }

    /// Whether some worker serving `task_type` has a batch slot of it free, queues aside.
    pub fn slot_free_for(&self, task_type: &str) -> bool {
        debug_assert!(!self.stale, "FleetIndex::prepare must run after a change");
        self.free_by_type.get(task_type).is_some_and(|&(_, slots)| slots > 0)
    }

    /// Whether every worker that serves `task_type` has all its slots of that kind taken (at
    /// least one serves it): no task of the type can be placed until one frees.
    pub fn full(&self, task_type: &str) -> bool {
        debug_assert!(!self.stale, "FleetIndex::prepare must run after a change");
        self.by_type.get(task_type).is_some_and(|serving| !serving.is_empty())
            && self.free_by_type.get(task_type).is_none_or(|&(room, _)| room == 0)
    }

    /// Whether no worker that may take work (not cordoned, not draining) has room (a slot free, or
    /// a place in its queue) of the kinds asked (batch, service): no task needing one can be placed
    /// until one frees.
    pub fn saturated(&self, batch: bool, service: bool) -> bool {
        debug_assert!(!self.stale, "FleetIndex::prepare must run after a change");
        !((batch && self.free_takers.0 > 0) || (service && self.free_takers.1 > 0))
    }

    /// A digest of what decides whether a waiting task could be placed, slots aside: each live
    /// worker (by id and start), the task types and executors it serves, its tags, cordon and
    /// drain. Equal digests mean the same fleet for every explanation but "no free slot".
    pub fn signature(&self) -> u64 {
        *self.signature.get_or_init(|| {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            for m in &self.workers {
                let s = &m.snapshot;
                (&s.id, &s.started_at, &s.supported_task_types, &s.tags, s.executors.len()).hash(&mut h);
                (m.cordoned, m.draining, s.status == WorkerStatus::Draining).hash(&mut h);
            }
            h.finish()
        })
    }

    /// The first exclusion of one worker (in check order) and whether any exclusion is permanent;
    /// `None` when the worker can take the task now. The task type is already known to match.
    fn check(&self, request: &Request, w: &Member) -> Option<(Exclusion, bool)> {
        let mut first: Option<Exclusion> = None;
        let mut permanent = false;
        let mut note = |e: Exclusion| {
            permanent |= e.is_permanent();
            if first.is_none() {
                first = Some(e);
            }
        };
        if let Some(selected) = &request.selected
            && !selected.iter().any(|id| id == &w.snapshot.id)
        {
            note(Exclusion::NotSelected);
        }
        capacity_checks(request, &w.candidate(), &w.gpu_names, &mut note);
        first.map(|e| (e, permanent))
    }

    /// Places one task, visiting every worker so the explanation counts them all (see [`place`]).
    pub fn place_explained(
        &self,
        request: &Request,
        stage: &str,
        task_id: &str,
        strategy: Strategy,
        avoid: &BTreeSet<String>,
        now_ms: u64,
    ) -> Placement {
        let serving: &[usize] = self.by_type.get(request.task_type.as_str()).map_or(&[], Vec::as_slice);
        let mut groups: Vec<(Exclusion, usize)> = Vec::new();
        let mut add = |e: Exclusion| match groups.iter_mut().find(|(g, _)| *g == e) {
            Some((_, n)) => *n += 1,
            None => groups.push((e, 1)),
        };
        let mut capable = 0;
        let mut eligible: Vec<usize> = Vec::new();
        // Workers whose one exclusion is a busy batch slot, with a place free in their queue.
        let mut queueing: Vec<usize> = Vec::new();
        // Workers that do not serve the type are counted in bulk; with `selected_worker`, a
        // worker outside the selection is reported as such first, as `explain` does.
        if let Some(selected) = &request.selected {
            for w in &self.workers {
                let serves = serving.binary_search_by(|&i| self.workers[i].snapshot.id.cmp(&w.snapshot.id)).is_ok();
                if !selected.iter().any(|id| id == &w.snapshot.id) {
                    add(Exclusion::NotSelected);
                } else if !serves {
                    add(Exclusion::TaskType);
                }
            }
        } else {
            for _ in 0..self.workers.len() - serving.len() {
                add(Exclusion::TaskType);
            }
        }
        for &i in serving {
            let w = &self.workers[i];
            if let Some(selected) = &request.selected
                && !selected.iter().any(|id| id == &w.snapshot.id)
            {
                continue;
            }
            match self.check(request, w) {
                None => eligible.push(i),
                Some((first, permanent)) => {
                    if request.queue && w.takes_into_queue(&first) {
                        queueing.push(i);
                    }
                    if !permanent {
                        capable += 1;
                    }
                    add(first);
                }
            }
        }
        groups.sort_by_key(|(e, _)| exclusion_rank(e));
        let reasons = groups
            .iter()
            .map(|(e, count)| ReasonCount {
                code: e.code().to_owned(),
                count: *count,
                text: e.describe(request, *count > 1),
            })
            .collect();
        let mut explanation = Explanation {
            workers: self.workers.len(),
            eligible: eligible.len(),
            capable: capable + eligible.len(),
            reasons,
            message: String::new(),
        };
        explanation.message = sentence(&explanation, stage);
        let ranking = self.ranking(&request.task_type, strategy);
        // No eligible worker has a free slot: one that queues takes the task into its queue, chosen
        // the same way. A worker with a free slot always wins over a queue, whatever the strategy.
        let queued = eligible.is_empty() && !queueing.is_empty();
        if queued {
            eligible = queueing;
        }
        // Best per tier: warm and not avoided, cold and not avoided, warm avoided, cold avoided.
        // Warmth orders eligible workers only: every rule has been applied already.
        let mut tiers: [Option<Best>; 4] = [None, None, None, None];
        for &i in &eligible {
            let candidate = self.score(i, ranking.by_index[i], strategy, task_id, now_ms);
            let snapshot = &self.workers[i].snapshot;
            let warm = request.model.as_deref().is_some_and(|m| snapshot.warm(m).is_some());
            let tier = 2 * usize::from(avoid.contains(&snapshot.id)) + usize::from(!warm);
            if tiers[tier].as_ref().is_none_or(|b| candidate.beats(b)) {
                tiers[tier] = Some(candidate);
            }
        }
        match tiers.into_iter().flatten().next() {
            Some(b) => {
                let snapshot = &self.workers[b.index].snapshot;
                if let Some(held) = request.model.as_deref().and_then(|m| snapshot.warm(m)) {
                    explanation.message += &format!(
                        "; {} holds {} warm ({}, {})",
                        snapshot.id,
                        held.id,
                        held.state.name(),
                        format_bytes(held.size_bytes)
                    );
                }
                if queued {
                    explanation.message += &format!("; queued on {} until one of its slots frees", snapshot.id);
                }
                Placement::Chosen {
                    worker_id: snapshot.id.clone(),
                    score: b.score,
                    explanation: Some(explanation),
                    queued,
                }
            }
            None => Placement::Pending(explanation),
        }
    }

    /// Whether some worker serving the request's type holds its model warm.
    fn warm_somewhere(&self, request: &Request) -> bool {
        let Some(model) = request.model.as_deref() else {
            return false;
        };
        let serving: &[usize] = self.by_type.get(request.task_type.as_str()).map_or(&[], Vec::as_slice);
        serving.iter().any(|&i| self.workers[i].snapshot.warm(model).is_some())
    }

    /// Places one task, fast: workers serving the type are visited best static score first, and
    /// the walk stops once no later worker can beat the best eligible one found. Only a task
    /// that has to wait gets the full explanation (a second walk, [`FleetIndex::place_explained`]),
    /// and only the first of alike waiting tasks walks: the others reuse its explanation.
    pub fn place(
        &self,
        request: &Request,
        stage: &str,
        task_id: &str,
        strategy: Strategy,
        avoid: &BTreeSet<String>,
        now_ms: u64,
    ) -> Placement {
        // The key is built only once some request waits: placing on a fleet with room allocates nothing.
        let unplaceable = lock(&self.unplaceable);
        if !unplaceable.is_empty()
            && let Some(known) = unplaceable.get(&RequestKey::of(request))
        {
            let mut explanation = known.clone();
            explanation.message = sentence(&explanation, stage);
            return Placement::Pending(explanation);
        }
        drop(unplaceable);
        // Warmth reorders the eligible workers, so the best-first walk cannot stop early: place
        // with the full walk (it also says which worker holds the model).
        if self.warm_somewhere(request) {
            return self.place_explained(request, stage, task_id, strategy, avoid, now_ms);
        }
        let ranking = self.ranking(&request.task_type, strategy);
        let headroom = dynamic_headroom(strategy);
        // No serving worker has a slot free: the walk looks for the best queue place instead,
        // stopping early the same way. (With some slot free, a queue is chosen only by the full
        // walk, when no worker with a free slot is eligible.)
        let to_queue = request.queue
            && !uses_service_slot(&request.task_type)
            && self.free_by_type.get(request.task_type.as_str()).is_some_and(|&(_, slots)| slots == 0);
        let mut best: Option<Best> = None;
        let mut best_avoided: Option<Best> = None;
        for &(static_score, i) in &ranking.order {
            if let Some(b) = &best
                && static_score + headroom < b.score
            {
                break;
            }
            let w = &self.workers[i];
            if let Some(selected) = &request.selected
                && !selected.iter().any(|id| id == &w.snapshot.id)
            {
                continue;
            }
            let eligible = match self.check(request, w) {
                None => true,
                Some((first, _)) => to_queue && w.takes_into_queue(&first),
            };
            if !eligible {
                continue;
            }
            let candidate = self.score(i, static_score, strategy, task_id, now_ms);
            let slot = if avoid.contains(&w.snapshot.id) { &mut best_avoided } else { &mut best };
            if slot.as_ref().is_none_or(|b| candidate.beats(b)) {
                *slot = Some(candidate);
            }
            if strategy == Strategy::FirstFit && best.is_some() {
                break;
            }
        }
        match best.or(best_avoided) {
            Some(b) => Placement::Chosen {
                worker_id: self.workers[b.index].snapshot.id.clone(),
                score: b.score,
                explanation: None,
                queued: to_queue,
            },
            None => {
                let placement = self.place_explained(request, stage, task_id, strategy, avoid, now_ms);
                if let Placement::Pending(explanation) = &placement {
                    let known = Explanation { message: String::new(), ..explanation.clone() };
                    lock(&self.unplaceable).insert(RequestKey::of(request), known);
                }
                placement
            }
        }
    }

    /// The serving workers of `task_type` by static score, best first (ties: lower id first).
    fn ranking(&self, task_type: &str, strategy: Strategy) -> Arc<Ranking> {
        let key = (task_type.to_owned(), strategy);
        if let Some(r) = lock(&self.rankings).get(&key) {
            return r.clone();
        }
        let serving: &[usize] = self.by_type.get(task_type).map_or(&[], Vec::as_slice);
        let snapshot = |i: usize| &self.workers[i].snapshot;
        let mut ranked: Vec<(f64, usize)> = match strategy {
            // Ids are sorted, so the index order is the id order.
            Strategy::FirstFit => serving.iter().map(|&i| (0.0, i)).collect(),
            Strategy::MinSatisfying => serving.iter().map(|&i| (-throughput(snapshot(i)), i)).collect(),
            Strategy::BestFit => {
                let t: Vec<f64> = serving.iter().map(|&i| throughput(snapshot(i))).collect();
                let cost: Vec<f64> = serving.iter().map(|&i| snapshot(i).cost_per_hour).collect();
                let (t_norm, cost_norm) = (normaliser(&t), normaliser(&cost));
                let lambda = throughput_weight(task_type);
                serving
                    .iter()
                    .enumerate()
                    .map(|(k, &i)| (lambda * t_norm(t[k]) - (1.0 - lambda) * cost_norm(cost[k]), i))
                    .collect()
            }
        };
        ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut by_index = vec![f64::NEG_INFINITY; self.workers.len()];
        for &(score, i) in &ranked {
            by_index[i] = score;
        }
        let ranked = Arc::new(Ranking { order: ranked, by_index });
        lock(&self.rankings).insert(key, ranked.clone());
        ranked
    }

    /// The full score of worker `i`: its static score plus, for best_fit, the idle bonus and the
    /// deterministic jitter.
    fn score(&self, i: usize, static_score: f64, strategy: Strategy, task_id: &str, now_ms: u64) -> Best {
        let snap = &self.workers[i].snapshot;
        let idle = snap.idle_since_ms.map_or(0, |since| now_ms.saturating_sub(since));
        let score = match strategy {
            Strategy::BestFit => {
                let age_bonus = AGE_BONUS * (idle as f64 / 3_600_000.0).min(1.0);
                let jitter = (fnv(&[task_id, &snap.id]) % 1000) as f64 * JITTER_STEP;
                static_score + age_bonus + jitter
            }
            Strategy::FirstFit | Strategy::MinSatisfying => static_score,
        };
        let idle = if strategy == Strategy::FirstFit { 0 } else { idle };
        Best { score, idle, index: i }
    }
}

/// The largest idle bonus (a worker idle for an hour or more).
const AGE_BONUS: f64 = 0.02;
/// The jitter is below 1000 of these steps.
const JITTER_STEP: f64 = 1e-6;

/// How much the per-task part of a score can add to the static score.
fn dynamic_headroom(strategy: Strategy) -> f64 {
    match strategy {
        Strategy::BestFit => AGE_BONUS + 1000.0 * JITTER_STEP,
        Strategy::FirstFit | Strategy::MinSatisfying => 0.0,
    }
}

/// A scored eligible worker. Higher score wins, then longer idle, then the lower id (the lower
/// index: workers are sorted by id).
#[derive(Debug, Clone, Copy)]
struct Best {
    score: f64,
    idle: u64,
    index: usize,
}

impl Best {
    fn beats(&self, other: &Best) -> bool {
        self.score.total_cmp(&other.score).then(self.idle.cmp(&other.idle)).then(other.index.cmp(&self.index)).is_gt()
    }
}

fn exclusion_rank(e: &Exclusion) -> usize {
    match e {
        Exclusion::NotSelected => 0,
        Exclusion::TaskType => 1,
        Exclusion::Backend(_) => 2,
        Exclusion::Tags => 3,
        Exclusion::Cpu { .. } => 4,
        Exclusion::Memory { .. } => 5,
        Exclusion::Gpu { .. } => 6,
        Exclusion::Cordoned => 7,
        Exclusion::Draining => 8,
        Exclusion::NoFreeSlot { .. } => 9,
    }
}

fn sentence(e: &Explanation, stage: &str) -> String {
    let mut text = format!("{}/{} workers can run stage {stage:?}", e.eligible, e.workers);
    if e.workers == 0 {
        text += ": no live workers";
    } else if !e.reasons.is_empty() {
        let parts: Vec<String> = e.reasons.iter().map(|r| format!("{} {}", r.count, r.text)).collect();
        text += ": ";
        text += &parts.join(", ");
    }
    text
}

/// Min-max normalisation over `values` (0.5 for all when they are equal).
fn normaliser(values: &[f64]) -> impl Fn(f64) -> f64 {
    let (lo, hi) = values.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| (lo.min(x), hi.max(x)));
    move |v| if hi > lo { (v - lo) / (hi - lo) } else { 0.5 }
}
