//! The worker: probes its hardware, builds the executors it really has, advertises them in
//! `flowmesh_workers`, runs the work sent to `flowmesh.work.<id>`, stores results and artifacts,
//! and reports every step as an event.

pub mod config;
pub mod executor;
pub mod gpu_subset;
pub mod hardware;
pub mod journal;
pub mod queue;
mod warm;

pub use config::{Config, WorkerArgs};

use async_nats::jetstream::{self, AckKind, consumer::pull};
use executor::{ExecError, Executor, TaskContext, plugin, python, ssh};
use flowmesh_domain::event::{Artifact, Author, TaskRef, TaskStarted, TaskUpdated};
use flowmesh_domain::fleet::{SlotCount, Slots, WorkerSnapshot, WorkerStatus, uses_service_slot};
use flowmesh_domain::work::{self, Completion, Outcome, WorkOrder};
use flowmesh_domain::{Event, EventBody};
use flowmesh_nats::retry::{Backoff, GaveUp};
use flowmesh_nats::{Handles, Shutdown, Trigger, clock, publish, shutdown, subjects};
use futures_util::StreamExt;
use journal::{Entry, Journal};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::{Instrument, info, info_span, warn};

/// Results up to this size travel inside `task.completed`; larger ones only by reference.
const INLINE_RESULT_BYTES: usize = 64 * 1024;
/// A task still running this long after it started is reported `task.started`; one that
/// completed by then is not (its `task.completed` carries `started_at`): a start nobody could
/// have watched is not worth a stored message.
const START_REPORT_DELAY: Duration = Duration::from_millis(20);

/// The least time between two snapshots published because the queue offered changed
/// (`Shared::publish_changed_offer`): an offer near a boundary may change with every run.
const OFFER_EVERY: Duration = Duration::from_secs(1);

/// A task this worker is running.
struct Active {
    cancel: Arc<Trigger>,
    service: bool,
    /// Set when a draining worker stops the task to hand it back rather than to cancel it.
    handed_back: Arc<std::sync::atomic::AtomicBool>,
}

struct Shared {
    config: Config,
    client: async_nats::Client,
    /// What `flowmesh.worker.status` answers: the latest snapshot.
    status: flowmesh_nats::status::Status,
    handles: Handles,
    /// This worker's object store (`Config::artifacts_bucket`): every file it stores goes there.
    artifacts: async_nats::jetstream::object_store::ObjectStore,
    /// The stores it reads upstream files from (any worker's).
    inputs: flowmesh_nats::artifacts::Stores,
    /// Built at start: echo, python, ssh, plugins.
    executors: Vec<Executor>,
    /// The ML runners: an `initialising` entry until the background probe answers, then what
    /// initialised (and what did not, by name). Replaced whole; a running task keeps its copy.
    runners: std::sync::RwLock<Arc<Vec<Executor>>>,
    probe: hardware::Probe,
    journal: Journal,
    /// Tasks whose order it holds, by id, until they run (`execute` moves them to `active`): what
    /// cancels one waiting for a slot.
    queued: Mutex<BTreeMap<String, Arc<Trigger>>>,
    /// Of those, how many wait for a slot now (the snapshot's `queued`).
    waiting: std::sync::atomic::AtomicU32,
    /// Of those, the ones waiting for a slot now, by id: what gives one back when the router
    /// asks (it could run sooner elsewhere). Only while it waits, so a release never stops a run.
    releasable: Mutex<BTreeMap<String, Trigger>>,
    active: Mutex<BTreeMap<String, Active>>,
    /// Run permits, one per slot of each kind: a task runs only holding one of its kind.
    batch_slots: Arc<tokio::sync::Semaphore>,
    /// The queue it offers (the snapshot's `prefetch`), from how long its runs hold a slot.
    queue: Mutex<queue::QueueDepth>,
    /// The offer its latest snapshot made.
    offered: std::sync::atomic::AtomicU32,
    /// When a changed offer was last published between heartbeats (`OFFER_EVERY`).
    offer_published: Mutex<Option<std::time::Instant>>,
    service_slots: Arc<tokio::sync::Semaphore>,
    started_at: String,
    idle_since_ms: Mutex<Option<u64>>,
    draining: std::sync::atomic::AtomicBool,
    warm: warm::WarmCache,
    /// How reports are retried: until stored, or until a stopping worker gives up on them (NATS
    /// unreachable past the drain grace); the journal keeps them and the next start sends them.
    reporting: Backoff,
    /// How uploads are retried: a few seconds (a stream electing a leader), observing the same
    /// give-up as reports.
    uploading: Backoff,
}

/// Builds the executors whose runtime dependency is present, logging why each missing one is missing.
pub async fn build_executors(config: &Config, probe: &hardware::Probe) -> anyhow::Result<Vec<Executor>> {
    let mut executors = vec![Executor::Echo];
    match python_interpreter().await {
        Some(interpreter) => executors.push(Executor::Python { interpreter }),
        None => info!(executor = "python", "not available: no python3 on PATH"),
    }
    let ssh_settings = ssh::SshSettings {
        worker_id: config.worker_id.clone(),
        limits: config.ssh_limits,
        gpu_limit: config.ssh_gpu_limit,
        hardware: probe.hardware.clone(),
        simulated: probe.simulated,
        public_host: config.ssh_public_host.clone().unwrap_or_else(flowmesh_nats::host::name),
        bind_address: config.ssh_bind_address.clone(),
        home: std::path::absolute(&config.results_dir)
            .unwrap_or_else(|_| config.results_dir.clone())
            .display()
            .to_string(),
    };
    match ssh::SshExecutor::connect(ssh_settings).await {
        Ok(executor) => executors.push(Executor::Ssh(Box::new(executor))),
        Err(why) => info!(executor = "ssh", reason = %why, "not available"),
    }
    if let Some(path) = &config.executors_file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("FLOWMESH_EXECUTORS: reading {}: {e}", path.display()))?;
        let plugins = plugin::parse(path, &text).map_err(|e| anyhow::anyhow!("FLOWMESH_EXECUTORS: {e}"))?;
        let has_gpu = !probe.hardware.gpus.is_empty();
        for p in plugins {
            match plugin::unavailable(&p, has_gpu).await {
                None => executors.push(Executor::Plugin(p)),
                Some(why) => info!(executor = %p.name, reason = %why, "plugin not available"),
            }
        }
    }
    Ok(executors)
}

async fn python_interpreter() -> Option<String> {
    let status = tokio::process::Command::new("python3")
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .await
        .ok()?;
    status.success().then(|| "python3".to_owned())
}

/// What the GPU-dependent answers of the runner probe depend on beyond the package's own
/// fingerprint: the GPUs the driver lists (never the simulated ones) and `CUDA_VISIBLE_DEVICES`.
fn runner_machine_key(cuda: Option<&str>) -> String {
    let real = hardware::probe(None, cuda);
    let gpus: Vec<String> = real.hardware.gpus.iter().map(|g| format!("{}:{}", g.uuid, g.name)).collect();
    format!("CUDA_VISIBLE_DEVICES={cuda:?} gpus={gpus:?}")
}

