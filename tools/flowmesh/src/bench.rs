//! `flowmesh bench`: pushes synthetic single-task workflows through a stack, in a burst at a fixed
//! concurrency or at a fixed rate, and measures throughput, latency and the CPU time of every
//! process on this machine; with `raw`, also the bare JetStream round trip on the same server, so
//! the pipeline's figure is read as a ratio to what the server itself can do.
//!
//! Latencies are taken on this process's monotonic clock: the instant before a submission is
//! published, and the instant its `task.started` / workflow end is published, heard on one core
//! subscription per kind it times (never a consumer per workflow: they are a limited server
//! resource).

use crate::{cpu, submit, table, views};
use async_nats::jetstream::{self, consumer, message::PublishMessage, stream};
use flowmesh_domain::fleet::WorkerSnapshot;
use flowmesh_domain::{Event, EventBody};
use flowmesh_nats::connect::NatsOptions;
use flowmesh_nats::{Shutdown, subjects};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::future::IntoFuture;
use std::io::IsTerminal;
use std::time::Duration;
use tokio::time::Instant;

/// The task types a bench can submit: both finish at once, so the figures measure the pipeline
/// (validation, placement, dispatch, reporting), not the work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskKind {
    /// An echo of one item.
    Echo,
    /// A python task whose command is `true`: a real subprocess on the worker.
    Python,
}

impl TaskKind {
    const ALL: [TaskKind; 2] = [TaskKind::Echo, TaskKind::Python];

    pub fn name(self) -> &'static str {
        match self {
            TaskKind::Echo => "echo",
            TaskKind::Python => "python",
        }
    }

    /// How many tasks a document of this kind holds: the bench knows each workflow's size from
    /// what it submits, so it need not read `submission.accepted` to learn it.
    pub fn tasks(self) -> usize {
        1
    }

    /// The document of the `n`-th bench workflow of this kind. The name carries `n` so a workflow
    /// seen in `flowmesh workflow list` can be traced back to its place in the run.
    pub fn document(self, n: usize) -> String {
        let head =
            format!("apiVersion: flowmesh/v1\nmetadata:\n  name: bench-{}-{n}\n  owner: flowmesh-bench\n", self.name());
        let resources = "  resources:\n    hardware:\n      cpu: 1\n      memory: 64Mi\n  maxAttempts: 1\n";
        match self {
            TaskKind::Echo => format!(
                "{head}kind: EchoTask\nspec:\n  taskType: echo\n{resources}  data:\n    type: list\n    items:\n      - bench\n"
            ),
            TaskKind::Python => {
                format!("{head}kind: PythonTask\nspec:\n  taskType: python\n{resources}  command: 'true'\n")
            }
        }
    }
}

/// Why a `--mix` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MixError {
    #[error("no TYPE=WEIGHT pairs: write them like echo=3,python=1")]
    Empty,
    #[error("{entry:?} is not TYPE=WEIGHT: write it like echo=3")]
    NotAPair { entry: String },
    #[error("task type {name:?} is not one a bench submits: use echo or python")]
    UnknownType { name: String },
    #[error("the weight of {name} is {weight:?}: expected a whole number from 1 to 1000")]
    BadWeight { name: String, weight: String },
    #[error("{name} is given twice: give each type once")]
    Duplicate { name: String },
}

/// Task types with their relative weights, in the order given (`echo=3,python=1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mix(Vec<(TaskKind, u32)>);

impl std::str::FromStr for Mix {
    type Err = MixError;

    fn from_str(text: &str) -> Result<Mix, MixError> {
        let mut shares = Vec::new();
        for entry in text.split(',').map(str::trim) {
            if entry.is_empty() {
                continue;
            }
            let (name, weight) = entry.split_once('=').ok_or_else(|| MixError::NotAPair { entry: entry.to_owned() })?;
            let (name, weight) = (name.trim(), weight.trim());
            let kind = TaskKind::ALL
                .into_iter()
                .find(|k| k.name() == name)
                .ok_or_else(|| MixError::UnknownType { name: name.to_owned() })?;
            let bad = || MixError::BadWeight { name: name.to_owned(), weight: weight.to_owned() };
            let weight: u32 = weight.parse().map_err(|_| bad())?;
            if !(1..=1000).contains(&weight) {
                return Err(bad());
            }
            if shares.iter().any(|(k, _)| *k == kind) {
                return Err(MixError::Duplicate { name: name.to_owned() });
            }
            shares.push((kind, weight));
        }
        if shares.is_empty() {
            return Err(MixError::Empty);
        }
        Ok(Mix(shares))
    }
}

impl Mix {
    pub fn kinds(&self) -> Vec<TaskKind> {
        self.0.iter().map(|(k, _)| *k).collect()
    }

    /// The kind of each of `n` tasks, interleaved by smooth weighted round-robin: `echo=3,python=1`
    /// gives echo, echo, python, echo, … so every stretch of the run carries the mix, not only
    /// the whole (a run cut short by its deadline still measured both kinds).
    pub fn schedule(&self, n: usize) -> Vec<TaskKind> {
        let total: i64 = self.0.iter().map(|(_, w)| i64::from(*w)).sum();
        let mut current = vec![0i64; self.0.len()];
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            for (c, (_, w)) in current.iter_mut().zip(&self.0) {
                *c += i64::from(*w);
            }
            // The first of the largest, so equal weights keep the order they were given in.
            let mut best = 0;
            for i in 1..current.len() {
                if current[i] > current[best] {
                    best = i;
                }
            }
            current[best] -= total;
            out.push(self.0[best].0);
        }
        out
    }
}

impl std::fmt::Display for Mix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|(k, w)| format!("{}={w}", k.name())).collect();
        f.write_str(&parts.join(","))
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Workflows to submit, one task each.
    pub tasks: usize,
    /// At most this many workflows between their submission and their end (a burst).
    pub concurrency: usize,
    /// Submissions per second, whatever is in flight (an open loop), instead of the burst.
    pub rate: Option<f64>,
    /// The processes whose CPU time is measured (`cpu::local_processes`, or a dev stack's own).
    pub cpu_of: Vec<cpu::Process>,
    pub mix: Mix,
    /// Also measure the raw JetStream round trip on the same server, through a connection of its
    /// own made with these options (`raw`).
    pub raw: Option<NatsOptions>,
    /// Messages in the raw run (the documents of the mix, repeated): enough that it lasts well
    /// past start-up effects.
    pub raw_messages: usize,
    /// For the whole pipeline run (and, separately, the raw run).
    pub timeout: Duration,
    /// How long to wait for live workers that serve every type of the mix (a fresh stack's
    /// workers need a moment to publish their first snapshot).
    pub fleet_wait: Duration,
    /// Replicas of the temporary raw stream: the product streams' count, for a like-for-like ceiling.
    pub replicas: usize,
    /// Live workers serving the mix to wait for before submitting (a fresh stack's come up one
    /// by one); at least one always.
    pub min_workers: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            tasks: 200,
            concurrency: 16,
            rate: None,
            cpu_of: Vec::new(),
            mix: Mix(vec![(TaskKind::Echo, 3), (TaskKind::Python, 1)]),
            raw: None,
            raw_messages: RAW_MESSAGES,
            timeout: Duration::from_secs(600),
            fleet_wait: Duration::from_secs(10),
            replicas: 1,
            min_workers: 1,
        }
    }
}

/// Latency percentiles in milliseconds (nearest rank: every figure is one that was measured).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    pub samples: usize,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

/// The nearest-rank percentiles of `samples`, or `None` when there are none.
pub fn percentiles(samples: &[f64]) -> Option<Percentiles> {
    let mut sorted: Vec<f64> = samples.iter().copied().filter(|s| !s.is_nan()).collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    let rank = |p: f64| {
        let r = (p / 100.0 * sorted.len() as f64).ceil() as usize;
        sorted[r.clamp(1, sorted.len()) - 1]
    };
    Some(Percentiles { samples: sorted.len(), p50: rank(50.0), p90: rank(90.0), p99: rank(99.0), max: rank(100.0) })
}

/// How the pipeline run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunEnd {
    /// Every workflow ended (completed or failed).
    Finished,
    TimedOut,
    Interrupted,
}

/// One workflow as the bench saw it, in ms from the run's first submission: `flowmesh bench
/// --samples` writes one line of these per workflow, so a tail can be placed in time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub submitted_ms: f64,
    /// `None` when no task of it was seen starting.
    pub to_start_ms: Option<f64>,
    /// `None` when it failed.
    pub to_done_ms: Option<f64>,
}

/// `samples` as CSV with a header, in order of submission; a figure that was not measured is an
/// empty cell.
pub fn samples_csv(samples: &[Sample]) -> String {
    let mut sorted = samples.to_vec();
    sorted.sort_by(|a, b| a.submitted_ms.total_cmp(&b.submitted_ms));
    let cell = |v: Option<f64>| v.map(|v| format!("{v:.3}")).unwrap_or_default();
    let mut out = String::from("submitted_ms,to_start_ms,to_done_ms\n");
    for s in sorted {
        out.push_str(&format!("{:.3},{},{}\n", s.submitted_ms, cell(s.to_start_ms), cell(s.to_done_ms)));
    }
    out
}

