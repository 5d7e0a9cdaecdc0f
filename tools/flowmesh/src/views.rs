//! Views over the event log and the fleet: workflows, tasks, workers, results.

use crate::table::{self, Row};
use async_nats::jetstream;
use flowmesh_domain::fleet::WorkerSnapshot;
use flowmesh_domain::state::{State, TaskState, TaskStatus, WorkflowState};
use flowmesh_domain::units::format_bytes;
use flowmesh_nats::artifacts::{self, Stores};
use flowmesh_nats::{clock, subjects};
use futures_util::StreamExt;
use std::path::Path;

/// One line of `workflow list` (and of its `--json`): a workflow, or a rejected submission.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct WorkflowRow {
    pub workflow_id: String,
    /// Empty for a rejected submission.
    pub name: String,
    /// A workflow status (`running`, `completed`, …) or `rejected`.
    pub status: String,
    /// Ended tasks of all its tasks: `2/3`.
    pub done: String,
    pub owner: String,
    pub submitted_at: String,
}

impl Row for WorkflowRow {
    const HEADERS: &'static [&'static str] = &["WORKFLOW", "NAME", "STATUS", "DONE", "OWNER", "SUBMITTED"];
    fn cells(&self) -> Vec<String> {
        vec![
            self.workflow_id.clone(),
            self.name.clone(),
            self.status.clone(),
            self.done.clone(),
            self.owner.clone(),
            self.submitted_at.clone(),
        ]
    }
}

/// Every workflow and rejected submission in `state`, in submission order.
pub fn workflow_rows(state: &State) -> Vec<WorkflowRow> {
    let mut rows: Vec<WorkflowRow> = state
        .workflows
        .values()
        .map(|wf| {
            let done = wf.tasks.iter().filter(|t| t.status.is_terminal()).count();
            WorkflowRow {
                workflow_id: wf.workflow_id.clone(),
                name: wf.name.clone(),
                status: wf.status.as_str().to_owned(),
                done: format!("{done}/{}", wf.tasks.len()),
                owner: wf.owner.clone().unwrap_or_default(),
                submitted_at: wf.submitted_at.clone(),
            }
        })
        .chain(state.rejected.values().map(|r| WorkflowRow {
            workflow_id: r.workflow_id.clone(),
            name: String::new(),
            status: "rejected".into(),
            done: "0/0".into(),
            owner: String::new(),
            submitted_at: String::new(),
        }))
        .collect();
    rows.sort_by_key(|row| seq_of(&row.workflow_id));
    rows
}

fn seq_of(workflow_id: &str) -> u64 {
    workflow_id.trim_start_matches("wf-").parse().unwrap_or(0)
}

/// What a person wants to know next to a task's status: why it failed, was skipped or waits.
pub fn task_note(t: &TaskState) -> String {
    let note = t.message.clone().or_else(|| t.reason.clone()).or_else(|| t.pending_message.clone());
    match (&t.merged_into, note) {
        (Some(leader), None) => format!("merged with {leader}"),
        (Some(leader), Some(note)) => format!("merged with {leader}; {note}"),
        (None, note) => note.unwrap_or_default(),
    }
}

/// Tasks as a table.
pub fn task_table(tasks: &[&TaskState]) -> String {
    let rows: Vec<Vec<String>> = tasks
        .iter()
        .map(|t| {
            vec![
                t.def.task_id.clone(),
                t.def.stage.clone(),
                t.def.task_type.clone(),
                t.status.as_str().to_owned(),
                t.attempt.to_string(),
                t.worker_id.clone().unwrap_or_default(),
                task_note(t),
            ]
        })
        .collect();
    table::render(&["TASK", "STAGE", "TYPE", "STATUS", "ATTEMPT", "WORKER", "NOTE"], &rows)
}

pub fn print_workflow(wf: &WorkflowState) {
    println!("{} ({}) {}", wf.workflow_id, table::printable(&wf.name), wf.status.as_str());
    print!("{}", task_table(&wf.tasks.iter().collect::<Vec<_>>()));
}

/// Every snapshot in the workers bucket, with its age in seconds.
pub async fn workers(js: &jetstream::Context) -> anyhow::Result<Vec<(WorkerSnapshot, u64)>> {
    let store = js.get_key_value(subjects::WORKERS_BUCKET).await?;
    let mut keys = store.keys().await?;
    let mut out = Vec::new();
    let now = clock::now_ms();
    while let Some(key) = keys.next().await {
        let key = key?;
        if let Some(entry) = store.entry(&key).await?
            && let Ok(snapshot) = WorkerSnapshot::read(&key, &entry.value)
        {
            out.push((snapshot, now.saturating_sub(clock::unix_ms(entry.created)) / 1000));
        }
    }
    out.sort_by(|a, b| a.0.id.cmp(&b.0.id));
    Ok(out)
}