/// The task types advertised: the union over the constructed executors.
pub fn supported_task_types<'a>(executors: impl IntoIterator<Item = &'a Executor>) -> Vec<String> {
    let mut types: Vec<String> = executors.into_iter().flat_map(Executor::task_types).collect();
    types.sort();
    types.dedup();
    types
}

/// `--collect-hw`: the probe and the executors this worker would construct, as JSON on stdout.
pub async fn print_hardware(config: &Config) -> anyhow::Result<()> {
    let cuda = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let probe = hardware::probe(config.simulate_hw.as_ref(), cuda.as_deref());
    let mut executors = build_executors(config, &probe).await?;
    if let Some(python) = &config.runners_python {
        let machine = runner_machine_key(cuda.as_deref());
        executors.extend(executor::runners(python, config.runners_cache.as_deref(), &machine).await);
    }
    let report = serde_json::json!({
        "probe": probe,
        "executors": executors.iter().map(Executor::info).collect::<Vec<_>>(),
        "supported_task_types": supported_task_types(&executors),
        "cuda_visible_devices": cuda,
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

impl Shared {
    /// The runners as they stand now (a copy that stays whole while the probe replaces them).
    fn runners(&self) -> Arc<Vec<Executor>> {
        self.runners.read().expect("runners lock").clone()
    }

    fn snapshot(&self) -> WorkerSnapshot {
        let runners = self.runners();
        let executors: Vec<&Executor> = self.executors.iter().chain(runners.iter()).collect();
        let supported = supported_task_types(executors.iter().copied());
        let active = self.active.lock().expect("active lock");
        let service_in_use = active.values().filter(|a| a.service).count() as u32;
        let batch_in_use = active.len() as u32 - service_in_use;
        let status = if self.draining.load(std::sync::atomic::Ordering::SeqCst) {
            WorkerStatus::Draining
        } else if active.is_empty() {
            WorkerStatus::Idle
        } else {
            WorkerStatus::Busy
        };
        let ssh = self.config.ssh_limits;
        WorkerSnapshot {
            id: self.config.worker_id.clone(),
            hostname: flowmesh_nats::host::name(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            started_at: self.started_at.clone(),
            status,
            hardware: self.probe.hardware.clone(),
            executors: executors.iter().map(|e| e.info()).collect(),
            slots: Slots {
                batch: SlotCount { total: self.config.batch_slots, in_use: batch_in_use },
                service: SlotCount { total: self.config.service_slots, in_use: service_in_use },
            },
            prefetch: self.queue.lock().expect("queue lock").places(),
            queued: self.waiting.load(std::sync::atomic::Ordering::SeqCst),
            ssh_limits: supported.iter().any(|t| t == "ssh").then_some(ssh),
            supported_task_types: supported,
            tags: self.config.tags.clone(),
            cost_per_hour: self.config.cost_per_hour,
            load: f64::from(batch_in_use) / f64::from(self.config.batch_slots.max(1)),
            active_tasks: active.keys().cloned().collect(),
            simulated: self.probe.simulated,
            // Whole seconds, rounded up: a sub-second test interval still reads as 1.
            heartbeat_interval_sec: self.config.heartbeat_interval.as_millis().div_ceil(1000) as u64,
            ttl_sec: self.config.ttl.as_millis().div_ceil(1000) as u64,
            idle_since_ms: if active.is_empty() { *self.idle_since_ms.lock().expect("idle lock") } else { None },
            warm_models: self.warm.models(),
        }
    }

    async fn heartbeat(&self) {
        let snapshot = self.snapshot();
        self.offered.store(snapshot.prefetch, std::sync::atomic::Ordering::SeqCst);
        self.status.set(serde_json::to_value(&snapshot).unwrap_or_default());
        let bytes = serde_json::to_vec(&snapshot).expect("snapshots serialize");
        if let Err(e) = self.handles.workers.put(&self.config.worker_id, bytes.into()).await {
            warn!(error = %e, "heartbeat failed; will retry at the next interval");
        }
    }

    /// A batch task held its slot for `took`: the queue offered follows (`queue::QueueDepth`).
    fn ran(&self, took: Duration) {
        self.queue.lock().expect("queue lock").ran(took);
    }

    /// Publishes a snapshot at once when the queue offered has changed since the last one, at
    /// most once per `OFFER_EVERY`; a change within it waits for a later run or the heartbeat.
    /// Heartbeats are seconds apart, and a worker of quick tasks (or one whose tasks turned long)
    /// should not offer its old queue that long. A draining worker takes no work, so its offer no
    /// longer matters, and its tasks' last step does not wait on a snapshot (a drain may be
    /// riding out an outage).
    async fn publish_changed_offer(&self) {
        let places = self.queue.lock().expect("queue lock").places();
        if places == self.offered.load(std::sync::atomic::Ordering::SeqCst)
            || self.draining.load(std::sync::atomic::Ordering::SeqCst)
        {
            return;
        }
        {
            let mut published = self.offer_published.lock().expect("offer lock");
            if published.is_some_and(|at| at.elapsed() < OFFER_EVERY) {
                return;
            }
            *published = Some(std::time::Instant::now());
        }
        self.heartbeat().await;
    }

    /// Publishes a report, retrying until the stream stores it, or until a stopping worker gives
    /// up (`Err`). The journal holds it meanwhile, so a report that never got out is sent after a
    /// restart.
    async fn report(&self, event: &Event) -> Result<(), GaveUp<flowmesh_nats::EdgeError>> {
        self.report_written(event, serde_json::to_vec(event).expect("events serialize").into()).await
    }

    /// [`Shared::report`] for an event already serialized as `json`.
    async fn report_written(&self, event: &Event, json: bytes::Bytes) -> Result<(), GaveUp<flowmesh_nats::EdgeError>> {
        let author = Author::Worker(&self.config.worker_id);
        let stored = self
            .reporting
            .retry(
                &format!("storing report {}", event.id),
                || publish::publish_written(&self.handles.js, event, author, json.clone()),
                |_| true,
            )
            .await;
        if stored.is_err() {
            warn!(event = %event.id, "stopping: the journal keeps this report for the next start");
        }
        stored.map(drop)
    }
}

/// Runs the worker until `shutdown` fires, then drains.
pub async fn run(
    mut config: Config,
    client: async_nats::Client,
    handles: Handles,
    mut shutdown: Shutdown,
) -> anyhow::Result<()> {
    // Task processes run inside their own folder: every path handed to them must be absolute.
    config.results_dir = std::path::absolute(&config.results_dir)?;
    let cuda = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let probe = hardware::probe(config.simulate_hw.as_ref(), cuda.as_deref());
    let executors = build_executors(&config, &probe).await?;
    let caps = config.ssh_limits;
    let unbounded = caps.max_cpu.is_none() || caps.max_memory_bytes.is_none() || caps.max_pids.is_none();
    if unbounded && supported_task_types(&executors).iter().any(|t| t == "ssh") {
        warn!("some of SSH_MAX_CPU, SSH_MAX_MEMORY, SSH_MAX_PIDS are unset: ssh containers are unbounded there");
    }
    std::fs::create_dir_all(&config.results_dir)?;
    let artifacts = flowmesh_nats::artifacts::ensure_bucket(&handles.js, &config.artifacts_bucket).await?;
    let journals = config.results_dir.join(".journal");
    let journal = Journal::open(&journals.join(format!("{}.log", config.worker_id)))?;
    journal.adopt_sled(&journals.join(&config.worker_id))?;
    let status = flowmesh_nats::status::Status::default();
    let (give_up, abandon) = shutdown::channel();
    let shared = Arc::new(Shared {
        status: status.clone(),
        client: client.clone(),
        handles: handles.clone(),
        artifacts,
        inputs: flowmesh_nats::artifacts::Stores::new(&handles.js),
        executors,
        runners: std::sync::RwLock::new(Arc::new(
            config.runners_python.as_deref().map(executor::initialising).into_iter().collect(),
        )),
        probe,
        journal,
        queued: Mutex::new(BTreeMap::new()),
        waiting: std::sync::atomic::AtomicU32::new(0),
        releasable: Mutex::new(BTreeMap::new()),
        active: Mutex::new(BTreeMap::new()),
        // A kind with no slots still runs one task: the router sends none, so that only serves
        // an order sent on an older snapshot.
        batch_slots: Arc::new(tokio::sync::Semaphore::new(config.batch_slots.max(1) as usize)),
        queue: Mutex::new(queue::QueueDepth::new(config.prefetch, config.batch_slots)),
        offered: std::sync::atomic::AtomicU32::new(0),
        offer_published: Mutex::new(None),
        service_slots: Arc::new(tokio::sync::Semaphore::new(config.service_slots.max(1) as usize)),
        started_at: clock::now_rfc3339(),
        idle_since_ms: Mutex::new(Some(clock::now_ms())),
        draining: std::sync::atomic::AtomicBool::new(false),
        warm: warm::WarmCache::new(config.model_cache.clone(), config.heartbeat_interval),
        reporting: Backoff::new(Duration::from_millis(200), Duration::from_secs(5), abandon.clone()),
        uploading: Backoff::new(Duration::from_millis(400), Duration::from_secs(4), abandon)
            .within(Duration::from_secs(8)),
        config,
    });
    let id = shared.config.worker_id.clone();
    info!(
        worker_id = %id,
        task_types = ?supported_task_types(&shared.executors),
        gpus = shared.probe.hardware.gpus.len(),
        simulated = shared.probe.simulated,
        "worker starting"
    );

    // Reports a previous run finished but could not send.
    for event in shared.journal.unreported() {
        if shared.report(&event).await.is_ok()
            && let Some(task) = event.body.task()
        {
            let _ = shared.journal.reported(&task.task_id, task.attempt);
        }
    }

    shared.heartbeat().await;
    let _service =
        flowmesh_nats::status::serve(&client, "worker", &format!("worker.{id}"), "FlowMesh worker: runs tasks", status)
            .await?;
    // Background loops live in a JoinSet so they end with `run`, even when it is aborted.
    let mut background = tokio::task::JoinSet::new();
    {
        let shared = shared.clone();
        let mut stop = shutdown.clone();
        background.spawn(async move {
            let mut tick = tokio::time::interval(shared.config.heartbeat_interval);
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = stop.wait() => break,
                    _ = tick.tick() => shared.heartbeat().await,
                }
            }
        });
    }
    // Its own store loses the files of workflows whose events retention removed from the log,
    // and what uploads that stopped halfway left. The shared store is the admin's to prune: its
    // user may not purge it.
    if let Some(every) = shared.config.artifacts_prune
        && shared.config.artifacts_bucket != subjects::ARTIFACTS_BUCKET
    {
        let shared = shared.clone();
        let mut stop = shutdown.clone();
        background.spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut state = PruneState::default();
            loop {
                tokio::select! {
                    _ = stop.wait() => break,
                    _ = tick.tick() => state = prune_own_store(&shared, state).await,
                }
            }
        });
    }
    // The runners are asked in the background (importing torch and TRL takes tens of seconds):
    // the worker serves what it has meanwhile, and advertises a runner's types only once it has
    // initialised, in a snapshot published at once.
    if let Some(python) = shared.config.runners_python.clone() {
        let shared = shared.clone();
        let machine = runner_machine_key(cuda.as_deref());
        let mut stop = shutdown.clone();
        background.spawn(async move {
            let probe = executor::runners(&python, shared.config.runners_cache.as_deref(), &machine);
            tokio::select! {
                // A stopping worker publishes no snapshot: it is about to delete its own.
                _ = stop.wait() => {}
                found = probe => {
                    *shared.runners.write().expect("runners lock") = Arc::new(found);
                    shared.heartbeat().await;
                }
            }
        });
    }
    {
        let shared = shared.clone();
        let mut sub = client.subscribe(subjects::cancel(&id)).await?;
        background.spawn(async move {
            while let Some(msg) = sub.next().await {
                let task_id = String::from_utf8_lossy(&msg.payload).trim().to_owned();
                // Running, else waiting for a slot (a task moves to `active` before it leaves
                // `queued`, so one of the two always has it).
                let running = shared.active.lock().expect("active lock").get(&task_id).map(|a| a.cancel.clone());
                let trigger = running.or_else(|| shared.queued.lock().expect("queued lock").get(&task_id).cloned());
                if let Some(trigger) = trigger {
                    info!(task_id = %task_id, "cancel requested");
                    trigger.fire();
                }
            }
        });
    }

    {
        let shared = shared.clone();
        let mut sub = client.subscribe(subjects::release(&id)).await?;
        background.spawn(async move {
            while let Some(msg) = sub.next().await {
                let task_id = String::from_utf8_lossy(&msg.payload).trim().to_owned();
                // Ignored unless it still waits for a slot: started, it runs here.
                if let Some(trigger) = shared.releasable.lock().expect("releasable lock").get(&task_id) {
                    info!(task_id = %task_id, "asked to give back a queued order; giving it back unrun");
                    trigger.fire();
                }
            }
        });
    }

    {
        let sub = client.subscribe(subjects::prewarm(&id)).await?;
        background.spawn(warm::listen(shared.clone(), sub));
    }

    // The orders it holds at once: one per slot, and its queue (`prefetch`) of batch orders that
    // wait for a batch slot, acking progress meanwhile so their ack wait never runs out.
    let held = ((shared.config.batch_slots + shared.config.service_slots).max(1) + shared.config.prefetch) as usize;
    // Two queues, one durable consumer each, created or updated (a worker restarted with more
    // slots or another ack wait gets them). The router sends a worker no more tasks than it has
    // slots and queue places.
    // 1. Its dispatches in the log, which carry the orders of tasks without secrets. Pushed to
    //    a subject under this worker's own inbox prefix, which only it may hear: other users
    //    may read the log and pull from its consumers, but cannot take its work by pulling.
    let inbox = client.new_inbox();
    let prefix = inbox.rsplit_once('.').map_or(inbox.as_str(), |(prefix, _)| prefix);
    let dispatches = handles
        .js
        .get_stream(subjects::EVENTS_STREAM)
        .await?
        .create_consumer(jetstream::consumer::push::Config {
            durable_name: Some(subjects::work_consumer(&id)),
            deliver_subject: subjects::dispatch_inbox(prefix, &id),
            filter_subject: subjects::dispatches(&id),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait: shared.config.ack_wait,
            max_ack_pending: held as i64,
            ..Default::default()
        })
        .await?
        .messages()
        .await?
        .map(|m| m.map_err(|e| e.to_string()));
    // 2. Its work subject, for orders that hold a secret (never in the log).
    let orders = handles
        .js
        .get_stream(subjects::WORK_STREAM)
        .await?
        .create_consumer(pull::Config {
            durable_name: Some(subjects::work_consumer(&id)),
            filter_subject: subjects::work(&id),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait: shared.config.ack_wait,
            max_ack_pending: held as i64,
            ..Default::default()
        })
        .await?
        .messages()
        .await?
        .map(|m| m.map_err(|e| e.to_string()));
    let mut messages = futures_util::stream::select(dispatches, orders);
    let permits = Arc::new(tokio::sync::Semaphore::new(held));
    let mut running = tokio::task::JoinSet::new();
    info!(worker_id = %id, held, "worker ready");
    loop {
        let permit = tokio::select! {
            _ = shutdown.wait() => break,
            p = permits.clone().acquire_owned() => p?,
        };
        let Some(message) = flowmesh_nats::consume::next(&mut messages, &mut shutdown).await else { break };
        let shared = shared.clone();
        let stopping = shutdown.clone();
        running.spawn(async move {
            handle(&shared, message, stopping).await;
            drop(permit);
        });
        while running.try_join_next().is_some() {}
    }

    // Drain: advertise it, stop taking work, give in-flight tasks the grace period.
    shared.draining.store(true, std::sync::atomic::Ordering::SeqCst);
    shared.heartbeat().await;
    drop(messages);
    let grace = shared.config.drain_grace;
    if tokio::time::timeout(grace, async { while running.join_next().await.is_some() {} }).await.is_err() {
        warn!(?grace, "in-flight tasks did not finish within the drain grace; handing them back");
        for active in shared.active.lock().expect("active lock").values() {
            active.handed_back.store(true, std::sync::atomic::Ordering::SeqCst);
            active.cancel.fire();
        }
        // Their reports get one more grace period; NATS still unreachable then, they stay in
        // the journal and the worker stops anyway (a bounded drain, not a hang).
        if tokio::time::timeout(grace, async { while running.join_next().await.is_some() {} }).await.is_err() {
            warn!(?grace, "reports not stored within another drain grace; stopping, the journal keeps them");
            give_up.fire();
            // What still waits on NATS (an upload, an ack) is cut off after one more grace: the
            // journal holds every finished task's report, and the work order stays unacked.
            if tokio::time::timeout(grace, async { while running.join_next().await.is_some() {} }).await.is_err() {
                running.abort_all();
                while running.join_next().await.is_some() {}
            }
        }
    }
    // Leaving the fleet makes the router requeue whatever this worker did not finish.
    let _ = tokio::time::timeout(grace.max(Duration::from_secs(1)), handles.workers.delete(&id)).await;
    background.abort_all();
    if let Err(e) = shared.journal.sync() {
        warn!(error = %e, "the journal's last sync failed");
    }
    info!(worker_id = %id, "worker stopped");
    Ok(())
}