/// Where `--samples FILE` puts the timeline of a sweep's run at `percent` of the burst's rate:
/// beside FILE, the percent before its extension (`tail.csv` → `tail-50.csv`).
pub fn point_samples_path(path: &std::path::Path, percent: u8) -> std::path::PathBuf {
    let stem = path.file_stem().map_or_else(|| "samples".into(), |s| s.to_string_lossy().into_owned());
    let name = match path.extension() {
        Some(ext) => format!("{stem}-{percent}.{}", ext.to_string_lossy()),
        None => format!("{stem}-{percent}"),
    };
    path.with_file_name(name)
}

/// Slow starts less than this far apart (by submission time) belong to one stall.
pub const STALL_GAP_MS: f64 = 50.0;

/// When the slowest 1% of a run's starts were submitted: in one or a few stalls (something held
/// everything for a moment; on two cores, most often nats-server collecting garbage) or spread
/// through the run (the pipeline queueing). p99 alone cannot tell the two apart.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SlowStarts {
    /// Workflows whose submit→start was p99 or more.
    pub samples: usize,
    /// The groups they fall into, each a run of them (in submission order) with no gap of
    /// `STALL_GAP_MS` or more.
    pub stalls: usize,
    /// The largest group: when its first was submitted (ms from the run's first submission),
    /// the time from its first submission to its last, and its share of `samples`.
    pub largest_at_ms: f64,
    pub largest_span_ms: f64,
    pub largest_share: f64,
}

/// Where the starts at or above p99 fell in `samples`, or `None` when no start was timed.
pub fn slow_starts(samples: &[Sample]) -> Option<SlowStarts> {
    let timed: Vec<(f64, f64)> =
        samples.iter().filter_map(|s| s.to_start_ms.map(|start| (s.submitted_ms, start))).collect();
    let p99 = percentiles(&timed.iter().map(|(_, start)| *start).collect::<Vec<_>>())?.p99;
    let mut slow: Vec<f64> = timed.iter().filter(|(_, start)| *start >= p99).map(|(at, _)| *at).collect();
    slow.sort_by(f64::total_cmp);
    // Each group as (its first submission, its last, how many).
    let mut groups: Vec<(f64, f64, usize)> = Vec::new();
    for at in &slow {
        match groups.last_mut() {
            Some((_, last, n)) if at - *last < STALL_GAP_MS => (*last, *n) = (*at, *n + 1),
            _ => groups.push((*at, *at, 1)),
        }
    }
    // The first of the largest: `max_by_key` keeps the last of equals, so it walks them backwards.
    let (first, last, n) = groups.iter().rev().copied().max_by_key(|(_, _, n)| *n)?;
    Some(SlowStarts {
        samples: slow.len(),
        stalls: groups.len(),
        largest_at_ms: first,
        largest_span_ms: last - first,
        largest_share: n as f64 / slow.len() as f64,
    })
}

/// A workflow that did not complete, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    /// `None` when the submission itself was not stored.
    pub workflow_id: Option<String>,
    pub reason: String,
}

/// The raw JetStream round trip: publish with acks, consume with a durable pull consumer, ack each.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RawReport {
    /// The temporary stream used (deleted before the report is returned).
    pub stream: String,
    pub messages: usize,
    /// Mean payload size: the bench documents themselves are the payloads.
    pub message_bytes: usize,
    pub wall_ms: f64,
    pub msgs_per_sec: f64,
    pub publish_to_consume_ms: Option<Percentiles>,
    /// How the machine's cores spent the raw run: the efficiency compares two stretches of time,
    /// and the hypervisor may take cores in one and not the other.
    #[serde(default)]
    pub machine: Option<cpu::MachineShare>,
}

/// Everything a run measured; `--json` prints it as is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub tasks: usize,
    pub concurrency: usize,
    /// The submission rate asked for (`--rate`); `None` for a burst.
    #[serde(default)]
    pub rate: Option<f64>,
    pub mix: String,
    /// Tasks of each type in this run.
    pub per_type: BTreeMap<TaskKind, usize>,
    /// Live workers serving the mix when the run began.
    pub workers: usize,
    /// Their batch slots, and the orders they offered to queue beyond them (`prefetch`) at the
    /// run's end, all together: a worker offers its queue as its runs allow.
    #[serde(default)]
    pub batch_slots: u32,
    #[serde(default)]
    pub queue_places: u32,
    pub submitted: usize,
    pub completed: usize,
    pub failed: usize,
    /// Not ended when the run stopped (deadline or interruption), including never submitted.
    pub unfinished: usize,
    pub end: RunEnd,
    /// From the first submission to the last workflow end.
    pub wall_ms: f64,
    /// Completed workflows per second of `wall_ms`.
    pub tasks_per_sec: f64,
    pub submit_to_start_ms: Option<Percentiles>,
    pub submit_to_done_ms: Option<Percentiles>,
    /// When the slowest 1% of starts were submitted (`slow_starts`).
    #[serde(default)]
    pub slow_starts: Option<SlowStarts>,
    /// The first few failures, for a person to start from.
    pub failures: Vec<Failure>,
    pub raw: Option<RawReport>,
    /// The same raw run once more, right after the pipeline's: the machine's speed moves within
    /// seconds, so the ceiling is measured on both sides of what it is compared with.
    #[serde(default)]
    pub raw_after: Option<RawReport>,
    /// `tasks_per_sec / ` the raw ceiling (`raw_ceiling`: the mean of `raw` and `raw_after`).
    pub ratio_to_raw: Option<f64>,
    /// Messages stored during the pipeline run, per stream (sequence growth, so work-queue and
    /// bucket messages that were since removed or replaced count too).
    #[serde(default)]
    pub stored: BTreeMap<String, u64>,
    /// All of `stored` divided by the completed workflows.
    #[serde(default)]
    pub stored_per_task: Option<f64>,
    /// `tasks_per_sec × stored_per_task ÷` the raw ceiling (`raw_ceiling`): the share of it that
    /// the pipeline's own stored messages reach.
    #[serde(default)]
    pub efficiency: Option<f64>,
    /// CPU milliseconds each measured process used during the pipeline run, per completed
    /// workflow (`Options::cpu_of`).
    #[serde(default)]
    pub cpu_ms_per_task: BTreeMap<String, f64>,
    /// Context switches of each measured process during the pipeline run, per completed
    /// workflow (`cpu::switches`): in a burst many messages share each wake-up, at a steady rate
    /// each pays its own, and this says how many.
    #[serde(default)]
    pub switches_per_task: BTreeMap<String, f64>,
    /// The most memory each measured process has held (`VmHWM`), in MiB, read after the run.
    #[serde(default)]
    pub peak_rss_mib: BTreeMap<String, f64>,
    /// How the whole machine's cores spent the pipeline run (Linux): the share busy, idle and
    /// stolen by a hypervisor, whatever ran; a latency tail with cores stolen is the neighbours'.
    #[serde(default)]
    pub machine: Option<cpu::MachineShare>,
    /// Every ended workflow's timeline (`samples_csv`); not part of `--json`.
    #[serde(skip)]
    pub samples: Vec<Sample>,
}

impl Report {
    /// Every task completed.
    pub fn success(&self) -> bool {
        self.completed == self.tasks && self.failed == 0 && self.unfinished == 0
    }
}

const FAILURES_KEPT: usize = 10;

/// The raw ceiling a pipeline run is compared with: the mean msgs/s of the raw runs before and
/// after it that measured any; `None` when neither did.
pub fn raw_ceiling(before: Option<&RawReport>, after: Option<&RawReport>) -> Option<f64> {
    let measured: Vec<f64> =
        [before, after].into_iter().flatten().map(|r| r.msgs_per_sec).filter(|m| *m > 0.0).collect();
    (!measured.is_empty()).then(|| measured.iter().sum::<f64>() / measured.len() as f64)
}