/// A worker's status with what operators asked of it: `idle`, `busy, cordoned`,
/// `busy, draining (2 running)`, `idle, drained`. For a draining worker `fleet` is the fold of
/// the whole log, which counts the tasks dispatched to or running on it.
pub fn worker_status(w: &WorkerSnapshot, fleet: &State) -> String {
    let mut status = format!("{:?}", w.status).to_lowercase();
    if fleet.draining.contains(&w.id) {
        let running = fleet
            .running_workflows()
            .flat_map(|wf| wf.tasks.iter())
            .filter(|t| t.status.is_on_worker() && t.worker_id.as_deref() == Some(w.id.as_str()))
            .count();
        status += &if running == 0 { ", drained".to_owned() } else { format!(", draining ({running} running)") };
    } else if fleet.cordoned.contains(&w.id) {
        status += ", cordoned";
    }
    status
}

/// One line of `worker list` (and of its `--json`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct WorkerRow {
    pub snapshot: WorkerSnapshot,
    /// Seconds since the snapshot was written; past its `ttl_sec` it is stale.
    pub age_sec: u64,
    pub cordoned: bool,
    pub draining: bool,
    /// As `worker_status` says it.
    pub status: String,
}

/// The rows of `worker list`: each snapshot (with its age) and what operators asked of it.
pub fn worker_rows(workers: Vec<(WorkerSnapshot, u64)>, fleet: &State) -> Vec<WorkerRow> {
    workers
        .into_iter()
        .map(|(snapshot, age_sec)| WorkerRow {
            cordoned: fleet.cordoned.contains(&snapshot.id),
            draining: fleet.draining.contains(&snapshot.id),
            status: worker_status(&snapshot, fleet),
            snapshot,
            age_sec,
        })
        .collect()
}

/// A worker's GPUs for a table cell: how many of each model and size, in the order the probe
/// listed them (`2x NVIDIA H100 80GB HBM3 80 GiB, 1x NVIDIA L40S 48 GiB`); `-` for none.
fn gpu_summary(gpus: &[flowmesh_domain::fleet::Gpu]) -> String {
    let mut kinds: Vec<(&str, u64, usize)> = Vec::new();
    for gpu in gpus {
        match kinds.iter_mut().find(|(name, bytes, _)| *name == gpu.name && *bytes == gpu.memory_bytes) {
            Some((_, _, count)) => *count += 1,
            None => kinds.push((&gpu.name, gpu.memory_bytes, 1)),
        }
    }
    if kinds.is_empty() {
        return "-".to_owned();
    }
    let each: Vec<String> =
        kinds.iter().map(|(name, bytes, count)| format!("{count}x {name} {}", format_bytes(*bytes))).collect();
    each.join(", ")
}

impl Row for WorkerRow {
    const HEADERS: &'static [&'static str] =
        &["WORKER", "STATUS", "TASK TYPES", "HARDWARE", "GPUS", "SLOTS", "SEEN", "SIMULATED", "TAGS"];
    fn cells(&self) -> Vec<String> {
        let (w, age) = (&self.snapshot, self.age_sec);
        let gpus = gpu_summary(&w.hardware.gpus);
        let stale = if age > w.ttl_sec { format!("{age}s (stale)") } else { format!("{age}s") };
        vec![
            w.id.clone(),
            self.status.clone(),
            w.supported_task_types.join(","),
            format!("{} cpu, {}", w.hardware.cpu_cores, format_bytes(w.hardware.memory_bytes)),
            gpus,
            match w.prefetch {
                0 => format!("{}/{}", w.slots.batch.in_use, w.slots.batch.total),
                queue => format!("{}/{}, queue {}/{queue}", w.slots.batch.in_use, w.slots.batch.total, w.queued),
            },
            stale,
            if w.simulated { "yes".into() } else { "no".into() },
            if w.tags.is_empty() { "-".into() } else { w.tags.join(",") },
        ]
    }
}

/// One file `fetch_results` wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// Its path relative to the task (`results.json`, `logs/stdout.log`, `model/adapter.bin`).
    pub name: String,
    pub size: u64,
    /// Downloaded from the object store and checked against its SHA-256 digest; `false` for a
    /// result that traveled inline in its `task.completed` event (nothing was stored).
    pub verified: bool,
}