/// What the worker's pruning of its own store last did: the purge record it applied in full, and
/// when it last looked for orphaned chunks.
#[derive(Default, Clone, Copy)]
struct PruneState {
    applied: Option<u64>,
    orphans_swept: Option<std::time::Instant>,
}

/// Removes from the worker's own store the files of every workflow the latest purge record
/// lists, unless that record is the one a pruning last applied in full, and the chunks of uploads
/// that stopped halfway (`Config::artifacts_orphans_older_than`, an hour), looking for those at
/// most once in that time: a store is listed once per record or per hour, not once per interval.
async fn prune_own_store(shared: &Shared, state: PruneState) -> PruneState {
    let js = &shared.handles.js;
    let bucket = &shared.config.artifacts_bucket;
    let every = shared.config.artifacts_orphans_older_than;
    let sweep = state.orphans_swept.is_none_or(|at| at.elapsed() >= every);
    let (record, purged) = match flowmesh_nats::artifacts::purged_workflows(js).await {
        Ok(Some(latest)) if Some(latest.0) != state.applied || sweep => (Some(latest.0), latest.1),
        Ok(None) if sweep => (None, Default::default()),
        Ok(_) => return state,
        Err(e) => {
            warn!(error = %e, "pruning the object store: the purge record could not be read; trying again later");
            return state;
        }
    };
    let started = std::time::Instant::now();
    match flowmesh_nats::artifacts::prune(js, bucket, &purged, every).await {
        Ok(pruned) => {
            metrics::counter!("flowmesh_worker_artifacts_pruned_total").increment(pruned.removed);
            metrics::counter!("flowmesh_worker_orphaned_uploads_pruned_total").increment(pruned.orphans);
            if pruned.removed + pruned.orphans + pruned.failed > 0 {
                info!(%bucket, removed = pruned.removed, orphans = pruned.orphans, failed = pruned.failed, kept = pruned.kept, "pruned the object store");
            }
            PruneState {
                applied: if pruned.failed == 0 { record.or(state.applied) } else { state.applied },
                orphans_swept: Some(started),
            }
        }
        Err(e) => {
            warn!(%bucket, error = %e, "pruning the object store failed; trying again later");
            state
        }
    }
}