/// Runs the bench against the stack behind `js`; `stop` ends it early (each raw run's stream is
/// still deleted and the report covers what was measured).
pub async fn run(js: &jetstream::Context, options: &Options, stop: Shutdown) -> anyhow::Result<Report> {
    anyhow::ensure!(options.tasks > 0, "--tasks is 0: give at least 1");
    anyhow::ensure!(options.concurrency > 0, "--concurrency is 0: give at least 1");
    if let Some(rate) = options.rate {
        anyhow::ensure!(
            rate.is_finite() && rate > 0.0,
            "--rate is {rate}: give a number of submissions per second above 0"
        );
    }
    let fleet = wait_for_fleet(js, &options.mix.kinds(), options.min_workers, options.fleet_wait).await?;
    let kinds = options.mix.schedule(options.tasks);
    let bodies: Vec<Vec<u8>> = kinds.iter().enumerate().map(|(n, k)| k.document(n).into_bytes()).collect();
    let mut per_type = BTreeMap::new();
    for k in &kinds {
        *per_type.entry(*k).or_insert(0) += 1;
    }
    // The raw run goes first: it is short, and a server that cannot hold a file stream fails here
    // before any workflow is submitted.
    let raw_bodies = || -> Vec<Vec<u8>> { bodies.iter().cycle().take(options.raw_messages.max(1)).cloned().collect() };
    let raw_before = match &options.raw {
        Some(connect) => Some(raw(connect, raw_bodies(), options.replicas, options.timeout, stop.clone()).await?),
        None => None,
    };
    let before = stream_sequences(js).await?;
    let cpu_before = cpu::Sample::take(&options.cpu_of);
    let machine_before = cpu::MachineTicks::take();
    let pace = match options.rate {
        Some(per_sec) => Pace::Rate(per_sec),
        None => Pace::Burst(options.concurrency),
    };
    let p = pipeline(js, &bodies, &kinds, pace, options.timeout, stop.clone()).await?;
    let cpu_after = cpu::Sample::take(&options.cpu_of);
    let (cpu_used, switched) = (cpu_after.since(&cpu_before), cpu_after.switches_since(&cpu_before));
    let machine = cpu::MachineTicks::share_since(machine_before);
    let peak_rss_mib = cpu::peak_rss(&options.cpu_of);
    // The bench hears each end as it is published, before the stream has stored it: count only
    // once the workers have acked every order, which each does after its end was stored.
    workers_settled(js, &fleet, SETTLE_WAIT).await;
    let after = stream_sequences(js).await?;
    let queue_places = offered_queue(js, &fleet).await?;
    // The ceiling again, now that the pipeline has run (not after an interrupted or timed-out
    // run: its figures compare with nothing). Interrupted during it, the report keeps what was
    // measured, compared with the ceiling before.
    let raw_after = match &options.raw {
        Some(connect) if matches!(p.end, RunEnd::Finished) => {
            match raw(connect, raw_bodies(), options.replicas, options.timeout, stop.clone()).await {
                Ok(measured) => Some(measured),
                Err(_) if stop.is_set() => None,
                Err(e) => return Err(e.context("the raw round trip after the pipeline")),
            }
        }
        _ => None,
    };
    let stored: BTreeMap<String, u64> = after
        .iter()
        .map(|(name, seq)| (name.clone(), seq.saturating_sub(before.get(name).copied().unwrap_or(0))))
        .collect();
    let stored_per_task = (p.completed > 0).then(|| stored.values().sum::<u64>() as f64 / p.completed as f64);
    let wall_secs = p.last_end.saturating_duration_since(p.begin).as_secs_f64();
    let tasks_per_sec = if wall_secs > 0.0 { p.completed as f64 / wall_secs } else { 0.0 };
    let ratio_to_raw = raw_ceiling(raw_before.as_ref(), raw_after.as_ref()).map(|ceiling| tasks_per_sec / ceiling);
    let efficiency = ratio_to_raw.zip(stored_per_task).map(|(ratio, per_task)| ratio * per_task);
    let cpu_ms_per_task = per_task(cpu_used, p.completed);
    let switches_per_task = per_task(switched.into_iter().map(|(name, n)| (name, n as f64)), p.completed);
    Ok(Report {
        tasks: options.tasks,
        concurrency: options.concurrency,
        rate: options.rate,
        mix: options.mix.to_string(),
        per_type,
        workers: fleet.len(),
        batch_slots: fleet.iter().map(|w| w.slots.batch.total).sum(),
        queue_places,
        submitted: p.submitted,
        completed: p.completed,
        failed: p.failures.len(),
        unfinished: options.tasks - p.completed - p.failures.len(),
        end: p.end,
        wall_ms: wall_secs * 1000.0,
        tasks_per_sec,
        submit_to_start_ms: percentiles(&p.to_start),
        submit_to_done_ms: percentiles(&p.to_done),
        slow_starts: slow_starts(&p.samples),
        failures: p.failures.into_iter().take(FAILURES_KEPT).collect(),
        raw: raw_before,
        raw_after,
        ratio_to_raw,
        stored,
        stored_per_task,
        efficiency,
        cpu_ms_per_task,
        switches_per_task,
        peak_rss_mib,
        machine,
        samples: p.samples,
    })
}

/// The last sequence of every stream the product stores messages in (streams, buckets, the
/// object stores: the shared one and each worker's), by name.
async fn stream_sequences(js: &jetstream::Context) -> anyhow::Result<BTreeMap<String, u64>> {
    let mut sequences = BTreeMap::new();
    for name in flowmesh_nats::artifacts::product_streams(js).await? {
        // The lookup reads the stream's info, sequences included.
        let stream = js.get_stream(&name).await.map_err(|e| anyhow::anyhow!("stream {name}: {e}"))?;
        let last = stream.cached_info().state.last_sequence;
        sequences.insert(name, last);
    }
    Ok(sequences)
}

/// The longest the bench waits, after the last end it heard, for the workers to ack their orders.
const SETTLE_WAIT: Duration = Duration::from_secs(5);