/// Downloads a task's files into `out`: each file its `task.completed` lists, checked against the
/// digest reported there, and its logs. A task that stored no files (an echo) gets its inline
/// result written as `results.json`; a merged task, the files of the execution it shared.
pub async fn fetch_results(js: &jetstream::Context, task_id: &str, out: &Path) -> anyhow::Result<Vec<Fetched>> {
    let state = crate::log::fold_task(js, task_id).await?;
    let task = state.task(task_id).ok_or_else(|| anyhow::anyhow!("no task {task_id}"))?;
    if let Some(leader) = &task.merged_into {
        return Box::pin(fetch_results(js, leader, out)).await;
    }
    let stores = Stores::new(js);
    let mut fetched = Vec::new();
    for artifact in &task.artifacts {
        if artifact.name.split('/').any(|p| p == ".." || p.is_empty()) {
            anyhow::bail!("artifact {:?} has an unsafe path", artifact.name);
        }
        let bytes = stores.fetch(artifact).await?;
        write_file(&out.join(&artifact.name), &bytes)?;
        fetched.push(Fetched { name: artifact.name.clone(), size: bytes.len() as u64, verified: true });
    }
    for stream in ["stdout", "stderr"] {
        if let Some(bytes) = stored_log(&stores, task, stream).await? {
            let name = format!("logs/{stream}.log");
            write_file(&out.join(&name), &bytes)?;
            fetched.push(Fetched { name, size: bytes.len() as u64, verified: true });
        }
    }
    if fetched.is_empty() {
        if task.status == TaskStatus::Completed
            && task.result_object.is_none()
            && let Some(result) = &task.result
        {
            let bytes = serde_json::to_vec_pretty(result)?;
            write_file(&out.join("results.json"), &bytes)?;
            return Ok(vec![Fetched { name: "results.json".to_owned(), size: bytes.len() as u64, verified: false }]);
        }
        anyhow::bail!("no stored results for task {task_id}");
    }
    Ok(fetched)
}

/// A task's stored `stdout` or `stderr` log, from the store that holds its files (its worker's
/// own); `None` when it has none (yet).
pub async fn stored_log(stores: &Stores, task: &TaskState, stream: &str) -> anyhow::Result<Option<Vec<u8>>> {
    let buckets = artifacts::task_buckets(task.worker_id.as_deref(), &task.artifacts);
    Ok(stores.find(&buckets, &subjects::log_object(&task.def.task_id, stream)).await?)
}

/// Tasks' live output as a follower shows it: a chunk only from the worker its task was
/// dispatched to (the last token of its subject, which NATS binds to a per-worker user), so
/// another worker cannot put lines in it. A chunk from another worker is held (up to
/// [`LiveOutput::HELD_BYTES`] in all, each counted with its names and its place in the list:
/// [`held_size`]), since it may be the next attempt's, come before the fold has its dispatch; it
/// is shown, in the order it came, once the fold names its writer.
#[derive(Debug, Default)]
pub struct LiveOutput {
    /// (task, writer, chunk), in arrival order.
    held: Vec<(String, String, Vec<u8>)>,
    held_bytes: usize,
}

impl LiveOutput {
    /// The most a follower holds for writers the fold does not (yet) name.
    pub const HELD_BYTES: usize = 1 << 20;

    /// Takes a chunk published on `subject`; returns it as (task, chunk) if it can be shown now.
    /// Held chunks become showable only when the fold changes: call [`LiveOutput::release`] after
    /// each event applied (so this stays O(1) however much is held).
    pub fn take(&mut self, subject: &str, chunk: &[u8], state: &State) -> Vec<(String, Vec<u8>)> {
        let mut shown = Vec::new();
        let Some((task, writer)) = subjects::logs_writer(subject) else { return shown };
        if runs(state, task, writer) {
            shown.push((task.to_owned(), chunk.to_vec()));
        } else {
            let size = held_size(task, writer, chunk);
            if self.held_bytes + size <= Self::HELD_BYTES {
                self.held_bytes += size;
                self.held.push((task.to_owned(), writer.to_owned(), chunk.to_vec()));
            }
        }
        shown
    }

    /// The held chunks whose writer the fold now names for their task, in the order they came.
    pub fn release(&mut self, state: &State) -> Vec<(String, Vec<u8>)> {
        if self.held.is_empty() {
            return Vec::new();
        }
        let (now, later): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.held).into_iter().partition(|(task, writer, _)| runs(state, task, writer));
        self.held = later;
        self.held_bytes = self.held.iter().map(|(task, writer, chunk)| held_size(task, writer, chunk)).sum();
        now.into_iter().map(|(task, _, chunk)| (task, chunk)).collect()
    }
}