async fn handle(shared: &Arc<Shared>, message: jetstream::Message, stopping: Shutdown) {
    // Anyone who may read the log can point a consumer of their own at this worker's inbox; a
    // message counts only when this worker's own consumer delivered it.
    let consumer = subjects::work_consumer(&shared.config.worker_id);
    let queue = message.info().ok().filter(|i| i.consumer == consumer).map(|i| i.stream.to_owned());
    let dispatch = match queue.as_deref() {
        Some(subjects::EVENTS_STREAM) => Some(subjects::event_suffix(&message.subject).unwrap_or_default()),
        Some(subjects::WORK_STREAM) => None,
        _ => {
            warn!(subject = %message.subject, "a message not from this worker's own consumers; ignoring it");
            return;
        }
    };
    let order: WorkOrder = match flowmesh_domain::work::take(&shared.config.worker_id, dispatch, &message.payload) {
        Ok(Some(order)) => order,
        // Its order holds a secret and comes on the work subject.
        Ok(None) => {
            let _ = message.ack().await;
            return;
        }
        Err(e) => {
            warn!(subject = %message.subject, error = %e, "not a work order for this worker; dropping it");
            let _ = message.ack_with(AckKind::Term).await;
            return;
        }
    };
    let order = Arc::new(order);
    let span = info_span!("task", task_id = %order.task_id, attempt = order.attempt);
    async {
        match shared.journal.get(&order.task_id, order.attempt) {
            Some(Entry::Unreported(event)) => {
                // Finished before a crash: report (same id), never re-run.
                info!("already finished; sending its report");
                if shared.report(&event).await.is_ok() {
                    let _ = shared.journal.reported(&order.task_id, order.attempt);
                }
                let _ = message.ack().await;
                return;
            }
            Some(Entry::Reported) => {
                // Its report is stored; the ack was lost (a crash, a dropped connection).
                info!("already finished and reported; acking the redelivered order");
                let _ = message.ack().await;
                return;
            }
            None => {}
        }
        let event = match take_turn(shared, &order, &message, stopping).await {
            Turn::Run(slot, cancel) => {
                let began = std::time::Instant::now();
                let event = execute(shared, &order, &message, cancel).await;
                // The slot is free once the task ended: a queued order runs while this reports.
                drop(slot);
                if !uses_service_slot(&order.task_type) {
                    shared.ran(began.elapsed());
                }
                event
            }
            Turn::Released => Event::new(
                work::report(task_ref(&order), &shared.config.worker_id, Outcome::Released),
                clock::now_rfc3339(),
                0,
            ),
            Turn::Cancelled => {
                info!("cancelled while waiting for a slot");
                Event::new(
                    work::report(task_ref(&order), &shared.config.worker_id, Outcome::CancelledWaiting),
                    clock::now_rfc3339(),
                    0,
                )
            }
            Turn::Stopping => {
                // Never started and never acked: leaving the fleet makes the router requeue it.
                info!("stopping before it ran; handing its order back");
                return;
            }
            Turn::Held => {
                info!("already holding this task's order; the copy held acks it");
                return;
            }
        };
        let event = Arc::new(event);
        // Serialized once: the journal holds the bytes the report is sent in.
        let json = bytes::Bytes::from(serde_json::to_vec(&*event).expect("events serialize"));
        if let Err(e) = shared.journal.finish_written(&order.task_id, order.attempt, &event, &json) {
            warn!(error = %e, "journal write failed after the task ended");
        }
        failpoint("after-journal-finish");
        if shared.report_written(&event, json).await.is_ok() {
            let _ = shared.journal.reported(&order.task_id, order.attempt);
        }
        if let Err(e) = message.ack().await {
            warn!(error = %e, "ack failed after the report was stored; a redelivery will re-send it");
        }
        shared.publish_changed_offer().await;
    }
    .instrument(span)
    .await;
}