/// Waits, at most `wait`, until none of `fleet`'s consumers holds an order unacked or undelivered.
/// A worker acks an order only once the stream has stored its end, so after the run's last end
/// was heard this is when every stored message of the run is in the counters. Before, the
/// counters were read at once and missed the ends still on their way into the stream (115 of a
/// 15,000 burst's 45,000 events, with deep worker queues). Where a consumer cannot be read (a
/// user without the right, a worker gone), that worker is not waited for.
async fn workers_settled(js: &jetstream::Context, fleet: &[WorkerSnapshot], wait: Duration) {
    let deadline = Instant::now() + wait;
    for stream_name in [subjects::EVENTS_STREAM, subjects::WORK_STREAM] {
        let Ok(stream) = js.get_stream(stream_name).await else { continue };
        for worker in fleet {
            let name = subjects::work_consumer(&worker.id);
            while let Ok(info) = stream.consumer_info(&name).await {
                if (info.num_ack_pending == 0 && info.num_pending == 0) || Instant::now() >= deadline {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
}

/// Waits until live workers serve every kind of the mix; returns the live workers that serve one.
async fn wait_for_fleet(
    js: &jetstream::Context,
    kinds: &[TaskKind],
    min_workers: usize,
    wait: Duration,
) -> anyhow::Result<Vec<WorkerSnapshot>> {
    let deadline = Instant::now() + wait;
    loop {
        let live: Vec<_> = views::workers(js).await?.into_iter().filter(|(w, age)| *age <= w.ttl_sec).collect();
        let serves = |k: &TaskKind| live.iter().any(|(w, _)| w.supported_task_types.iter().any(|t| t == k.name()));
        let missing: Vec<&str> = kinds.iter().filter(|k| !serves(k)).map(|k| k.name()).collect();
        let serving: Vec<&WorkerSnapshot> = live
            .iter()
            .map(|(w, _)| w)
            .filter(|w| kinds.iter().any(|k| w.supported_task_types.iter().any(|t| t == k.name())))
            .collect();
        let useful = serving.len();
        if missing.is_empty() && useful >= min_workers {
            return Ok(serving.into_iter().cloned().collect());
        }
        if missing.is_empty() && Instant::now() >= deadline {
            anyhow::bail!("{useful} of the {min_workers} workers asked for came up within {}s", wait.as_secs());
        }
        if Instant::now() >= deadline {
            anyhow::bail!(
                "no live worker serves task type(s) {} ({} live worker(s) in {}); drop them from --mix, or start a \
                 worker that can run them (python needs python3 on the worker's PATH)",
                missing.join(", "),
                live.len(),
                subjects::WORKERS_BUCKET
            );
        }
        // Polling a KV bucket while a fresh stack's workers come up; a CLI wait, not a test's.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The queue places the measured workers offer now, all together, as their latest snapshots
/// say (one that is gone counts as it was at the start).
async fn offered_queue(js: &jetstream::Context, fleet: &[WorkerSnapshot]) -> anyhow::Result<u32> {
    let now = views::workers(js).await?;
    Ok(fleet.iter().map(|w| now.iter().find(|(n, _)| n.id == w.id).map_or(w.prefetch, |(n, _)| n.prefetch)).sum())
}

/// What the event follower saw happen to a workflow, and when it saw it.
#[derive(Debug)]
struct Seen {
    workflow_id: String,
    what: Outcome,
    at: Instant,
}

#[derive(Debug, PartialEq)]
enum Outcome {
    /// The task started this many ms before the bench saw the event (0 for `task.started`; for a
    /// task that completed before its start was due, the time from its `started_at` to its end).
    Started {
        before_ms: f64,
    },
    /// One of the workflow's tasks completed or was skipped: the workflow has completed when
    /// all of them have (nobody stores that `workflow.completed`; readers derive it with the fold,
    /// `State::apply_deriving`). The bench counts ends against the number of tasks it submitted
    /// instead of folding, so it holds a number per workflow in flight, not a second copy of the
    /// router's state; its own workflows are never cancelled, and the stream keeps one end per
    /// task attempt. Named by its task, so a repeated report counts once.
    TaskEnded {
        task_id: String,
    },
    Failed(String),
}

/// What an event reports of a workflow, if it is one the bench times: a completion that carries
/// its start reports both.
fn outcomes(event: &Event) -> Vec<(String, Outcome)> {
    let (wf, what) = match &event.body {
        EventBody::TaskStarted(e) => (&e.task.workflow_id, Outcome::Started { before_ms: 0.0 }),
        EventBody::TaskCompleted(e) => {
            let mut seen = Vec::with_capacity(2);
            if let Some(started) = e.started_at.as_deref() {
                let started = flowmesh_domain::trace::unix_ms(started);
                let ended = flowmesh_domain::trace::unix_ms(&event.time);
                let before_ms = started.zip(ended).map_or(0.0, |(s, e)| e.saturating_sub(s) as f64);
                seen.push((e.task.workflow_id.clone(), Outcome::Started { before_ms }));
            }
            seen.push((e.task.workflow_id.clone(), Outcome::TaskEnded { task_id: e.task.task_id.clone() }));
            return seen;
        }
        EventBody::TaskSkipped(e) => (&e.task.workflow_id, Outcome::TaskEnded { task_id: e.task.task_id.clone() }),
        EventBody::WorkflowFailed(e) => {
            (&e.workflow_id, Outcome::Failed(format!("failed: {}", e.reason.as_deref().unwrap_or("no reason given"))))
        }
        EventBody::WorkflowCancelled(e) => (&e.workflow_id, Outcome::Failed("cancelled".to_owned())),
        EventBody::SubmissionRejected(e) => (
            &e.workflow_id,
            Outcome::Failed(format!(
                "rejected: {}",
                e.errors.first().map(ToString::to_string).unwrap_or_else(|| "no problem listed".to_owned())
            )),
        ),
        _ => return Vec::new(),
    };
    vec![(wf.clone(), what)]
}

/// The kinds `outcomes` looks at. Not `submission.accepted`: the bench knows how many tasks each
/// of its workflows holds, so an accepted submission tells it nothing.
const TIMED: [&str; 6] =
    ["submission.rejected", "task.started", "task.completed", "task.skipped", "workflow.failed", "workflow.cancelled"];

/// Hears the events the bench times as they are published, feeding `Seen`s: one core
/// subscription per kind in `TIMED` (`subjects::events_of_kind`), none of them a JetStream
/// consumer. The server matches a core subscription when a message comes in, so it sends the
/// bench only these events (of a one-task echo workflow's three, the completion: about a fifth
/// of their bytes) without reading the stream for them. An ordered consumer over every event had it deliver the
/// acceptance and the dispatch, each carrying the workflow or its order, for nothing; one
/// filtered on these kinds made it walk its index of every subject of the stream while holding
/// its writes (BENCHMARKS, "Eleventh round"). That these ends are stored is what the workers
/// guarantee (an order is acked only once its end is) and the stream counters count; a worker that
/// repeats an end it could not store is heard twice, which `Flight::ended` absorbs.
async fn follow_outcomes(
    js: &jetstream::Context,
) -> anyhow::Result<(tokio::sync::mpsc::Receiver<Seen>, tokio::task::JoinHandle<()>)> {
    let client = js.client();
    let mut kinds = Vec::with_capacity(TIMED.len());
    for kind in TIMED {
        let subject = subjects::events_of_kind(kind);
        kinds.push(client.subscribe(subject.clone()).await.map_err(|e| anyhow::anyhow!("following {subject}: {e}"))?);
    }
    // Subscribed on the server before the first submission, so no end of ours is missed.
    client.flush().await.map_err(|e| anyhow::anyhow!("following the event log: {e}"))?;
    // The server sends one connection's messages in the order they were published, and the
    // merged subscriptions are polled in the order they were woken, so a task's start (stored
    // before its end) is seen before its end; were it not, the workflow would only lack a start
    // time (the bench integration test asserts every start).
    let mut messages = futures_util::stream::select_all(kinds);
    let (tx, rx) = tokio::sync::mpsc::channel(4096);
    let task = tokio::spawn(async move {
        while let Some(message) = messages.next().await {
            let at = Instant::now();
            let suffix = subjects::event_suffix(&message.subject).unwrap_or_default();
            let Ok(event) = Event::read(suffix, &message.payload) else { continue };
            for (workflow_id, what) in outcomes(&event) {
                if tx.send(Seen { workflow_id, what, at }).await.is_err() {
                    return;
                }
            }
        }
    });
    Ok((rx, task))
}

/// A workflow between its submission and its end.
struct Flight {
    submitted_at: Instant,
    /// Submit→start of its first task to start, once seen.
    to_start_ms: Option<f64>,
    /// Tasks not yet ended (`Outcome::TaskEnded`).
    tasks_left: usize,
    /// The tasks that ended while others had not: a report heard twice (a worker repeats one
    /// whose store it could not confirm) counts once.
    ended: Vec<String>,
}

struct Pipeline {
    submitted: usize,
    completed: usize,
    failures: Vec<Failure>,
    to_start: Vec<f64>,
    to_done: Vec<f64>,
    samples: Vec<Sample>,
    /// When the first workflow was submitted.
    begin: Instant,
    /// When the last workflow ended: the wall time stops here, not when the follower is closed.
    last_end: Instant,
    end: RunEnd,
}

impl Pipeline {
    /// Nothing submitted yet, at `begin`.
    fn new(begin: Instant) -> Pipeline {
        Pipeline {
            submitted: 0,
            completed: 0,
            failures: Vec::new(),
            to_start: Vec::new(),
            to_done: Vec::new(),
            samples: Vec::new(),
            begin,
            last_end: begin,
            end: RunEnd::Finished,
        }
    }

    /// Records one outcome of a workflow of ours; returns whether the workflow ended.
    fn settle(&mut self, flight: &mut Flight, workflow_id: &str, what: Outcome, at: Instant) -> bool {
        let elapsed = ms(at.saturating_duration_since(flight.submitted_at));
        let sample = |flight: &Flight, to_done_ms| Sample {
            submitted_ms: ms(flight.submitted_at.saturating_duration_since(self.begin)),
            to_start_ms: flight.to_start_ms,
            to_done_ms,
        };
        match what {
            Outcome::Started { before_ms } if flight.to_start_ms.is_none() => {
                let to_start = (elapsed - before_ms).max(0.0);
                flight.to_start_ms = Some(to_start);
                self.to_start.push(to_start);
                false
            }
            Outcome::Started { .. } => false,
            Outcome::TaskEnded { task_id } => {
                if flight.ended.contains(&task_id) {
                    return false;
                }
                flight.tasks_left = flight.tasks_left.saturating_sub(1);
                if flight.tasks_left > 0 {
                    flight.ended.push(task_id);
                    return false;
                }
                self.completed += 1;
                self.to_done.push(elapsed);
                self.samples.push(sample(flight, Some(elapsed)));
                self.last_end = self.last_end.max(at);
                true
            }
            Outcome::Failed(reason) => {
                self.samples.push(sample(flight, None));
                self.failures.push(Failure { workflow_id: Some(workflow_id.to_owned()), reason });
                self.last_end = self.last_end.max(at);
                true
            }
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// How submissions are paced.
#[derive(Debug, Clone, Copy)]
enum Pace {
    /// As fast as `n` in flight allow: the throughput figure.
    Burst(usize),
    /// This many per second whatever is in flight (an open loop): latency at a given load.
    Rate(f64),
}

async fn pipeline(
    js: &jetstream::Context,
    bodies: &[Vec<u8>],
    kinds: &[TaskKind],
    pace: Pace,
    timeout: Duration,
    mut stop: Shutdown,
) -> anyhow::Result<Pipeline> {
    let (mut seen, follower) = follow_outcomes(js).await?;
    let total = bodies.len();
    let begin = Instant::now();
    let mut p = Pipeline::new(begin);
    let mut in_flight: HashMap<String, Flight> = HashMap::new();
    // Events that arrived before their submission's ack told us the workflow id (or that belong
    // to someone else's workflow on a shared stack).
    let mut early: HashMap<String, Vec<(Outcome, Instant)>> = HashMap::new();
    let mut submits = FuturesUnordered::new();
    let mut next = 0;
    let deadline = begin + timeout;
    let mut progress = tokio::time::interval(Duration::from_secs(1));
    let show_progress = std::io::stderr().is_terminal();

    // Missed ticks fire at once: a rate above the timer's resolution is kept on average.
    let mut ticks = match pace {
        Pace::Rate(per_sec) => {
            let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / per_sec));
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            Some(ticks)
        }
        Pace::Burst(_) => None,
    };
    // The `n`-th workflow, with the number of tasks it holds.
    let submit_one = |n: usize| {
        let (js, body, tasks) = (js.clone(), bodies[n].clone(), kinds[n].tasks());
        async move {
            let submitted_at = Instant::now();
            (submitted_at, tasks, submit::submit(&js, body, None).await)
        }
    };

    loop {
        if let Pace::Burst(concurrency) = pace {
            while next < total && submits.len() + in_flight.len() < concurrency {
                submits.push(submit_one(next));
                next += 1;
            }
        }
        if next == total && submits.is_empty() && in_flight.is_empty() {
            break;
        }
        let tick = async {
            match ticks.as_mut() {
                Some(ticks) => ticks.tick().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tick, if next < total => {
                submits.push(submit_one(next));
                next += 1;
            }
            Some((submitted_at, tasks_left, result)) = submits.next(), if !submits.is_empty() => match result {
                Ok((workflow_id, _)) => {
                    p.submitted += 1;
                    let mut flight = Flight { submitted_at, to_start_ms: None, tasks_left, ended: Vec::new() };
                    let mut ended = false;
                    for (what, at) in early.remove(&workflow_id).unwrap_or_default() {
                        ended |= p.settle(&mut flight, &workflow_id, what, at);
                    }
                    if !ended {
                        in_flight.insert(workflow_id, flight);
                    }
                }
                Err(e) => {
                    p.failures.push(Failure { workflow_id: None, reason: format!("submission not stored: {e:#}") });
                    p.last_end = p.last_end.max(Instant::now());
                }
            },
            event = seen.recv() => {
                let Some(Seen { workflow_id, what, at }) = event else {
                    anyhow::bail!("the event follower stopped: its connection to NATS closed");
                };
                match in_flight.get_mut(&workflow_id) {
                    Some(flight) => {
                        if p.settle(flight, &workflow_id, what, at) {
                            in_flight.remove(&workflow_id);
                        }
                    }
                    None => early.entry(workflow_id).or_default().push((what, at)),
                }
            }
            _ = tokio::time::sleep_until(deadline) => {
                p.end = RunEnd::TimedOut;
                break;
            }
            _ = stop.wait() => {
                p.end = RunEnd::Interrupted;
                break;
            }
            _ = progress.tick(), if show_progress => {
                let ended = p.completed + p.failures.len();
                eprint!("\rbench: {ended}/{total} ended, {} in flight, {} failed   ", in_flight.len() + submits.len(), p.failures.len());
            }
        }
    }
    if show_progress {
        eprintln!();
    }
    follower.abort();
    Ok(p)
}

/// A name part unique to this run, usable in a subject token and a stream name.
fn nonce() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    format!("{:x}{:x}", std::process::id(), nanos)
}

/// The header carrying a raw message's index, so the consumer can time it against its publish.
const RAW_INDEX_HEADER: &str = "Flowmesh-Bench-Index";

/// The raw run's default size (`--raw-messages`).
pub const RAW_MESSAGES: usize = 50_000;
/// Publishes (and acks) the raw run keeps in flight: what a pipelined client does.
const RAW_WINDOW: usize = 256;

/// The ceiling is the client's as much as the server's, so it is measured as a plain client
/// would run it: a connection of its own, as a task of a runtime of its own with tokio's
/// defaults. The programs' runtime has no LIFO slot (`flowmesh_nats::cli::serve`), which serves
/// the pipeline's many tasks and costs this one loop of publishes a few percent of its rate:
/// measured on that runtime, the ceiling would be lower and every efficiency higher.
async fn raw(
    connect: &NatsOptions,
    bodies: Vec<Vec<u8>>,
    replicas: usize,
    timeout: Duration,
    stop: Shutdown,
) -> anyhow::Result<RawReport> {
    let connect = connect.clone();
    tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Runtime::new()?;
        // A task of the runtime, not the future its `block_on` runs on the calling thread: every
        // message would be a hand-off to that thread (`flowmesh_nats::cli::serve`).
        runtime.block_on(runtime.spawn(async move {
            let js = jetstream::new(flowmesh_nats::connect::connect(&connect).await?);
            raw_on(&js, &bodies, replicas, timeout, stop).await
        }))?
    })
    .await?
}

/// Creates a temporary file stream, measures the round trip on it, and deletes it whatever happened.
async fn raw_on(
    js: &jetstream::Context,
    bodies: &[Vec<u8>],
    replicas: usize,
    timeout: Duration,
    mut stop: Shutdown,
) -> anyhow::Result<RawReport> {
    let nonce = nonce();
    let name = subjects::bench_raw_stream(&nonce);
    let subject = subjects::bench_raw(&nonce);
    let stream = js
        .create_stream(stream::Config {
            name: name.clone(),
            description: Some("flowmesh bench --raw: temporary, deleted when the measurement ends".to_owned()),
            subjects: vec![subject.clone()],
            // As the product streams: file storage, limits retention, and the deployment's replicas.
            storage: stream::StorageType::File,
            retention: stream::RetentionPolicy::Limits,
            num_replicas: replicas,
            ..Default::default()
        })
        .await
        .map_err(|e| anyhow::anyhow!("could not create the temporary stream {name}: {e}"))?;
    let machine_before = cpu::MachineTicks::take();
    let measured = tokio::select! {
        m = tokio::time::timeout(timeout, raw_round_trip(js, &stream, &subject, bodies, RAW_WINDOW)) => match m {
            Ok(m) => m,
            Err(_) => Err(anyhow::anyhow!("the raw round trip did not finish within {}s", timeout.as_secs())),
        },
        _ = stop.wait() => Err(anyhow::anyhow!("interrupted during the raw round trip")),
    };
    let machine = cpu::MachineTicks::share_since(machine_before);
    let deleted = js.delete_stream(&name).await;
    let (wall, latencies) = measured?;
    deleted.map_err(|e| {
        anyhow::anyhow!("could not delete the temporary stream {name}: {e}; remove it with `nats stream rm {name}`")
    })?;
    let wall_secs = wall.as_secs_f64();
    Ok(RawReport {
        stream: name,
        messages: bodies.len(),
        message_bytes: bodies.iter().map(Vec::len).sum::<usize>() / bodies.len().max(1),
        wall_ms: wall_secs * 1000.0,
        msgs_per_sec: if wall_secs > 0.0 { bodies.len() as f64 / wall_secs } else { 0.0 },
        publish_to_consume_ms: percentiles(&latencies),
        machine,
    })
}

/// Publishes every body with acks (at most `window` unacknowledged) while a durable pull
/// consumer takes them and acks each plainly, as the product's services ack. Returns the wall
/// time from the first publish until the server holds no unacknowledged message, and each
/// message's publish → delivery latency.
async fn raw_round_trip(
    js: &jetstream::Context,
    stream: &stream::Stream,
    subject: &str,
    bodies: &[Vec<u8>],
    window: usize,
) -> anyhow::Result<(Duration, Vec<f64>)> {
    let consumer = stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some("bench".to_owned()),
            ack_policy: consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await
        .map_err(|e| anyhow::anyhow!("creating the raw consumer: {e}"))?;
    let mut messages = consumer.messages().await?;
    let total = bodies.len();
    let begin = Instant::now();

    let produce = async {
        let mut sent_at = Vec::with_capacity(total);
        let mut acks = FuturesUnordered::new();
        for (n, body) in bodies.iter().enumerate() {
            while acks.len() >= window {
                acks.next().await.expect("acks pending")?;
            }
            let publish =
                PublishMessage::build().payload(body.clone().into()).header(RAW_INDEX_HEADER, n.to_string().as_str());
            sent_at.push(Instant::now());
            let ack = js.send_publish(subject.to_owned(), publish).await?;
            acks.push(ack.into_future());
        }
        while let Some(ack) = acks.next().await {
            ack?;
        }
        anyhow::Ok(sent_at)
    };
    let consume = async {
        let mut got_at: Vec<Option<Instant>> = vec![None; total];
        let mut received = 0;
        while received < total {
            let message = match messages.next().await {
                None => anyhow::bail!("the raw consumer ended after {received} of {total}"),
                // A heartbeat that came late on a machine this busy says nothing about the
                // messages, which keep coming: it ended two runs partway (BENCHMARKS, "Thirty-fifth
                // round").
                Some(Err(e)) if matches!(e.kind(), consumer::pull::MessagesErrorKind::MissingHeartbeat) => continue,
                Some(message) => message?,
            };
            let at = Instant::now();
            let index = message
                .headers
                .as_ref()
                .and_then(|h| h.get(RAW_INDEX_HEADER))
                .and_then(|v| v.as_str().parse::<usize>().ok())
                .filter(|i| *i < total)
                .ok_or_else(|| anyhow::anyhow!("a raw message without a valid {RAW_INDEX_HEADER} header"))?;
            // A redelivery (an ack lost to a slow round) is not a second measurement.
            if got_at[index].is_none() {
                got_at[index] = Some(at);
                received += 1;
            }
            message.ack().await.map_err(|e| anyhow::anyhow!("raw ack: {e}"))?;
        }
        anyhow::Ok(got_at)
    };
    let (sent_at, got_at) = tokio::try_join!(produce, consume)?;
    // Plain acks are not confirmed one by one: the run ends when the server has taken them all.
    let mut consumer = consumer;
    let settle = Instant::now();
    loop {
        let info = consumer.info().await?;
        if info.num_ack_pending == 0 && info.num_pending == 0 {
            break;
        }
        anyhow::ensure!(
            settle.elapsed() < Duration::from_secs(30),
            "the raw consumer still has {} unacknowledged and {} undelivered message(s) after the last ack",
            info.num_ack_pending,
            info.num_pending
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let wall = begin.elapsed();
    let latencies = sent_at
        .iter()
        .zip(&got_at)
        .filter_map(|(sent, got)| got.map(|got| ms(got.saturating_duration_since(*sent))))
        .collect();
    Ok((wall, latencies))
}

/// Each process's total divided by the completed workflows; nothing when none completed.
fn per_task(totals: impl IntoIterator<Item = (String, f64)>, completed: usize) -> BTreeMap<String, f64> {
    if completed == 0 {
        return BTreeMap::new();
    }
    totals.into_iter().map(|(name, total)| (name, total / completed as f64)).collect()
}

/// `label`: the processes' sum, then each by name, with `digits` decimals; none without figures.
fn per_process_row(label: &str, figures: &BTreeMap<String, f64>, digits: usize) -> Option<Vec<String>> {
    if figures.is_empty() {
        return None;
    }
    let total: f64 = figures.values().sum();
    let each: Vec<String> = figures.iter().map(|(name, x)| format!("{name} {x:.digits$}")).collect();
    Some(vec![label.to_owned(), format!("{total:.digits$} ({})", each.join(", "))])
}

fn cell(p: Option<&Percentiles>) -> Vec<String> {
    match p {
        Some(p) => vec![
            p.samples.to_string(),
            format!("{:.1}", p.p50),
            format!("{:.1}", p.p90),
            format!("{:.1}", p.p99),
            format!("{:.1}", p.max),
        ],
        None => vec!["0".to_owned(), "-".to_owned(), "-".to_owned(), "-".to_owned(), "-".to_owned()],
    }
}

/// `2 cores: 70% busy, 22% idle, 8% stolen by the hypervisor`.
fn machine_share(m: &cpu::MachineShare) -> String {
    format!(
        "{} cores: {:.0}% busy, {:.0}% idle, {:.0}% stolen by the hypervisor",
        m.cores,
        m.busy * 100.0,
        m.idle * 100.0,
        m.stolen * 100.0
    )
}

/// The report as tables for a person.
pub fn render(r: &Report) -> String {
    let per_type: Vec<String> = r.per_type.iter().map(|(k, n)| format!("{} {n}", k.name())).collect();
    let mut rows = vec![
        vec![
            "tasks".to_owned(),
            match r.rate {
                Some(rate) => format!("{} ({}), {rate:.0} submitted per second", r.tasks, per_type.join(", ")),
                None => format!("{} ({}), concurrency {}", r.tasks, per_type.join(", "), r.concurrency),
            },
        ],
        vec![
            "workers".to_owned(),
            match r.queue_places {
                0 => format!("{} (batch slots {})", r.workers, r.batch_slots),
                queue => format!("{} (batch slots {}, queue places {queue})", r.workers, r.batch_slots),
            },
        ],
        vec!["completed".to_owned(), r.completed.to_string()],
        vec!["failed".to_owned(), r.failed.to_string()],
        vec![
            "unfinished".to_owned(),
            match r.end {
                RunEnd::Finished => r.unfinished.to_string(),
                RunEnd::TimedOut => format!("{} (timed out)", r.unfinished),
                RunEnd::Interrupted => format!("{} (interrupted)", r.unfinished),
            },
        ],
        vec!["wall".to_owned(), format!("{:.2} s", r.wall_ms / 1000.0)],
        vec!["pipeline".to_owned(), format!("{:.1} tasks/s", r.tasks_per_sec)],
    ];
    for (label, raw) in [("", &r.raw), (" after", &r.raw_after)] {
        let Some(raw) = raw else { continue };
        rows.push(vec![
            format!("raw JetStream{label}"),
            format!(
                "{:.1} msgs/s ({} x {} B, publish + consume, acked)",
                raw.msgs_per_sec, raw.messages, raw.message_bytes
            ),
        ]);
        if let Some(m) = &raw.machine {
            rows.push(vec![format!("machine (raw{label})"), machine_share(m)]);
        }
    }
    if let Some(ratio) = r.ratio_to_raw {
        rows.push(vec!["ratio".to_owned(), format!("pipeline = {ratio:.3} × raw")]);
    }
    if let Some(per_task) = r.stored_per_task {
        let streams: Vec<String> = r.stored.iter().filter(|(_, n)| **n > 0).map(|(s, n)| format!("{s} {n}")).collect();
        rows.push(vec!["stored/task".to_owned(), format!("{per_task:.2} ({})", streams.join(", "))]);
    }
    if let Some(efficiency) = r.efficiency {
        rows.push(vec![
            "efficiency".to_owned(),
            format!(
                "{:.1}% of raw (tasks/s × stored/task ÷ raw msgs/s{})",
                efficiency * 100.0,
                if r.raw_after.is_some() { ", the mean of before and after" } else { "" }
            ),
        ]);
    }
    rows.extend(per_process_row("CPU ms/task", &r.cpu_ms_per_task, 3));
    rows.extend(per_process_row("switches/task", &r.switches_per_task, 1));
    if !r.peak_rss_mib.is_empty() {
        let each: Vec<String> = r.peak_rss_mib.iter().map(|(name, mib)| format!("{name} {mib:.0}")).collect();
        rows.push(vec!["peak MiB".to_owned(), each.join(", ")]);
    }
    if let Some(m) = &r.machine {
        rows.push(vec!["machine".to_owned(), machine_share(m)]);
    }
    let mut out = table::render(&["MEASURE", "VALUE"], &rows);
    out.push('\n');
    let mut latency = Vec::new();
    for (label, p) in
        [("submit → start", r.submit_to_start_ms.as_ref()), ("submit → done", r.submit_to_done_ms.as_ref())]
    {
        let mut row = vec![label.to_owned()];
        row.extend(cell(p));
        latency.push(row);
    }
    if let Some(raw) = &r.raw {
        let mut row = vec!["raw publish → consume".to_owned()];
        row.extend(cell(raw.publish_to_consume_ms.as_ref()));
        latency.push(row);
    }
    out.push_str(&table::render(&["LATENCY (ms)", "N", "P50", "P90", "P99", "MAX"], &latency));
    if let Some(slow) = &r.slow_starts {
        out.push_str(&format!("\n{}\n", slow_starts_line(slow)));
    }
    out
}

/// `slow` in words: how many, in how many stalls, and the largest's share, span and time.
fn slow_starts_line(slow: &SlowStarts) -> String {
    let stalls = match slow.stalls {
        1 => "1 stall".to_owned(),
        n => format!("{n} stalls"),
    };
    format!(
        "slowest 1% of starts: {} in {stalls}; the largest holds {:.0}% of them, submitted over {:.0} ms from {:.0} ms into the run",
        slow.samples,
        slow.largest_share * 100.0,
        slow.largest_span_ms,
        slow.largest_at_ms
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowmesh_domain::event::{TaskCompleted, TaskDispatched, TaskRef, TaskSkipped, TaskStarted};

    fn task(workflow: &str, stage: &str) -> TaskRef {
        TaskRef {
            workflow_id: workflow.into(),
            task_id: format!("{workflow}-{stage}"),
            stage: stage.into(),
            attempt: 1,
        }
    }

    fn completed(task: TaskRef, started_at: Option<&str>) -> Event {
        let body = EventBody::TaskCompleted(TaskCompleted {
            task,
            worker_id: "w1".into(),
            result: None,
            result_object: None,
            artifacts: Vec::new(),
            upload_ms: None,
            started_at: started_at.map(str::to_owned),
        });
        Event::new(body, "2026-11-26T00:00:00.250Z".into(), 0)
    }

    #[test]
    fn a_completion_ends_a_task_and_reports_its_start_when_it_carries_one() {
        let started = EventBody::TaskStarted(TaskStarted { task: task("wf-2", "a"), worker_id: "w1".into() });
        let skipped = EventBody::TaskSkipped(TaskSkipped { task: task("wf-3", "b"), reason: "upstream failed".into() });
        let dispatched = EventBody::TaskDispatched(TaskDispatched {
            task: task("wf-4", "a"),
            worker_id: "w1".into(),
            task_type: "echo".into(),
            message: "m".into(),
            order: None,
        });
        let at = |body| Event::new(body, "t".into(), 0);
        // (what, the event, what the bench makes of it: workflow and outcome)
        type Case = (&'static str, Event, Vec<(&'static str, Outcome)>);
        let cases: Vec<Case> = vec![
            (
                "a completion with its start",
                completed(task("wf-1", "a"), Some("2026-11-26T00:00:00.200Z")),
                vec![("wf-1", Outcome::Started { before_ms: 50.0 }), ("wf-1", ended("wf-1-a"))],
            ),
            ("a completion after a stored start", completed(task("wf-1", "a"), None), vec![("wf-1", ended("wf-1-a"))]),
            ("a stored start", at(started), vec![("wf-2", Outcome::Started { before_ms: 0.0 })]),
            ("a skipped task", at(skipped), vec![("wf-3", ended("wf-3-b"))]),
            ("a dispatch is not timed", at(dispatched), vec![]),
        ];
        for (what, event, want) in cases {
            let got = outcomes(&event);
            let want: Vec<(String, Outcome)> = want.into_iter().map(|(w, o)| (w.to_owned(), o)).collect();
            assert_eq!(got, want, "{what}");
        }
    }

    fn ended(task_id: &str) -> Outcome {
        Outcome::TaskEnded { task_id: task_id.to_owned() }
    }

    fn flight(submitted_at: Instant, tasks_left: usize) -> Flight {
        Flight { submitted_at, to_start_ms: None, tasks_left, ended: Vec::new() }
    }

    /// A workflow completes when each of its tasks has ended once; a report heard twice (a
    /// worker repeating one it could not confirm stored) is not another task's end.
    #[test]
    fn a_workflow_completes_at_its_last_task_end_counting_each_task_once() {
        let now = Instant::now();
        let mut p = Pipeline::new(now);
        let mut three = flight(now, 3);
        let ends: Vec<bool> =
            ["a", "a", "b", "b", "c"].into_iter().map(|t| p.settle(&mut three, "wf-1", ended(t), now)).collect();
        assert_eq!(ends, [false, false, false, false, true]);
        assert_eq!((p.completed, p.to_done.len()), (1, 1));
    }

    /// Each ended workflow leaves one sample: when it was submitted, its first start (a later
    /// task's start changes nothing) and its end, or no end when it failed.
    #[test]
    fn an_ended_workflow_leaves_a_sample_of_its_timeline() {
        let begin = Instant::now();
        let at = |ms: u64| begin + Duration::from_millis(ms);
        let mut p = Pipeline::new(begin);
        let mut two_tasks = flight(at(10), 2);
        assert!(!p.settle(&mut two_tasks, "wf-1", Outcome::Started { before_ms: 5.0 }, at(30)));
        assert!(!p.settle(&mut two_tasks, "wf-1", Outcome::Started { before_ms: 0.0 }, at(40)));
        assert!(!p.settle(&mut two_tasks, "wf-1", ended("a"), at(50)));
        assert!(p.settle(&mut two_tasks, "wf-1", ended("b"), at(60)));
        let mut failing = flight(at(20), 1);
        assert!(p.settle(&mut failing, "wf-2", Outcome::Failed("rejected".into()), at(25)));
        let want = [
            Sample { submitted_ms: 10.0, to_start_ms: Some(15.0), to_done_ms: Some(50.0) },
            Sample { submitted_ms: 20.0, to_start_ms: None, to_done_ms: None },
        ];
        assert_eq!(p.samples, want);
        assert_eq!(p.to_start, [15.0]);
    }

    #[test]
    fn samples_are_written_in_order_of_submission_with_empty_cells_for_what_was_not_measured() {
        let samples = [
            Sample { submitted_ms: 2.5, to_start_ms: None, to_done_ms: None },
            Sample { submitted_ms: 1.0, to_start_ms: Some(0.25), to_done_ms: Some(1.5) },
        ];
        let want = "submitted_ms,to_start_ms,to_done_ms\n1.000,0.250,1.500\n2.500,,\n";
        assert_eq!(samples_csv(&samples), want);
        assert_eq!(samples_csv(&[]), "submitted_ms,to_start_ms,to_done_ms\n");
    }

    fn check_mix(text: &str, want: Result<Vec<(TaskKind, u32)>, MixError>) {
        assert_eq!(text.parse::<Mix>().map(|m| m.0), want, "--mix {text:?}");
    }

    #[test]
    fn mix_parsing() {
        use TaskKind::{Echo, Python};
        check_mix("echo=3,python=1", Ok(vec![(Echo, 3), (Python, 1)]));
        check_mix(" python = 2 , echo=1,", Ok(vec![(Python, 2), (Echo, 1)]));
        check_mix("echo=1", Ok(vec![(Echo, 1)]));
        check_mix("", Err(MixError::Empty));
        check_mix(" , ", Err(MixError::Empty));
        check_mix("echo", Err(MixError::NotAPair { entry: "echo".into() }));
        check_mix("ppo=1", Err(MixError::UnknownType { name: "ppo".into() }));
        check_mix("Echo=1", Err(MixError::UnknownType { name: "Echo".into() }));
        check_mix("echo=0", Err(MixError::BadWeight { name: "echo".into(), weight: "0".into() }));
        check_mix("echo=-1", Err(MixError::BadWeight { name: "echo".into(), weight: "-1".into() }));
        check_mix("echo=1.5", Err(MixError::BadWeight { name: "echo".into(), weight: "1.5".into() }));
        check_mix("echo=1001", Err(MixError::BadWeight { name: "echo".into(), weight: "1001".into() }));
        check_mix("echo=", Err(MixError::BadWeight { name: "echo".into(), weight: "".into() }));
        check_mix("echo=1,echo=2", Err(MixError::Duplicate { name: "echo".into() }));
    }

    #[test]
    fn mix_errors_say_what_to_write() {
        let e = "ppo=1".parse::<Mix>().unwrap_err().to_string();
        assert!(e.contains("\"ppo\"") && e.contains("echo or python"), "{e}");
        assert_eq!("python=1,echo=3".parse::<Mix>().unwrap().to_string(), "python=1,echo=3");
    }

    #[test]
    fn schedule_interleaves_by_weight() {
        use TaskKind::{Echo, Python};
        let mix: Mix = "echo=3,python=1".parse().unwrap();
        assert_eq!(mix.schedule(4), vec![Echo, Echo, Python, Echo]);
        let eight = mix.schedule(8);
        assert_eq!(eight.iter().filter(|k| **k == Python).count(), 2);
        // Every window of one full cycle carries the whole mix.
        for window in mix.schedule(40).chunks(4) {
            assert_eq!(window.iter().filter(|k| **k == Echo).count(), 3, "{window:?}");
        }
        let uneven = mix.schedule(10);
        assert_eq!(uneven.iter().filter(|k| **k == Echo).count(), 8, "{uneven:?}");
        assert_eq!("python=1".parse::<Mix>().unwrap().schedule(3), vec![Python; 3]);
        assert_eq!("echo=1,python=1".parse::<Mix>().unwrap().schedule(3), vec![Echo, Python, Echo]);
        assert!(mix.schedule(0).is_empty());
    }

    #[test]
    fn a_sweep_point_s_samples_go_beside_the_burst_s_with_its_percent() {
        for (given, percent, want) in [
            ("tail.csv", 50, "tail-50.csv"),
            ("/tmp/runs/tail.csv", 25, "/tmp/runs/tail-25.csv"),
            ("tail", 90, "tail-90"),
            ("runs/day.1.csv", 50, "runs/day.1-50.csv"),
        ] {
            assert_eq!(
                point_samples_path(std::path::Path::new(given), percent),
                std::path::PathBuf::from(want),
                "{given}"
            );
        }
    }

    fn check_percentiles(samples: &[f64], want: Option<(f64, f64, f64, f64)>) {
        let got = percentiles(samples).map(|p| (p.p50, p.p90, p.p99, p.max));
        assert_eq!(got, want, "samples {samples:?}");
    }

    #[test]
    fn nearest_rank_percentiles() {
        check_percentiles(&[], None);
        check_percentiles(&[7.0], Some((7.0, 7.0, 7.0, 7.0)));
        check_percentiles(&[2.0, 1.0], Some((1.0, 2.0, 2.0, 2.0)));
        let hundred: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        check_percentiles(&hundred, Some((50.0, 90.0, 99.0, 100.0)));
        let ten: Vec<f64> = (1..=10).map(f64::from).collect();
        check_percentiles(&ten, Some((5.0, 9.0, 10.0, 10.0)));
        let thousand: Vec<f64> = (1..=1000).map(f64::from).collect();
        check_percentiles(&thousand, Some((500.0, 900.0, 990.0, 1000.0)));
        check_percentiles(&[3.0, f64::NAN, 1.0], Some((1.0, 3.0, 3.0, 3.0)));
        assert_eq!(percentiles(&[1.0, 2.0, 3.0]).unwrap().samples, 3);
    }

    #[test]
    fn bench_documents_pass_the_validator() {
        for kind in TaskKind::ALL {
            let doc = kind.document(17);
            match flowmesh_domain::validate_submission(doc.as_bytes(), "wf-1") {
                Ok(workflow) => {
                    assert_eq!(workflow.tasks.len(), kind.tasks(), "{doc}");
                    assert_eq!(workflow.tasks[0].task_type, kind.name(), "{doc}");
                }
                Err(problems) => panic!("{} document is invalid: {problems:?}\n{doc}", kind.name()),
            }
        }
    }

    fn raw_report(msgs_per_sec: f64) -> RawReport {
        RawReport {
            stream: "FLOWMESH_BENCH_RAW_x".into(),
            messages: 4,
            message_bytes: 200,
            wall_ms: 1.0,
            msgs_per_sec,
            publish_to_consume_ms: None,
            machine: Some(cpu::MachineShare { cores: 2, busy: 0.9, idle: 0.1, stolen: 0.0 }),
        }
    }

    #[test]
    fn the_slowest_starts_are_grouped_into_stalls_by_when_they_were_submitted() {
        // One submission a millisecond for a second, every start its own figure (no ties), each
        // `slow(n)` one 30 ms. Of 1,000, p99 (nearest rank) is the 990th: 11 are at or above it.
        let run = |slow: &dyn Fn(usize) -> bool| -> Vec<Sample> {
            (0..1000)
                .map(|n| {
                    let start = if slow(n) { 30.0 } else { 1.0 + n as f64 * 1e-4 };
                    Sample { submitted_ms: n as f64, to_start_ms: Some(start), to_done_ms: Some(start) }
                })
                .collect()
        };
        let one_stall = run(&|n| (400..411).contains(&n));
        let two_stalls = run(&|n| (100..104).contains(&n) || (700..707).contains(&n));
        let equal_stalls = run(&|n| (100..105).contains(&n) || (700..705).contains(&n) || n == 900);
        let spread = run(&|n| n % 91 == 0);
        let just_under_the_gap = run(&|n| n % 49 == 0 && n <= 490);
        let at_the_gap = run(&|n| n % 50 == 0 && n <= 500);
        let mut unstarted = one_stall.clone();
        unstarted.iter_mut().for_each(|s| s.to_start_ms = None);
        let stalls = |stalls: usize, at: f64, span: f64, share: f64| {
            Some(SlowStarts { samples: 11, stalls, largest_at_ms: at, largest_span_ms: span, largest_share: share })
        };
        #[rustfmt::skip]
        let cases: Vec<(&str, &[Sample], Option<SlowStarts>)> = vec![
            ("eleven slow in a row", &one_stall, stalls(1, 400.0, 10.0, 1.0)),
            ("four, then seven", &two_stalls, stalls(2, 700.0, 6.0, 7.0 / 11.0)),
            ("two largest alike: the first", &equal_stalls, stalls(3, 100.0, 4.0, 5.0 / 11.0)),
            ("one every 91 ms", &spread, stalls(11, 0.0, 0.0, 1.0 / 11.0)),
            ("gaps of 49 ms join", &just_under_the_gap, stalls(1, 0.0, 490.0, 1.0)),
            ("gaps of STALL_GAP_MS part", &at_the_gap, stalls(11, 0.0, 0.0, 1.0 / 11.0)),
            ("no start timed", &unstarted, None),
            ("nothing", &[], None),
        ];
        for (what, samples, want) in cases {
            assert_eq!(slow_starts(samples), want, "{what}");
        }
        let line = slow_starts_line(&stalls(2, 700.0, 6.0, 7.0 / 11.0).unwrap());
        assert_eq!(
            line,
            "slowest 1% of starts: 11 in 2 stalls; the largest holds 64% of them, submitted over 6 ms from 700 ms into the run"
        );
    }

    #[test]
    fn the_raw_ceiling_is_the_mean_of_the_runs_that_measured_one() {
        let (fast, slow, none) = (raw_report(80_000.0), raw_report(60_000.0), raw_report(0.0));
        let cases: [(Option<&RawReport>, Option<&RawReport>, Option<f64>); 6] = [
            (Some(&fast), Some(&slow), Some(70_000.0)),
            (Some(&slow), Some(&fast), Some(70_000.0)),
            (Some(&fast), None, Some(80_000.0)),
            (None, Some(&slow), Some(60_000.0)),
            (Some(&none), Some(&slow), Some(60_000.0)),
            (Some(&none), None, None),
        ];
        for (before, after, want) in cases {
            assert_eq!(raw_ceiling(before, after), want, "{before:?} / {after:?}");
        }
        assert_eq!(raw_ceiling(None, None), None);
    }

    #[test]
    fn report_renders_the_ratio_to_raw() {
        let p = Percentiles { samples: 3, p50: 1.0, p90: 2.0, p99: 3.0, max: 4.0 };
        let mut report = Report {
            tasks: 4,
            concurrency: 2,
            mix: "echo=3,python=1".into(),
            per_type: BTreeMap::from([(TaskKind::Echo, 3), (TaskKind::Python, 1)]),
            workers: 1,
            batch_slots: 2,
            queue_places: 1,
            submitted: 4,
            completed: 4,
            failed: 0,
            unfinished: 0,
            end: RunEnd::Finished,
            wall_ms: 2000.0,
            tasks_per_sec: 2.0,
            submit_to_start_ms: Some(p),
            submit_to_done_ms: None,
            slow_starts: Some(SlowStarts {
                samples: 2,
                stalls: 1,
                largest_at_ms: 12.0,
                largest_span_ms: 3.0,
                largest_share: 1.0,
            }),
            failures: Vec::new(),
            raw: Some(RawReport { publish_to_consume_ms: Some(p), ..raw_report(4000.0) }),
            raw_after: Some(RawReport {
                machine: Some(cpu::MachineShare { cores: 2, busy: 0.8, idle: 0.2, stolen: 0.0 }),
                ..raw_report(2000.0)
            }),
            ratio_to_raw: Some(0.0005),
            stored: BTreeMap::from([("FLOWMESH_EVENTS".to_owned(), 20)]),
            stored_per_task: Some(5.0),
            efficiency: Some(0.0025),
            rate: None,
            cpu_ms_per_task: BTreeMap::from([("nats-server 7".to_owned(), 0.25), ("flowmesh bench".to_owned(), 0.5)]),
            switches_per_task: BTreeMap::from([("nats-server 7".to_owned(), 30.3), ("flowmesh bench".to_owned(), 6.5)]),
            peak_rss_mib: BTreeMap::from([("nats-server 7".to_owned(), 40.4)]),
            machine: Some(cpu::MachineShare { cores: 2, busy: 0.7, idle: 0.22, stolen: 0.08 }),
            samples: Vec::new(),
        };
        let text = render(&report);
        assert!(text.contains("pipeline = 0.001 × raw"), "{text}");
        assert!(text.contains("0.750 (flowmesh bench 0.500, nats-server 7 0.250)"), "{text}");
        assert!(
            text.lines().any(|l| l.starts_with("switches/task") && l.ends_with("36.8 (flowmesh bench 6.5, nats-server 7 30.3)")),
            "{text}"
        );
        assert!(text.contains("nats-server 7 40"), "{text}");
        assert!(text.contains("2 cores: 70% busy, 22% idle, 8% stolen by the hypervisor"), "{text}");
        assert!(
            text.lines().any(|l| l.starts_with("machine (raw)")
                && l.ends_with("2 cores: 90% busy, 10% idle, 0% stolen by the hypervisor")),
            "{text}"
        );
        assert!(
            text.lines().any(|l| l.starts_with("machine (raw after)")
                && l.ends_with("2 cores: 80% busy, 20% idle, 0% stolen by the hypervisor")),
            "{text}"
        );
        assert!(text.lines().any(|l| l.starts_with("raw JetStream after") && l.contains("2000.0 msgs/s")), "{text}");
        assert!(text.contains("the mean of before and after"), "{text}");
        assert!(text.contains("slowest 1% of starts: 2 in 1 stall;"), "{text}");
        assert_eq!(text.matches("\nwall ").count(), 1, "{text}");
        assert!(text.contains("echo 3, python 1"), "{text}");
        assert!(text.contains("1 (batch slots 2, queue places 1)"), "{text}");
        assert!(text.lines().any(|l| l.starts_with("submit → done") && l.contains(" -")), "{text}");
        assert!(report.success());
        report.unfinished = 1;
        report.completed = 3;
        assert!(!report.success());
        let json = serde_json::to_string(&report).unwrap();
        assert_eq!(serde_json::from_str::<Report>(&json).unwrap(), report);
    }
}