/// What a held chunk counts against [`LiveOutput::HELD_BYTES`]: its bytes, its names and its
/// place in the list, so that a stream of empty or tiny chunks is bounded as well as a large one.
fn held_size(task: &str, writer: &str, chunk: &[u8]) -> usize {
    std::mem::size_of::<(String, String, Vec<u8>)>() + task.len() + writer.len() + chunk.len()
}

/// Whether the fold has `task`'s current attempt on `writer`.
fn runs(state: &State, task: &str, writer: &str) -> bool {
    state.task(task).and_then(|t| t.worker_id.as_deref()) == Some(writer)
}

fn write_file(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, bytes)?;
    Ok(())
}

/// One stream's replication health.
#[derive(Debug, serde::Serialize)]
pub struct StreamHealth {
    pub stream: String,
    pub messages: u64,
    pub leader: Option<String>,
    /// Followers with their state: `current`, `lagging` or `offline`.
    pub replicas: Vec<(String, &'static str)>,
    pub healthy: bool,
}

/// Leader and replicas of every FlowMesh stream, bucket and object store (each worker's included).
pub async fn stream_health(js: &jetstream::Context) -> anyhow::Result<Vec<StreamHealth>> {
    let mut out = Vec::new();
    for name in flowmesh_nats::artifacts::product_streams(js).await? {
        let stream = js.get_stream(&name).await?;
        let info = stream.cached_info();
        let (leader, replicas) = match &info.cluster {
            // A single server reports no cluster: it is its own leader.
            None => (Some("(single server)".to_owned()), Vec::new()),
            Some(cluster) => (
                cluster.leader.clone(),
                cluster
                    .replicas
                    .iter()
                    .map(|p| {
                        (
                            p.name.clone(),
                            if p.offline {
                                "offline"
                            } else if p.current {
                                "current"
                            } else {
                                "lagging"
                            },
                        )
                    })
                    .collect(),
            ),
        };
        let wanted = info.config.num_replicas.saturating_sub(1);
        let current = replicas.iter().filter(|(_, state)| *state == "current").count();
        // Healthy: a leader, and every follower it should have is caught up. A follower that is
        // offline or lagging leaves the stream writable (a quorum) but not healthy.
        let healthy = leader.is_some() && current >= wanted;
        out.push(StreamHealth { stream: name, messages: info.state.messages, leader, replicas, healthy });
    }
    Ok(out)
}

impl Row for StreamHealth {
    const HEADERS: &'static [&'static str] = &["STREAM", "MESSAGES", "LEADER", "FOLLOWERS", "HEALTHY"];
    fn cells(&self) -> Vec<String> {
        vec![
            self.stream.clone(),
            self.messages.to_string(),
            self.leader.clone().unwrap_or_else(|| "NONE".to_owned()),
            self.replicas.iter().map(|(name, state)| format!("{name} {state}")).collect::<Vec<_>>().join(", "),
            if self.healthy { "yes".to_owned() } else { "no".to_owned() },
        ]
    }
}

#[cfg(test)]
mod tests {