/// How a task's wait for a slot ended.
enum Turn {
    /// It holds a slot of its kind, and what cancels it from now on.
    Run(tokio::sync::OwnedSemaphorePermit, (Arc<Trigger>, Shutdown)),
    /// A person cancelled it first.
    Cancelled,
    /// The router asked for it back first (it could run sooner elsewhere): it never ran here.
    Released,
    /// The worker began to stop first.
    Stopping,
    /// Another delivery of an order it holds (its ack wait ran out meanwhile): that one acks it.
    Held,
}

/// Waits for a free slot of the task's kind. A queued order (`prefetch`) waits here, its ack
/// wait renewed by progress acks, and can be cancelled or handed back meanwhile.
async fn take_turn(shared: &Shared, order: &WorkOrder, message: &jetstream::Message, mut stopping: Shutdown) -> Turn {
    let slots = if uses_service_slot(&order.task_type) { &shared.service_slots } else { &shared.batch_slots };
    let (trigger, mut cancel) = shutdown::channel();
    let trigger = Arc::new(trigger);
    let task_id = &order.task_id;
    {
        let mut queued = shared.queued.lock().expect("queued lock");
        if queued.contains_key(task_id) || shared.active.lock().expect("active lock").contains_key(task_id) {
            return Turn::Held;
        }
        queued.insert(task_id.clone(), trigger.clone());
    }
    let slot = match slots.clone().try_acquire_owned() {
        Ok(slot) => slot,
        Err(_) => {
            let _waiting = Waiting::enter(&shared.waiting);
            let (give_back, mut release) = shutdown::channel();
            shared.releasable.lock().expect("releasable lock").insert(task_id.clone(), give_back);
            let waited = with_progress(message, shared.config.ack_wait, async {
                tokio::select! {
                    biased;
                    _ = cancel.wait() => Err(Turn::Cancelled),
                    _ = stopping.wait() => Err(Turn::Stopping),
                    _ = release.wait() => Err(Turn::Released),
                    slot = slots.clone().acquire_owned() => Ok(slot.expect("slot semaphores are never closed")),
                }
            })
            .await;
            shared.releasable.lock().expect("releasable lock").remove(task_id);
            match waited {
                Ok(slot) => slot,
                Err(turn) => {
                    shared.queued.lock().expect("queued lock").remove(task_id);
                    return turn;
                }
            }
        }
    };
    // Known as queued until `execute` lists it as active, so a cancel arriving between finds it.
    Turn::Run(slot, (trigger, cancel))
}

/// Counts a task as waiting for a slot while it lives.
struct Waiting<'a>(&'a std::sync::atomic::AtomicU32);