    /// Live output is shown only from the worker the task was dispatched to, in the order it
    /// came, and what comes before the fold knows the dispatch waits for it.
    #[test]
    fn live_output_is_shown_only_from_the_task_s_worker_in_order() {
        use super::LiveOutput;
        use flowmesh_domain::event::{SubmissionAccepted, SubmissionRef, TaskDispatched, TaskRef, TaskRequeued};
        use flowmesh_domain::{Event, EventBody, state::State};
        use flowmesh_nats::subjects::logs;
        let workflow = flowmesh_domain::validate_submission(
            b"apiVersion: flowmesh/v1\nkind: EchoTask\nmetadata: {name: e}\nspec: {taskType: echo, data: {type: list, items: [a]}}\n",
            "wf-1",
        )
        .unwrap();
        let task = workflow.tasks[0].task_id.clone();
        let accepted = EventBody::SubmissionAccepted(SubmissionAccepted {
            workflow_id: "wf-1".into(),
            submission: SubmissionRef { stream: "S".into(), seq: 1, msg_id: None, validated_by: None },
            task_ids: vec![task.clone()],
            workflow,
        });
        let dispatched = |attempt, worker: &str| {
            let task = TaskRef { workflow_id: "wf-1".into(), task_id: task.clone(), stage: "main".into(), attempt };
            Event::new(
                EventBody::TaskDispatched(TaskDispatched {
                    task,
                    worker_id: worker.into(),
                    task_type: "echo".into(),
                    message: String::new(),
                    order: None,
                }),
                "t".into(),
                0,
            )
        };
        let mut state = State::default();
        state.apply(&Event::new(accepted, "t".into(), 0));
        let mut live = LiveOutput::default();
        let shown =
            |v: Vec<(String, Vec<u8>)>| v.into_iter().map(|(_, c)| String::from_utf8(c).unwrap()).collect::<Vec<_>>();
        // Before the dispatch is folded: held, whoever wrote it.
        assert!(live.take(&logs(&task, "stdout", "w1"), b"one", &state).is_empty());
        assert!(live.take(&logs(&task, "stdout", "evil"), b"forged", &state).is_empty());
        assert!(live.take(&logs(&task, "stdout", "w1"), b"two", &state).is_empty());
        // Dispatched to w1: its chunks come out in order, the other worker's never.
        state.apply(&dispatched(1, "w1"));
        assert_eq!(shown(live.release(&state)), ["one", "two"]);
        assert_eq!(shown(live.take(&logs(&task, "stdout", "w1"), b"three", &state)), ["three"]);
        assert!(live.take(&logs(&task, "stdout", "evil"), b"forged", &state).is_empty());
        assert!(live.take("flowmesh.logs.not-a-log-subject", b"x", &state).is_empty());
        // The next attempt on w2: its chunks wait for its dispatch; w1's after it never show.
        assert!(live.take(&logs(&task, "stdout", "w2"), b"four", &state).is_empty());
        let requeued = TaskRequeued {
            task: TaskRef { workflow_id: "wf-1".into(), task_id: task.clone(), stage: "main".into(), attempt: 2 },
            reason: "worker_lost".into(),
            worker_id: Some("w1".into()),
        };
        state.apply(&Event::new(EventBody::TaskRequeued(requeued), "t".into(), 0));
        state.apply(&dispatched(2, "w2"));
        assert_eq!(shown(live.release(&state)), ["four"]);
        assert!(live.take(&logs(&task, "stdout", "w1"), b"late", &state).is_empty());
        assert_eq!(shown(live.take(&logs(&task, "stdout", "w2"), b"five", &state)), ["five"]);
        // What waits is bounded, by its bytes and by its count.
        let big = vec![b'x'; LiveOutput::HELD_BYTES - super::held_size("wf-9-main", "w1", b"")];
        let mut fresh = LiveOutput::default();
        assert!(fresh.take(&logs("wf-9-main", "stdout", "w1"), &big, &State::default()).is_empty());
        assert!(fresh.take(&logs("wf-9-main", "stdout", "w1"), b"over", &State::default()).is_empty());
        assert_eq!(fresh.held.len(), 1);
        let mut flooded = LiveOutput::default();
        for _ in 0..100_000 {
            assert!(flooded.take(&logs("wf-9-main", "stdout", "w1"), b"", &State::default()).is_empty());
        }
        assert!(flooded.held.len() < 100_000 && flooded.held_bytes <= LiveOutput::HELD_BYTES, "{}", flooded.held.len());
    }
    use super::gpu_summary;
    use flowmesh_domain::fleet::Gpu;

    #[test]
    fn a_workers_gpus_are_counted_by_model_and_size_in_the_probes_order() {
        let gpu = |index, name: &str, gib: u64| Gpu {
            index,
            uuid: String::new(),
            name: name.into(),
            memory_bytes: gib << 30,
        };
        let cases: [(Vec<Gpu>, &str); 4] = [
            (vec![], "-"),
            (vec![gpu(0, "NVIDIA H100", 80), gpu(1, "NVIDIA H100", 80)], "2x NVIDIA H100 80 GiB"),
            (
                vec![gpu(0, "NVIDIA H100", 80), gpu(1, "NVIDIA A100", 80), gpu(2, "NVIDIA L40S", 48)],
                "1x NVIDIA H100 80 GiB, 1x NVIDIA A100 80 GiB, 1x NVIDIA L40S 48 GiB",
            ),
            (
                vec![gpu(0, "NVIDIA A100", 40), gpu(1, "NVIDIA A100", 80), gpu(2, "NVIDIA A100", 40)],
                "2x NVIDIA A100 40 GiB, 1x NVIDIA A100 80 GiB",
            ),
        ];
        for (gpus, want) in cases {
            assert_eq!(gpu_summary(&gpus), want);
        }
    }
}