impl<'a> Waiting<'a> {
    fn enter(count: &'a std::sync::atomic::AtomicU32) -> Waiting<'a> {
        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Waiting(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Fault injection for crash tests: `FLOWMESH_FAILPOINT=<name>` makes the process die at once
/// (SIGKILL to itself, no cleanup) when it reaches the named point.
pub(crate) fn failpoint(name: &str) {
    static FAILPOINT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    if FAILPOINT.get_or_init(|| std::env::var("FLOWMESH_FAILPOINT").ok()).as_deref() == Some(name) {
        warn!(failpoint = name, "failpoint reached; killing this process");
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}

fn task_ref(order: &WorkOrder) -> TaskRef {
    TaskRef {
        workflow_id: order.workflow_id.clone(),
        task_id: order.task_id.clone(),
        stage: order.stage.clone(),
        attempt: order.attempt,
    }
}

/// Runs one task to its terminal event (not yet published).
async fn execute(
    shared: &Arc<Shared>,
    order: &Arc<WorkOrder>,
    message: &jetstream::Message,
    (trigger, cancel): (Arc<Trigger>, Shutdown),
) -> Event {
    let worker_id = shared.config.worker_id.clone();
    let started_at = clock::now_rfc3339();
    // Opened once the start is sent (or known not to be): updates come after it.
    let (start_gate, start_gate_rx) = tokio::sync::oneshot::channel::<()>();
    let handed_back = Arc::new(std::sync::atomic::AtomicBool::new(false));
    shared.active.lock().expect("active lock").insert(
        order.task_id.clone(),
        Active { cancel: trigger, service: uses_service_slot(&order.task_type), handed_back: handed_back.clone() },
    );
    shared.queued.lock().expect("queued lock").remove(&order.task_id);
    let work_dir = shared.config.results_dir.join(&order.task_id);
    let output_dir = work_dir.join("output");
    let runners = shared.runners();
    let executors: Vec<&Executor> = shared.executors.iter().chain(runners.iter()).collect();
    let executor = select_executor(&executors, order);
    let uses_files = executor.as_ref().map_or(true, |e| e.uses_files());
    let at_once = executor.as_ref().is_ok_and(|e| e.answers_at_once());
    // Executors report progress on a channel; it becomes `task.updated` events, in order, after
    // the start. One that answers at once sends none, and gets no forwarder.
    let (updates_tx, forwarder) = if at_once {
        (None, None)
    } else {
        let (updates_tx, mut updates_rx) = tokio::sync::mpsc::unbounded_channel::<executor::Update>();
        let shared = shared.clone();
        let task = task_ref(order);
        let worker_id = worker_id.clone();
        let forwarder = tokio::spawn(async move {
            let _ = start_gate_rx.await;
            let mut n = 0u64;
            while let Some(update) = updates_rx.recv().await {
                let body = EventBody::TaskUpdated(TaskUpdated {
                    task: task.clone(),
                    worker_id: worker_id.clone(),
                    message: update.message,
                    data: update.data,
                });
                // Progress only: a stopping worker that gives up on it loses nothing it must keep.
                let _ = shared.report(&Event::new(body, clock::now_rfc3339(), n)).await;
                n += 1;
            }
        });
        (Some(updates_tx), Some(forwarder))
    };
    let task_updates = updates_tx.clone();
    let outcome = async {
        let executor = executor.map_err(ExecError::Permanent)?;
        if uses_files {
            prepare_dirs(&work_dir, &output_dir)
                .map_err(|e| ExecError::Retryable(format!("preparing {}: {e}", work_dir.display())))?;
            Box::pin(fetch_inputs(shared, order, &work_dir)).await?;
        }
        let ctx = TaskContext {
            order: Arc::clone(order),
            work_dir: work_dir.clone(),
            output_dir: output_dir.clone(),
            gpus: shared.probe.hardware.gpus.clone(),
            cancel,
            max_runtime: order.spec.get("maxRuntimeSeconds").and_then(Value::as_u64).map(Duration::from_secs),
            updates: task_updates,
        };
        if uses_files {
            let running =
                tail_logs(&shared.client, &shared.config.worker_id, &order.task_id, &work_dir, executor.run(&ctx));
            Box::pin(with_progress(message, shared.config.ack_wait, running)).await
        } else if at_once {
            executor.run(&ctx).await
        } else {
            Box::pin(with_progress(message, shared.config.ack_wait, executor.run(&ctx))).await
        }
    };
    // A task that completes within `START_REPORT_DELAY` reports no `task.started`: its
    // completion carries `started_at`. Any other is reported started first; that start's ack is
    // taken while the task runs (one task, no spawn), and it is stored before the end is reported.
    // What only a longer task does is boxed (see `Executor::run`): an echo's task stays small.
    tokio::pin!(outcome);
    let early = tokio::time::timeout(START_REPORT_DELAY, &mut outcome).await;
    let (outcome, start_reported) = match early {
        Ok(Ok(result)) => {
            drop(start_gate);
            (Ok(result), false)
        }
        early => {
            Box::pin(async {
                let task = TaskStarted { task: task_ref(order), worker_id: worker_id.clone() };
                let started = Event::new(EventBody::TaskStarted(task), started_at.clone(), 0);
                let start = publish::send_event(&shared.handles.js, &started, Author::Worker(&worker_id)).await.ok();
                let _ = start_gate.send(());
                let start_stored = async {
                    match start {
                        Some(start) => start.stored(&shared.handles.js).await.is_ok(),
                        None => false,
                    }
                };
                let (outcome, start_stored) = match early {
                    Ok(ended) => (ended, start_stored.await),
                    Err(_) => tokio::join!(outcome, start_stored),
                };
                if !start_stored {
                    // The terminal report (journalled) carries `started_at`; a start given up on by a
                    // stopping worker is not needed to fold the task's end.
                    let _ = shared.report(&started).await;
                }
                (outcome, true)
            })
            .await
        }
    };
    drop(updates_tx);
    if let Some(forwarder) = forwarder {
        let _ = forwarder.await;
    }
    let storing = std::time::Instant::now();
    if uses_files {
        Box::pin(store_logs(shared, order, &work_dir)).await;
    }
    let task = task_ref(order);
    let outcome_name = match &outcome {
        Ok(_) => "completed",
        Err(ExecError::Cancelled) => "cancelled",
        Err(_) => "failed",
    };
    metrics::counter!("flowmesh_tasks_total", "task_type" => order.task_type.clone(), "outcome" => outcome_name)
        .increment(1);
    let outcome = match outcome {
        Ok(result) => match store_results(shared, order, uses_files.then_some((&work_dir, &output_dir)), &result).await
        {
            Ok(stored) => Outcome::Completed(Completion {
                result: stored.inline.then_some(result),
                result_object: stored.result_object,
                artifacts: stored.artifacts,
                upload_ms: Some(storing.elapsed().as_millis() as u64),
                started_at: (!start_reported).then_some(started_at),
            }),
            Err(StoreError::Missing(name)) => Outcome::MissingArtifact(name),
            Err(StoreError::Upload(message)) => Outcome::UploadFailed(message),
        },
        Err(ExecError::Cancelled) => {
            Outcome::Cancelled { handed_back: handed_back.load(std::sync::atomic::Ordering::SeqCst) }
        }
        Err(ExecError::TimedOut(limit)) => Outcome::TimedOut { limit_secs: limit.as_secs() },
        Err(ExecError::Retryable(message)) => Outcome::Failed { message, retryable: true },
        Err(ExecError::Permanent(message)) => Outcome::Failed { message, retryable: false },
    };
    let body = work::report(task, &worker_id, outcome);
    {
        let mut active = shared.active.lock().expect("active lock");
        active.remove(&order.task_id);
        if active.is_empty() {
            *shared.idle_since_ms.lock().expect("idle lock") = Some(clock::now_ms());
        }
    }
    Event::new(body, clock::now_rfc3339(), 0)
}

/// The executor for a work order. An inference task takes an executor that serves the backend
/// the validator's classifier picks (`vllm`, `transformers`): one that lists it, else one that
/// declares no backends (a plugin that picks itself); placement sent it here because one does.
fn select_executor<'a>(executors: &[&'a Executor], order: &WorkOrder) -> Result<&'a Executor, String> {
    let serving: Vec<&Executor> = executors.iter().copied().filter(|e| e.serves(&order.task_type)).collect();
    let Some(first) = serving.first() else {
        return Err(format!("this worker has no executor for task type {:?}", order.task_type));
    };
    if order.task_type != "inference" {
        return Ok(first);
    }
    let backend = flowmesh_domain::validate::inference_backend(&order.spec);
    let Some(name) = backend.name() else { return Ok(first) };
    let lists = |e: &&&Executor| e.backends().iter().any(|b| b == name);
    let undeclared = |e: &&&Executor| e.backends().is_empty();
    serving.iter().find(lists).or_else(|| serving.iter().find(undeclared)).copied().ok_or_else(|| {
        format!("this worker has no executor for the {name:?} inference backend ({} select it)", backend.selected_by())
    })
}

/// Downloads the stored files of each upstream stage named in `spec.inputs` (by default, see
/// `python::input_stages`) into `<work_dir>/inputs/<stage>/`, verifying every digest.
async fn fetch_inputs(shared: &Shared, order: &WorkOrder, work_dir: &Path) -> Result<(), ExecError> {
    for stage in python::input_stages(order) {
        let stage = stage.as_str();
        let inline = order.upstream_results.get(stage);
        let artifacts = match order.upstream_artifacts.get(stage) {
            Some(artifacts) => artifacts.as_slice(),
            None if inline.is_some() => &[],
            None => return Err(ExecError::Permanent(format!("input stage {stage:?} has no stored results"))),
        };
        let dir = work_dir.join("inputs").join(stage);
        std::fs::create_dir_all(&dir).map_err(|e| ExecError::Retryable(format!("creating {}: {e}", dir.display())))?;
        // A stage that stored no files (an echo) passed its result inline.
        if let Some(result) = inline {
            let path = dir.join("results.json");
            std::fs::write(&path, serde_json::to_vec_pretty(result).expect("results serialize"))
                .map_err(|e| ExecError::Retryable(format!("writing {}: {e}", path.display())))?;
        }
        for artifact in artifacts {
            if artifact.name.split('/').any(|p| p == ".." || p.is_empty()) {
                return Err(ExecError::Permanent(format!("upstream artifact {:?} has an unsafe name", artifact.name)));
            }
            let bytes = shared
                .inputs
                .fetch(artifact)
                .await
                .map_err(|e| ExecError::Retryable(format!("fetching input {}: {e}", artifact.name)))?;
            let path = dir.join(&artifact.name);
            if let Some(parent) = path.parent() {
                let _ = std::fs::create_dir_all(parent);
            }
            std::fs::write(&path, &bytes)
                .map_err(|e| ExecError::Retryable(format!("writing {}: {e}", path.display())))?;
        }
    }
    Ok(())
}

/// Publishes what a running task writes to its logs, every half second, on
/// `flowmesh.logs.<task>.<stream>.<worker>`.
async fn tail_logs<T>(
    client: &async_nats::Client,
    worker_id: &str,
    task_id: &str,
    work_dir: &Path,
    work: impl std::future::Future<Output = T>,
) -> T {
    tokio::pin!(work);
    let mut offsets = [0u64; 2];
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            out = &mut work => {
                publish_new_output(client, worker_id, task_id, work_dir, &mut offsets).await;
                return out;
            }
            _ = tick.tick() => publish_new_output(client, worker_id, task_id, work_dir, &mut offsets).await,
        }
    }
}

async fn publish_new_output(
    client: &async_nats::Client,
    worker_id: &str,
    task_id: &str,
    work_dir: &Path,
    offsets: &mut [u64; 2],
) {
    for (i, name) in ["stdout", "stderr"].iter().enumerate() {
        let Ok(bytes) = std::fs::read(work_dir.join(format!("{name}.log"))) else { continue };
        let start = offsets[i] as usize;
        if bytes.len() > start {
            for chunk in bytes[start..].chunks(64 * 1024) {
                let _ = client.publish(subjects::logs(task_id, name, worker_id), chunk.to_vec().into()).await;
            }
            offsets[i] = bytes.len() as u64;
        }
    }
}

/// Stores the task's logs as `<task_id>/logs/stdout.log` and `stderr.log` (best effort).
async fn store_logs(shared: &Shared, order: &WorkOrder, work_dir: &Path) {
    for stream in ["stdout", "stderr"] {
        let path = work_dir.join(format!("{stream}.log"));
        if path.is_file()
            && let Err(e) = put_object(shared, &subjects::log_object(&order.task_id, stream), Source::File(&path)).await
        {
            warn!(error = %e, "could not store {stream}.log");
        }
    }
}

fn prepare_dirs(work_dir: &Path, output_dir: &Path) -> std::io::Result<()> {
    // A new attempt starts from an empty output folder: stale files must not become artifacts.
    if output_dir.exists() {
        std::fs::remove_dir_all(output_dir)?;
    }
    std::fs::create_dir_all(output_dir)?;
    let _ = std::fs::remove_file(work_dir.join("result.json"));
    Ok(())
}

/// Keeps the work message from being redelivered while the task runs.
async fn with_progress<T>(
    message: &jetstream::Message,
    ack_wait: Duration,
    work: impl std::future::Future<Output = T>,
) -> T {
    tokio::pin!(work);
    let mut tick = tokio::time::interval(ack_wait / 3);
    tick.tick().await;
    loop {
        tokio::select! {
            out = &mut work => return out,
            _ = tick.tick() => { let _ = message.ack_with(AckKind::Progress).await; }
        }
    }
}

/// Why results could not be stored: a declared file is missing (the task's fault), or the store
/// did not take them (worth a retry).
enum StoreError {
    Missing(String),
    Upload(String),
}

/// What `store_results` kept where.
struct Stored {
    /// The result goes inline in `task.completed` (it is at most `INLINE_RESULT_BYTES`).
    inline: bool,
    result_object: Option<String>,
    artifacts: Vec<Artifact>,
}

/// Stores a task's result and files as `<task_id>/<path>`. A task with folders (`dirs` = its work
/// and output folder) writes `results.json` locally and stores it with its artifacts. A task
/// without files (an echo) stores nothing when its result fits inline; a larger result is
/// stored as `results.json` from memory.
async fn store_results(
    shared: &Shared,
    order: &WorkOrder,
    dirs: Option<(&Path, &Path)>,
    result: &Value,
) -> Result<Stored, StoreError> {
    let inline = serde_json::to_vec(result).is_ok_and(|b| b.len() <= INLINE_RESULT_BYTES);
    if dirs.is_none() && inline {
        return Ok(Stored { inline, result_object: None, artifacts: Vec::new() });
    }
    let bytes = serde_json::to_vec_pretty(result).expect("results serialize");
    if let Some((work_dir, _)) = dirs {
        let results_path = work_dir.join("results.json");
        std::fs::write(&results_path, &bytes)
            .map_err(|e| StoreError::Upload(format!("writing {}: {e}", results_path.display())))?;
    }
    let result_object = subjects::artifact(&order.task_id, "results.json");
    let (size, digest) = put_object(shared, &result_object, Source::Bytes(&bytes)).await.map_err(StoreError::Upload)?;
    let bucket = Some(shared.config.artifacts_bucket.clone());
    let mut artifacts = vec![Artifact {
        name: "results.json".to_owned(),
        object: result_object.clone(),
        size,
        digest,
        bucket: bucket.clone(),
    }];
    let Some((_, output_dir)) = dirs else {
        return Ok(Stored { inline, result_object: Some(result_object), artifacts });
    };
    // `output.artifacts` names files or folders of the output folder; `results.json` and `logs`
    // are always stored, and `artifacts` (FlowMesh's name for "everything produced") or no list
    // at all means the whole output folder.
    let declared: Option<Vec<String>> =
        flowmesh_domain::pointer::get(&order.spec, "/output/artifacts").and_then(Value::as_array).map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .filter(|n| !matches!(*n, "results.json" | "logs"))
                .map(str::to_owned)
                .collect()
        });
    let everything = declared.as_ref().is_none_or(|names| names.iter().any(|n| n == "artifacts"));
    let files = if everything {
        list_files(output_dir)
    } else {
        let mut files = Vec::new();
        for name in declared.unwrap_or_default() {
            let path = output_dir.join(&name);
            if path.is_dir() {
                files.extend(list_files(output_dir).into_iter().filter(|(rel, _)| Path::new(rel).starts_with(&name)));
            } else if path.is_file() {
                files.push((name, path));
            } else {
                return Err(StoreError::Missing(name));
            }
        }
        files
    };
    for (name, path) in files {
        let object = subjects::artifact(&order.task_id, &name);
        let (size, digest) = put_object(shared, &object, Source::File(&path)).await.map_err(StoreError::Upload)?;
        artifacts.push(Artifact { name, object, size, digest, bucket: bucket.clone() });
    }
    Ok(Stored { inline, result_object: Some(result_object), artifacts })
}

/// What `put_object` stores: a file, or bytes already in memory.
#[derive(Clone, Copy)]
enum Source<'a> {
    File(&'a Path),
    Bytes(&'a [u8]),
}

/// Stores one object in the worker's own store, trying again for a few seconds (a stream
/// electing a leader); a stopping worker gives up at once.
async fn put_object(shared: &Shared, name: &str, source: Source<'_>) -> Result<(u64, String), String> {
    let put = || async {
        let stored = match source {
            Source::File(path) => {
                let mut file = tokio::fs::File::open(path)
                    .await
                    .map_err(|e| Upload::Permanent(format!("reading {}: {e}", path.display())))?;
                shared.artifacts.put(name, &mut file).await
            }
            Source::Bytes(mut bytes) => shared.artifacts.put(name, &mut bytes).await,
        };
        let info = match stored {
            Ok(info) => info,
            // An object of that name existed (an earlier attempt's) and the new one is stored;
            // only the old chunks stay behind where this worker's user may not purge its store
            // (the shared user and the shared store).
            Err(e) if e.kind() == async_nats::jetstream::object_store::PutErrorKind::PurgeOldChunks => {
                tracing::debug!(%name, error = %e, "stored over an earlier object; its chunks stay until `flowmesh streams prune-artifacts` removes them");
                shared.artifacts.info(name).await.map_err(|e| Upload::Transient(e.to_string()))?
            }
            Err(e) => return Err(Upload::Transient(e.to_string())),
        };
        Ok((info.size as u64, info.digest.unwrap_or_default()))
    };
    Box::pin(shared.uploading.retry(&format!("storing {name}"), put, |e| matches!(e, Upload::Transient(_))))
        .await
        .map_err(|gave_up| match gave_up.last {
            Upload::Permanent(why) => why,
            Upload::Transient(why) => format!("storing {name} in {}: {why}", shared.config.artifacts_bucket),
        })
}

/// Why one upload attempt failed: a file that cannot be read stays unreadable; the store may answer
/// next time.
#[derive(Debug)]
enum Upload {
    Permanent(String),
    Transient(String),
}

impl std::fmt::Display for Upload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Upload::Permanent(why) | Upload::Transient(why) => f.write_str(why),
        }
    }
}

/// Every file under `dir`, named by its path relative to `dir`, in a stable order. Links are
/// followed (a task may link a checkpoint into its output folder); a link loop is skipped.
fn list_files(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> = walkdir::WalkDir::new(dir)
        .follow_links(true)
        .into_iter()
        .flatten()
        .filter(|entry| entry.file_type().is_file())
        .filter_map(|entry| {
            let rel = entry.path().strip_prefix(dir).ok()?.to_string_lossy().into_owned();
            Some((rel, entry.into_path()))
        })
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn runner(name: &str, backends: &[&str]) -> Executor {
        Executor::Runner(executor::runner::Runner {
            name: name.to_owned(),
            task_types: vec!["inference".to_owned()],
            backends: backends.iter().map(|b| (*b).to_owned()).collect(),
            python: "python3".to_owned(),
        })
    }

    /// The executor that runs an inference task serves its backend: one that lists it, else one
    /// that declares none; never one that serves another backend only.
    #[test]
    fn inference_runs_on_an_executor_for_its_backend() {
        let hf = runner("transformers", &["transformers"]);
        let vllm = runner("vllm", &["vllm"]);
        let plugin = Executor::Plugin(plugin::Plugin {
            name: "my-server".to_owned(),
            task_types: vec!["inference".to_owned()],
            backends: Vec::new(),
            requires_gpu: false,
            probe: Vec::new(),
            command: vec!["true".to_owned()],
            prewarm: Vec::new(),
        });
        let vllm_spec = json!({"model": {"vllm": {}}});
        let cpu_spec = json!({"enforce_cpu": true});
        let pick = |executors: &[&Executor], spec: &Value| {
            select_executor(executors, &executor::order("inference", spec.clone())).map(|e| e.name().to_owned())
        };
        assert_eq!(pick(&[&hf, &vllm], &vllm_spec).unwrap(), "vllm");
        assert_eq!(pick(&[&vllm, &hf], &cpu_spec).unwrap(), "transformers");
        assert_eq!(pick(&[&hf, &plugin], &vllm_spec).unwrap(), "my-server");
        assert_eq!(pick(&[&vllm, &hf], &json!({})).unwrap(), "vllm", "auto: the first that serves the type");
        let refused = pick(&[&hf], &vllm_spec).unwrap_err();
        assert!(refused.contains("\"vllm\" inference backend"), "{refused}");
        assert!(pick(&[], &cpu_spec).unwrap_err().contains("no executor for task type"));
    }
}
