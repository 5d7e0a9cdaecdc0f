//! The router: folds the event log, watches the fleet, and turns the scheduling core's
//! decisions into events and work orders. One instance acts at a time (the lease); the others
//! fold the log too, so a standby takes over already warm.

pub mod checkpoint;
pub mod lease;
mod secrets;
mod singles;

use async_nats::jetstream::{self, consumer, kv};
use flowmesh_domain::event::{Author, WorkerJoined, WorkerLost};
use flowmesh_domain::fleet::WorkerSnapshot;
use flowmesh_domain::placement::{FleetIndex, Strategy};
use flowmesh_domain::schedule::{self, Action};
use flowmesh_domain::state::{State, TaskStatus};
use flowmesh_domain::{Event, EventBody, ids};
use flowmesh_nats::{EdgeError, Handles, Shutdown, clock, publish, subjects};
use futures_util::{FutureExt, StreamExt};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use tracing::{debug, info, warn};

/// Flags and environment variables of the router.
#[derive(Debug, Clone, clap::Args)]
pub struct RouterArgs {
    /// Seconds a task may find no capable worker before it fails with no_eligible_worker.
    #[arg(long, env = "TASK_NO_WORKER_GRACE_SEC", default_value_t = 60)]
    pub task_no_worker_grace_sec: u64,
    /// How the best eligible worker is chosen.
    #[arg(long, env = "ROUTER_STRATEGY", value_enum, default_value = "best_fit")]
    pub router_strategy: Strategy,
    /// Seconds the router lease lasts without renewal (a standby takes over within this).
    #[arg(long, env = "ROUTER_LEASE_TTL_SEC", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub router_lease_ttl_sec: u64,
    /// This instance's name in the lease. Default: hostname and process id.
    #[arg(long, env = "ROUTER_ID")]
    pub router_id: Option<String>,
    /// Folder for a checkpoint of the fold, so a restart replays only newer events. Default: none
    /// (replay the whole log).
    #[arg(long, env = "ROUTER_CHECKPOINT_DIR")]
    pub router_checkpoint_dir: Option<std::path::PathBuf>,
    /// Seconds a workflow's events stay in the log after it ended (or was rejected); then the
    /// router purges them. 0 keeps them for ever. At least 60.
    #[arg(long, env = "ROUTER_KEEP_ENDED_SEC", default_value_t = DEFAULT_KEEP_ENDED_SEC, value_parser = keep_ended_sec)]
    pub router_keep_ended_sec: u64,
}

/// A week: as long as the submissions stream keeps a workflow's document.
pub const DEFAULT_KEEP_ENDED_SEC: u64 = 7 * 24 * 3600;

/// Reads a kept period in seconds: 0 (for ever) or at least a minute, so that a person
/// following a workflow (`submit --watch`) reads its end before it goes.
pub fn keep_ended_sec(text: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(sec) if sec == 0 || sec >= 60 => Ok(sec),
        Ok(sec) => Err(format!("{sec} s is shorter than a minute; give 0 to keep every event for ever, or 60 or more")),
        Err(e) => Err(format!("{text:?} is not a number of seconds: {e}")),
    }
}

/// The kept period of [`keep_ended_sec`]'s seconds; `None` keeps everything.
pub fn keep_ended(sec: u64) -> Option<Duration> {
    (sec > 0).then(|| Duration::from_secs(sec))
}

#[derive(Debug, Clone)]
pub struct Config {
    pub schedule: schedule::Config,
    pub lease_ttl: Duration,
    pub instance: String,
    /// How often the router re-evaluates time-based rules (staleness, grace periods, lease).
    pub tick: Duration,
    pub checkpoint_dir: Option<std::path::PathBuf>,
    /// How often the checkpoint is written while events flow.
    pub checkpoint_every: Duration,
    /// How long an ended workflow's events stay in the log before the router purges them
    /// (retention); `None` keeps them for ever.
    pub keep_ended: Option<Duration>,
}

/// The most workflows one purge round takes.
const PURGE_BATCH: usize = 4096;
/// Workflows a purge round removes at once (each one request at a time).
const PURGES_IN_FLIGHT: usize = 64;

/// One workflow's events to remove (retention).
struct Purge {
    workflow: String,
    /// The stream sequences of its events, when this router folded its verdict and so every
    /// event after it: each is deleted on its own. `None`: they are purged by the workflow's
    /// subjects, which costs the server far more (`purge_workflows`).
    seqs: Option<Seqs>,
}

/// The stream sequences of one workflow's events: up to four in place (a one-task workflow has
/// three), more on the heap. With a vector each, removing a burst's 220,000 workflows freed as
/// many small allocations at once, and the services then spent 6-13% more CPU per workflow,
/// much of it in glibc's `unlink_chunk` and `malloc_consolidate` (BENCHMARKS, "Fifteenth round").
#[derive(Debug, Default, Clone)]
struct Seqs {
    first: [u64; 4],
    len: usize,
    more: Vec<u64>,
}

impl Seqs {
    fn push(&mut self, seq: u64) {
        match self.first.get_mut(self.len) {
            Some(slot) => *slot = seq,
            None => self.more.push(seq),
        }
        self.len += 1;
    }

    fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.first.iter().take(self.len).chain(&self.more).copied()
    }
}

/// How often the router drops what ended from its fold. Often, so that each time is short: on
/// the half-second tick it was 1-2.5 ms of the loop at 2,000 workflows/s (1,000 workflows), and
/// every event that came meanwhile waited; at 50 ms, p99 submit→start at half load fell in every
/// pair, by 16-24% with the server at `GOGC=400` and by 2-10% at Go's default, whose
/// collections then hid most of it (BENCHMARKS, "Twenty-first round").
const FORGET_EVERY: Duration = Duration::from_millis(50);

/// How long a worker that stopped heartbeating without leaving (a crash, a partition) is
/// remembered once its loss is recorded and it holds nothing. A day: the workers bucket's own
/// age limit (its `max_age`), and far past the event log's duplicate window (2 min), so that the
/// same incarnation heard again after it joins anew.
const FORGET_SILENT_WORKERS_AFTER: Duration = Duration::from_secs(24 * 3600);

impl RouterArgs {
    /// The router's configuration; clap has already checked every value.
    pub fn config(&self) -> Config {
        Config {
            schedule: schedule::Config {
                no_worker_grace_ms: self.task_no_worker_grace_sec * 1000,
                strategy: self.router_strategy,
                ..Default::default()
            },
            lease_ttl: Duration::from_secs(self.router_lease_ttl_sec),
            instance: self
                .router_id
                .clone()
                .unwrap_or_else(|| format!("{}-{}", flowmesh_nats::host::name(), std::process::id())),
            tick: Duration::from_millis(500),
            checkpoint_dir: self.router_checkpoint_dir.clone(),
            checkpoint_every: Duration::from_secs(10),
            keep_ended: keep_ended(self.router_keep_ended_sec),
        }
    }
}

/// A worker as the router sees it: its snapshot and when that was written.
struct Seen {
    snapshot: WorkerSnapshot,
    /// When the router received it, on the router's own clock: liveness never compares the
    /// router's clock with another host's, so clock drift cannot make a live worker look lost.
    updated_ms: u64,
    /// The bucket revision it came from: an older value (the watch replaying history) never
    /// replaces a newer one.
    revision: u64,
    /// Deleted from the bucket: the worker left.
    left: bool,
    /// The live fleet's index holds this snapshot.
    indexed: bool,
}

impl Seen {
    /// A worker is live while its last snapshot is younger than its TTL, its age counted at the
    /// earliest from `contact_since_ms`, when the router last regained contact with NATS: while
    /// the router could not hear anyone, no worker could be heard, and that silence is no
    /// worker's fault.
    fn is_live(&self, now_ms: u64, contact_since_ms: u64) -> bool {
        !self.left && heard_within_ttl(now_ms, self.updated_ms.max(contact_since_ms), self.snapshot.ttl_sec)
    }
}

/// Whether a worker last heard at `heard_ms` is still within its TTL at `now_ms`. The TTL is the
/// worker's own word (its snapshot), so any number must give an answer.
fn heard_within_ttl(now_ms: u64, heard_ms: u64, ttl_sec: u64) -> bool {
    now_ms.saturating_sub(heard_ms) <= ttl_sec.saturating_mul(1000)
}

struct Router {
    config: Config,
    handles: Handles,
    client: async_nats::Client,
    state: State,
    fleet: BTreeMap<String, Seen>,
    /// The live part of `fleet`, as placement reads it; kept between rounds.
    live: FleetIndex,
    /// Workers whose snapshot arrived or left since the last round looked at them.
    fleet_changed: BTreeSet<String>,
    /// The next round looks at every worker (liveness runs out with time: on the tick).
    scan_all: bool,
    /// Orders queued on a worker that could run sooner elsewhere (`schedule::Releases`),
    /// looked at after the round that follows a tick (`look_for_releases`).
    releases: schedule::Releases,
    look_for_releases: bool,
    /// The stream sequence the fold must reach before the router may act.
    target_seq: u64,
    leader: bool,
    /// Until when the lease lets this router act (`lease::Held`): `leader` alone says whether
    /// the last renewal succeeded, not whether it was recent.
    held: lease::Held,
    /// Work orders re-sent after taking the lease (a dispatch a crash may have cut short).
    resent_after_takeover: bool,
    /// Read since taking the lease: which workers holding dispatched tasks left cleanly while
    /// this router could not see it (`read_departures`).
    departures_read: bool,
    /// What a round remembers for the next (`schedule::decide_with`): waiting tasks' placement
    /// requests, and the workflows touched since.
    requests: schedule::Requests,
    /// When the last whole round was taken and what it cost (`whole_round_every`).
    last_whole: (tokio::time::Instant, Duration),
    /// Another router's lease as this one last saw it (`lease::acquire`).
    lease_seen: Option<lease::Seen>,
    /// Messages of the log skipped as unreadable (`Event::read`): never folded.
    unreadable: u64,
    /// The connection to NATS was seen down, or a lease call failed, since the last contact.
    out_of_contact: bool,
    /// When contact with NATS was last regained (router clock); 0 before any outage.
    contact_since_ms: u64,
    /// The purge round in flight, off the loop: it hands back the workflows it could not purge.
    purging: Option<tokio::task::JoinHandle<(Vec<Purge>, Vec<u64>)>>,
    /// Workflows a record already lists whose purge failed: tried again in the next round.
    purge_again: Vec<Purge>,
    /// With retention on: the stream sequences of each workflow's events folded since its
    /// verdict, by the workflow's submission sequence, until it is purged.
    event_seqs: std::collections::HashMap<u64, Seqs>,
    /// The stream sequences of the purge records folded and not yet deleted; all but the last
    /// are stale (the latest lists everything).
    record_seqs: Vec<u64>,
    /// The sequences this router knew of the workflows the latest purge record's round removes
    /// (`State::removing`): what it removes again if it takes over from the leader that stored
    /// the record, which may have stopped halfway.
    in_doubt: std::collections::HashMap<u64, Seqs>,
    /// Single messages to delete by their sequence: events of workflows already purged that came
    /// after their record (a report a week late), and stale purge records whose deletion failed.
    /// The leader's rounds take `PURGE_BATCH` of them at a time; a failed deletion is tried again.
    late: singles::Singles,
    /// The latest record's round was taken up again since this router took the lease.
    removal_resumed: bool,
}

/// Runs until `shutdown` fires.
pub async fn run(
    config: Config,
    client: async_nats::Client,
    handles: Handles,
    mut shutdown: Shutdown,
) -> anyhow::Result<()> {
    let mut events_stream = handles.js.get_stream(subjects::EVENTS_STREAM).await?;
    let last = events_stream.cached_info().state.last_sequence;
    let mut checkpoint = match &config.checkpoint_dir {
        Some(dir) => Some(checkpoint::Checkpoint::open(dir)?),
        None => None,
    };
    let state = checkpoint.as_mut().and_then(|c| c.load(last)).unwrap_or_default();
    let deliver_policy = match state.last_seq {
        0 => consumer::DeliverPolicy::All,
        seq => consumer::DeliverPolicy::ByStartSequence { start_sequence: seq + 1 },
    };
    let consumer =
        events_stream.create_consumer(consumer::pull::OrderedConfig { deliver_policy, ..Default::default() }).await?;
    let mut events = consumer.messages().await?;
    let mut watch = handles.workers.watch_with_history(">").await?;
    // The fleet as it is now, read before the router may act: deciding on a partial fleet would
    // take live workers for lost ones and requeue their running tasks.
    let mut current = Vec::new();
    let mut keys = handles.workers.keys().await?;
    while let Some(key) = keys.next().await {
        if let Some(entry) = handles.workers.entry(key?).await? {
            current.push(entry);
        }
    }
    let mut router = Router {
        config,
        handles,
        client,
        state,
        fleet: BTreeMap::new(),
        live: FleetIndex::default(),
        fleet_changed: BTreeSet::new(),
        scan_all: true,
        releases: schedule::Releases::default(),
        look_for_releases: false,
        target_seq: last,
        leader: false,
        held: lease::Held::default(),
        resent_after_takeover: false,
        departures_read: false,
        requests: schedule::Requests::default(),
        last_whole: (tokio::time::Instant::now(), Duration::ZERO),
        lease_seen: None,
        unreadable: 0,
        out_of_contact: false,
        contact_since_ms: 0,
        purging: None,
        purge_again: Vec::new(),
        event_seqs: std::collections::HashMap::new(),
        in_doubt: std::collections::HashMap::new(),
        late: singles::Singles::default(),
        removal_resumed: false,
        record_seqs: Vec::new(),
    };
    // Snapshots already in the bucket were received before this router ran: their age comes from
    // the server's timestamps, measured against the freshest of them (all on the server's clock).
    let created: Vec<u64> = current.iter().map(|e| clock::unix_ms(e.created)).collect();
    let freshest = created.iter().copied().max().unwrap_or(0);
    let now = clock::now_ms();
    for (entry, created) in current.into_iter().zip(created) {
        router.observe(entry, received_before_start(created, freshest, now));
    }
    info!(instance = %router.config.instance, from = router.state.last_seq, replay_to = last, workers = router.fleet.len(), "router starting");
    let mut last_checkpoint = tokio::time::Instant::now();
    let mut saving: Option<tokio::task::JoinHandle<checkpoint::Checkpoint>> = None;
    let status = flowmesh_nats::status::Status::default();
    let _service = flowmesh_nats::status::serve(
        &router.client,
        "router",
        "router",
        "FlowMesh router: placement and lifecycle",
        status.clone(),
    )
    .await?;
    let mut tick = tokio::time::interval(router.config.tick);
    let mut lease_tick = tokio::time::interval(router.config.lease_ttl / 3);
    let mut forget = tokio::time::interval(FORGET_EVERY);
    forget.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.wait() => break,
            next = events.next() => match next {
                Some(Ok(message)) => {
                    router.fold(&message);
                    // Fold everything that has already arrived, then decide once for all of it.
                    while let Some(Some(Ok(message))) = events.next().now_or_never() {
                        router.fold(&message);
                    }
                }
                Some(Err(e)) => { warn!(error = %e, "event stream interrupted; resuming"); continue; }
                None => anyhow::bail!("the event stream consumer ended"),
            },
            next = watch.next() => match next {
                Some(Ok(entry)) => {
                    let now = clock::now_ms();
                    let mut left = router.observe(entry, now);
                    // Take every snapshot that has already arrived, then decide once for all.
                    while let Some(Some(Ok(entry))) = watch.next().now_or_never() {
                        left |= router.observe(entry, now);
                    }
                    // A worker that leaves stores its last reports before it deletes its
                    // snapshot, but the two reach the router on separate consumers: fold the log
                    // to its end before deciding about what the worker held, or a report still on
                    // its way is taken for work never done (run again) or never finished.
                    if left {
                        match events_stream.info().await {
                            Ok(info) => router.target_seq = router.target_seq.max(info.state.last_sequence),
                            Err(e) => warn!(error = %e, "could not read the event log's end after a worker left"),
                        }
                    }
                }
                Some(Err(e)) => { warn!(error = %e, "fleet watch interrupted"); continue; }
                None => anyhow::bail!("the fleet watch ended"),
            },
            _ = lease_tick.tick() => router.renew_lease().await,
            _ = forget.tick() => router.forget_ended(),
            _ = tick.tick() => {
                let ticking = std::time::Instant::now();
                let connected = router.client.connection_state() == async_nats::connection::State::Connected;
                router.note_contact(connected);
                router.forget_gone_workers(clock::now_ms());
                router.purge_ended(&events_stream, clock::now_ms()).await;
                // Time-based rules (grace periods) are looked at in a whole round, on the tick
                // or, when what runs makes one costly, less often.
                let (at, cost) = router.last_whole;
                if at.elapsed() >= whole_round_every(cost, router.config.tick) {
                    router.requests.touch_all();
                }
                router.scan_all = true;
                router.look_for_releases = true;
                status.set(router.status());
                router.resend_cancels().await;
                // The fold is copied here (its workflows shared, so a few ms at 10,000 in flight)
                // and written off the loop: serialising it (8 MB, 55-70 ms there) no longer holds
                // every decision up. One write at a time.
                if saving.as_ref().is_some_and(|s| s.is_finished()) {
                    checkpoint = written(saving.take()).await;
                }
                if router.caught_up()
                    && last_checkpoint.elapsed() >= router.config.checkpoint_every
                    && let Some(mut c) = checkpoint.take_if(|c| c.is_behind(&router.state))
                {
                    let copying = std::time::Instant::now();
                    let state = router.state.clone();
                    debug!(copied = ?copying.elapsed(), "router checkpoint taken");
                    saving = Some(tokio::task::spawn_blocking(move || {
                        c.save(&state);
                        c
                    }));
                    last_checkpoint = tokio::time::Instant::now();
                }
                // How long the tick held the loop: no event is folded meanwhile.
                metrics::histogram!("flowmesh_router_tick_seconds").record(ticking.elapsed().as_secs_f64());
            }
        }
        if let Err(e) = router.act().await {
            warn!(error = %e, "could not publish a decision; retrying on the next event or tick");
        }
    }
    if router.leader {
        lease::release(&router.handles.control, &router.config.instance).await;
    }
    if saving.is_some() {
        checkpoint = written(saving.take()).await;
    }
    if let Some(c) = checkpoint.as_mut() {
        c.save(&router.state);
    }
    info!("router stopped");
    Ok(())
}

/// Removes each workflow's events, `PURGES_IN_FLIGHT` workflows at once, and single messages
/// (stale purge records, late events of purged workflows). Returns the workflows and the single
/// messages it could not remove, to try again next round.
///
/// One message at a time, by its sequence: a purge request makes the server recount what every
/// consumer of the log has pending, and the workers' dispatch consumers, whose filters have
/// wildcards in the workflow and task tokens, then walk every subject of the stream: 1.7 ms
/// of the server per workflow after 60,000 workflows, growing with the history, against 34 µs
/// per message deleted, which each consumer accounts for by itself (BENCHMARKS, "Fifteenth
/// round"). A workflow whose sequences this router does not know is purged by its subjects, and
/// by those a log written before the worker-first layout has.
async fn purge_workflows(
    js: jetstream::Context,
    log: jetstream::stream::Stream,
    work: Vec<Purge>,
    singles: Vec<u64>,
) -> (Vec<Purge>, Vec<u64>) {
    let started = std::time::Instant::now();
    let (js, log) = (&js, &log);
    let removals = work.into_iter().map(|purge| async move {
        let removed = match &purge.seqs {
            Some(seqs) => {
                let mut removed = Ok(seqs.len as u64);
                for seq in seqs.iter() {
                    if let Err(e) = flowmesh_nats::retention::delete_event(js, seq).await {
                        removed = Err(e);
                        break;
                    }
                }
                removed
            }
            None => flowmesh_nats::retention::purge_workflow(log, &purge.workflow).await,
        };
        (purge, removed)
    });
    let mut answers = futures_util::stream::iter(removals).buffer_unordered(PURGES_IN_FLIGHT);
    let (mut failed, mut workflows, mut messages) = (Vec::new(), 0u64, 0u64);
    while let Some((purge, removed)) = answers.next().await {
        match removed {
            Ok(count) => {
                workflows += 1;
                messages += count;
            }
            Err(e) => {
                warn!(workflow = %purge.workflow, error = %e, "could not remove a workflow's events; trying again next round, and purging nothing new until it is removed");
                failed.push(purge);
            }
        }
    }
    let deletions =
        singles.into_iter().map(|seq| async move { (seq, flowmesh_nats::retention::delete_event(js, seq).await) });
    let mut deletions = futures_util::stream::iter(deletions).buffer_unordered(PURGES_IN_FLIGHT);
    let mut singles_failed = Vec::new();
    while let Some((seq, deleted)) = deletions.next().await {
        if let Err(e) = deleted {
            warn!(seq, error = %e, "could not delete a stale purge record or a late event; trying again next round");
            singles_failed.push(seq);
        }
    }
    singles_failed.sort_unstable();
    metrics::counter!("flowmesh_router_purged_workflows_total").increment(workflows);
    info!(workflows, messages, failed = failed.len(), took = ?started.elapsed(), "removed ended workflows' events");
    (failed, singles_failed)
}

/// The checkpoint back from its write off the loop; `None` (no more checkpoints, the log is
/// replayed from the last one written) if that write panicked.
async fn written(write: Option<tokio::task::JoinHandle<checkpoint::Checkpoint>>) -> Option<checkpoint::Checkpoint> {
    match write?.await {
        Ok(c) => Some(c),
        Err(e) => {
            warn!(error = %e, "the router checkpoint's write failed; no more checkpoints in this run");
            None
        }
    }
}

/// Whether the router may forget a worker that holds nothing of a running workflow: not `live`,
/// and `settled` (the fold has its current incarnation's loss, or never had it join). A worker
/// that `left` cleanly (its key deleted, which only the worker itself does as it stops) ended
/// that incarnation: forgotten at once. One that went silent may be cut off and come back as the
/// same incarnation, which must not be taken for a new join within the event log's duplicate
/// window: forgotten after `after_ms` of silence (`silent_ms`).
fn gone_for_good(live: bool, left: bool, settled: bool, silent_ms: u64, after_ms: u64) -> bool {
    !live && settled && (left || silent_ms >= after_ms)
}

/// When, on the router's clock, to consider a snapshot found at start-up received: as much before
/// `now_ms` as it is older than the freshest snapshot found (`freshest_ms`, server clock). A fleet
/// that heartbeats keeps its freshest within an interval of the server's now; a fleet that all died
/// before the router started is judged lost one TTL later than it would be on synchronised clocks.
fn received_before_start(created_ms: u64, freshest_ms: u64, now_ms: u64) -> u64 {
    now_ms.saturating_sub(freshest_ms.saturating_sub(created_ms))
}

impl Router {
    fn fold(&mut self, message: &jetstream::Message) {
        if let Ok(info) = message.info() {
            self.state.last_seq = info.stream_sequence;
            self.target_seq = self.target_seq.max(info.stream_sequence + info.pending);
        }
        let suffix = subjects::event_suffix(&message.subject).unwrap_or_default();
        match Event::read_skipping_orders(suffix, &message.payload) {
            Ok(event) => {
                self.note_seq(&event.body);
                self.requests.touch(&event.body);
                let id = tracing::enabled!(tracing::Level::DEBUG).then(|| event.id.clone());
                let applied = self.state.apply_owned(event);
                debug!(event = id.as_deref().unwrap_or_default(), ?applied, "folded");
            }
            Err(e) => {
                self.unreadable += 1;
                metrics::counter!("flowmesh_events_unreadable_total").increment(1);
                warn!(subject = %message.subject, seq = self.state.last_seq, error = %e, "unreadable event; skipped, not folded");
            }
        }
    }

    /// Notes where the event just folded (at `state.last_seq`) lies, for retention to delete
    /// it by its sequence later. Only a workflow whose verdict this router folded is followed:
    /// of any other, it cannot know it saw every event.
    fn note_seq(&mut self, body: &EventBody) {
        let seq = self.state.last_seq;
        if self.config.keep_ended.is_none() || seq == 0 {
            return;
        }
        let Some(workflow) = body.workflow().and_then(ids::submission_seq) else {
            if let EventBody::WorkflowsPurged(record) = body {
                self.record_seqs.push(seq);
                // What another router purged is no longer this one's to follow. What its round
                // removes is kept aside until the next record says that round finished.
                self.in_doubt.clear();
                let in_doubt = &mut self.in_doubt;
                self.event_seqs.retain(|&n, seqs| {
                    if record.removing.contains_seq(n) {
                        in_doubt.insert(n, std::mem::take(seqs));
                    }
                    !record.workflows.contains_seq(n)
                });
            }
            return;
        };
        if self.state.purged().contains_seq(workflow) {
            if !self.late.note(seq) {
                metrics::counter!("flowmesh_router_late_events_unnoted_total").increment(1);
                if self.late.unnoted() == 1 {
                    warn!(
                        seq,
                        limit = singles::LIMIT,
                        "too many late events of purged workflows waiting to be deleted; the ones past the limit stay in the log"
                    );
                }
            }
            return;
        }
        match body {
            EventBody::SubmissionAccepted(_) | EventBody::SubmissionRejected(_) => {
                self.event_seqs.entry(workflow).or_default().push(seq)
            }
            _ => {
                if let Some(seqs) = self.event_seqs.get_mut(&workflow) {
                    seqs.push(seq);
                }
            }
        }
    }

    /// Takes in a bucket entry the router received at `updated_ms` (its own clock); returns
    /// whether it says a known worker left.
    fn observe(&mut self, entry: kv::Entry, updated_ms: u64) -> bool {
        if self.fleet.get(&entry.key).is_some_and(|seen| seen.revision >= entry.revision) {
            return false;
        }
        match entry.operation {
            kv::Operation::Put => match WorkerSnapshot::read(&entry.key, &entry.value) {
                Ok(snapshot) => {
                    self.fleet.insert(
                        entry.key.clone(),
                        Seen { snapshot, updated_ms, revision: entry.revision, left: false, indexed: false },
                    );
                    self.fleet_changed.insert(entry.key);
                    false
                }
                Err(e) => {
                    warn!(key = %entry.key, error = %e, "worker snapshot not believed; ignoring it");
                    false
                }
            },
            kv::Operation::Delete | kv::Operation::Purge => {
                let Some(seen) = self.fleet.get_mut(&entry.key) else { return false };
                seen.left = true;
                seen.revision = entry.revision;
                self.fleet_changed.insert(entry.key);
                true
            }
        }
    }

    /// Forgets the workers gone for good, so that a fleet which scales with fresh ids grows
    /// neither the router's memory nor its tick: their snapshot, their clean departure and what
    /// the fold knows of their incarnations (`gone_for_good`). The fold must be whole (caught up):
    /// a task it has not yet seen may be on such a worker.
    fn forget_gone_workers(&mut self, now_ms: u64) {
        if !self.caught_up() {
            return;
        }
        let after_ms = FORGET_SILENT_WORKERS_AFTER.as_millis() as u64;
        let (state, contact_since_ms) = (&self.state, self.contact_since_ms);
        let gone: Vec<String> = self
            .remembered_workers()
            .into_iter()
            .filter(|id| match self.fleet.get(*id) {
                Some(seen) => {
                    let incarnation = &seen.snapshot.started_at;
                    let settled = state.joined_workers.get(*id) != Some(incarnation)
                        || state.lost_workers.get(*id) == Some(incarnation);
                    // Silence counts from the last contact regained, as liveness does.
                    let silent_ms = now_ms.saturating_sub(seen.updated_ms.max(contact_since_ms));
                    gone_for_good(seen.is_live(now_ms, contact_since_ms), seen.left, settled, silent_ms, after_ms)
                }
                // Known without a snapshot: its entry left the bucket before this router saw it.
                None => true,
            })
            .cloned()
            .collect();
        if gone.is_empty() {
            return;
        }
        let holding = state.workers_holding_tasks();
        let gone: Vec<String> = gone.into_iter().filter(|id| !holding.contains(id.as_str())).collect();
        for id in &gone {
            self.fleet.remove(id);
            self.live.forget(id);
            self.state.forget_worker(id);
        }
        if !gone.is_empty() {
            debug!(workers = gone.len(), "forgot workers gone for good");
        }
    }

    /// Retention: purges the events of the workflows that ended longer ago than the kept period
    /// (`State::due_for_purge`), one round at a time. The round's record (`workflows.purged`,
    /// every workflow purged so far) is stored first: a reader that took the first part of a
    /// purged workflow's events reads the record after them and drops the workflow, whatever
    /// point of the log it started from. Then the purges go out off the loop, and the older
    /// records with them (the latest lists everything). Only the leader purges, and only with
    /// its fold whole.
    ///
    /// A record is stored only once the round before it removed everything it named: while
    /// some removal fails, rounds retry it and add nothing. So a router that takes the lease
    /// finds left behind at most what the latest record's round removes (`State::removing`), and
    /// removes that again first (a message already gone counts as removed), by sequence where
    /// it followed the workflow and by subjects where it did not. Events of a purged workflow
    /// that came after its record go too (`late`).
    async fn purge_ended(&mut self, log: &jetstream::stream::Stream, now_ms: u64) {
        let Some(keep) = self.config.keep_ended else { return };
        if !self.acting() || !self.caught_up() || self.purging.as_ref().is_some_and(|p| !p.is_finished()) {
            return;
        }
        if let Some(round) = self.purging.take() {
            match round.await {
                Ok((failed, singles_failed)) => {
                    self.purge_again.extend(failed);
                    self.late.give_back(singles_failed);
                }
                Err(e) => warn!(error = %e, "a purge round panicked"),
            }
        }
        if !std::mem::replace(&mut self.removal_resumed, true) {
            let mut in_doubt = std::mem::take(&mut self.in_doubt);
            let again: Vec<Purge> = self
                .state
                .removing()
                .iter()
                .map(|workflow| {
                    let seqs = ids::submission_seq(&workflow).and_then(|n| in_doubt.remove(&n));
                    Purge { workflow, seqs }
                })
                .collect();
            if !again.is_empty() {
                info!(workflows = again.len(), "removing again what the latest purge record's round removes");
                self.purge_again.extend(again);
            }
        }
        let mut work = std::mem::take(&mut self.purge_again);
        let due = if work.is_empty() {
            self.state.due_for_purge(now_ms.saturating_sub(keep.as_millis() as u64), PURGE_BATCH)
        } else {
            Vec::new()
        };
        if !due.is_empty() {
            let mut removing = flowmesh_domain::ids::WorkflowIds::default();
            due.iter().for_each(|id| removing.insert(id));
            let mut record = self.state.purged().clone();
            record.extend(&removing);
            let body =
                EventBody::WorkflowsPurged(flowmesh_domain::event::WorkflowsPurged { workflows: record, removing });
            if let Err(e) = self.publish_all(vec![body]).await {
                warn!(error = %e, workflows = due.len(), "could not store a purge record; purging nothing this round");
                self.purge_again = work;
                return;
            }
            work.extend(due.into_iter().map(|workflow| {
                // Copied: the record's fold moves them aside (`in_doubt`) until the next record.
                let seqs = ids::submission_seq(&workflow).and_then(|n| self.event_seqs.get(&n)).cloned();
                Purge { workflow, seqs }
            }));
        }
        // A burst's worth of entries gone: give the table's room back too.
        if self.event_seqs.capacity() > 4 * self.event_seqs.len().max(1024) {
            self.event_seqs.shrink_to_fit();
        }
        let stale = self.record_seqs.len().saturating_sub(1);
        let mut singles: Vec<u64> = self.record_seqs.drain(..stale).collect();
        singles.extend(self.late.take(PURGE_BATCH));
        if !work.is_empty() || !singles.is_empty() {
            let round = purge_workflows(self.handles.js.clone(), log.clone(), work, singles);
            self.purging = Some(tokio::spawn(round));
        }
    }

    /// Workers that left cleanly while this router could not see it (before it ran, or while it
    /// stood by) are known as such before its first decision: what they held and never started
    /// was handed back, not lost (`FleetIndex::depart`). Only the workers that tasks are on and
    /// that have no snapshot here are asked about, one read of the bucket each:
    /// bounded by the work in flight, not by every worker that ever left.
    async fn read_departures(&mut self) -> Result<(), EdgeError> {
        let unseen: Vec<String> = self
            .state
            .workers_holding_tasks()
            .into_iter()
            .filter(|id| !self.fleet.contains_key(*id))
            .map(str::to_owned)
            .collect();
        for id in unseen {
            let entry = self
                .handles
                .workers
                .entry(&id)
                .await
                .map_err(|e| EdgeError::transient(format!("reading worker {id}'s snapshot"), e))?;
            if entry.is_some_and(|e| matches!(e.operation, kv::Operation::Delete | kv::Operation::Purge)) {
                self.live.depart(&id);
            }
        }
        Ok(())
    }

    /// Every worker id the router remembers: a snapshot, a clean departure, an incarnation in
    /// the fold. Live workers and those not yet gone for good (`forget_gone_workers`).
    fn remembered_workers(&self) -> BTreeSet<&String> {
        let mut ids: BTreeSet<&String> = self.fleet.keys().collect();
        ids.extend(self.state.joined_workers.keys().chain(self.state.lost_workers.keys()));
        ids.extend(self.live.departed_ids());
        ids
    }

    /// What `flowmesh.router.status` answers (the gauges follow it).
    fn status(&self) -> serde_json::Value {
        let now = clock::now_ms();
        // One walk for both counts, in place: at 10,000 workflows in flight two walks in order
        // held the tick's loop 9-11 ms (BENCHMARKS, "Twenty-first round").
        let (running, pending) = self.state.running_workflows_unordered().fold((0, 0), |(running, pending), wf| {
            (running + 1, pending + wf.tasks.iter().filter(|t| t.status == TaskStatus::Pending).count())
        });
        let live = self.fleet.values().filter(|s| s.is_live(now, self.contact_since_ms)).count();
        metrics::gauge!("flowmesh_router_leader").set(if self.leader { 1.0 } else { 0.0 });
        metrics::gauge!("flowmesh_tasks_pending").set(pending as f64);
        metrics::gauge!("flowmesh_workflows_running").set(running as f64);
        metrics::gauge!("flowmesh_live_workers").set(live as f64);
        let known = self.remembered_workers().len();
        metrics::gauge!("flowmesh_known_workers").set(known as f64);
        serde_json::json!({
            "instance": self.config.instance,
            "leader": self.leader,
            "caught_up": self.caught_up(),
            "last_seq": self.state.last_seq,
            "workflows": self.state.decided_workflows(),
            "running_workflows": running,
            "live_workers": live,
            "known_workers": known,
            "purged_workflows": self.state.purged().len(),
            "late_events_to_delete": self.late.len(),
            "unreadable_events": self.unreadable,
        })
    }

    /// Drops from the fold what ended: the router holds what runs, not history. The rounds let
    /// go of the slots those workflows were counted in (an ended workflow dropped before the
    /// next round looked at it would keep them until a whole round). Freeing them is left to the
    /// blocking pool, so that no event waits for it.
    fn forget_ended(&mut self) {
        let mut dropped = Vec::new();
        self.state.forget_ended_into(&mut dropped);
        self.requests.forgotten(&dropped);
        if !dropped.is_empty() {
            tokio::task::spawn_blocking(move || drop(dropped));
        }
    }

    fn caught_up(&self) -> bool {
        self.state.last_seq >= self.target_seq
    }

    /// Whether this router may decide and publish now: it leads, and its last renewal is recent
    /// enough that no standby can have taken the lease over (`lease::Held`).
    fn acting(&self) -> bool {
        self.leader && self.held.at(std::time::Instant::now())
    }

    /// Notes whether the router can reach NATS now; regaining contact starts every worker's
    /// grace period (`Seen::is_live`).
    fn note_contact(&mut self, connected: bool) {
        if !connected {
            self.out_of_contact = true;
        } else if self.out_of_contact {
            self.out_of_contact = false;
            self.contact_since_ms = clock::now_ms();
            info!("contact with NATS regained; workers get a TTL to be heard before they are judged");
        }
    }

    async fn renew_lease(&mut self) {
        let ttl_ms = self.config.lease_ttl.as_millis() as u64;
        let (control, me) = (&self.handles.control, &self.config.instance);
        let asked = std::time::Instant::now();
        let acquired = lease::acquire(control, me, ttl_ms, clock::now_ms(), &mut self.lease_seen).await;
        if acquired.is_ok() {
            self.note_contact(true);
        }
        if matches!(acquired, Ok(true)) {
            self.held.renewed(asked, self.config.lease_ttl);
        } else {
            self.held.lost();
        }
        match acquired {
            Ok(true) if !self.leader => {
                info!(instance = %self.config.instance, "took the router lease");
                self.leader = true;
                self.resent_after_takeover = false;
                self.departures_read = false;
                self.removal_resumed = false;
            }
            Ok(false) if self.leader => {
                warn!(instance = %self.config.instance, "lost the router lease; standing by");
                self.leader = false;
            }
            Ok(_) => {}
            Err(e) => {
                self.note_contact(false);
                warn!(error = %e, "lease check failed");
                if self.leader {
                    warn!("standing by until the lease can be renewed");
                    self.leader = false;
                }
            }
        }
    }

    /// Publishes events with every ack in flight at once (the client bounds the window), then
    /// waits for all of them, and moves the target so the router waits to see them folded.
    /// Returns the ids of those not stored because another writer's copy stands for them
    /// (`publish::stands_for`: another router's decision for the same attempt, around a lease
    /// changing hands).
    async fn publish_all(&mut self, bodies: Vec<EventBody>) -> Result<Vec<String>, EdgeError> {
        let bodies_len = bodies.len();
        let events: Vec<Event> = bodies
            .into_iter()
            .map(|body| {
                let hint = self.sequence_hint(&body);
                Event::new(body, clock::now_rfc3339(), hint)
            })
            .collect();
        let mut sent = Vec::with_capacity(events.len());
        for event in &events {
            // A merged task's completion carries the result of the worker that ran the shared
            // execution, in that worker's name: completions are only ever believed under a
            // worker's name (`Event::read`), and the fold takes this one only from that worker.
            let author = match &event.body {
                EventBody::TaskCompleted(c) => Author::Worker(&c.worker_id),
                _ => Author::Service,
            };
            sent.push(publish::send_event(&self.handles.js, event, author).await?);
        }
        let mut stood_for = Vec::new();
        for (in_flight, event) in sent.into_iter().zip(events) {
            let settled = in_flight.settled(&self.handles.js).await?;
            self.target_seq = self.target_seq.max(settled.sequence());
            debug!(event = %event.id, kind = event.body.kind(), ?settled, "published");
            if let publish::Settled::StoodFor(_) = settled {
                stood_for.push(event.id);
            }
        }
        metrics::counter!("flowmesh_router_events_published_total").increment(bodies_len as u64);
        Ok(stood_for)
    }

    /// The counter in ids of events that may repeat for one cause (`pending.<n>`).
    fn sequence_hint(&self, body: &EventBody) -> u64 {
        match body {
            EventBody::TaskPending(e) => self.state.task(&e.task.task_id).map_or(0, |t| t.pending_events),
            _ => 0,
        }
    }

    async fn act(&mut self) -> Result<(), EdgeError> {
        if !self.acting() || !self.caught_up() {
            return Ok(());
        }
        if !self.departures_read {
            // Nothing is decided until then: a task handed back unrun would be taken for lost.
            self.read_departures().await?;
            self.departures_read = true;
        }
        let now = clock::now_ms();
        // Fleet changes first: they change what the scheduler may do. Every worker is looked at
        // on the tick (a snapshot ages out with time); in between, those whose snapshot arrived.
        let mut fleet_events = Vec::new();
        let Router { fleet, live, state, fleet_changed, contact_since_ms, .. } = self;
        let mut look = |id: &String, seen: &mut Seen| {
            let incarnation = &seen.snapshot.started_at;
            if seen.is_live(now, *contact_since_ms) {
                if !seen.indexed {
                    live.put(&seen.snapshot);
                    seen.indexed = true;
                }
                if state.joined_workers.get(id) != Some(incarnation) {
                    fleet_events.push(EventBody::WorkerJoined(WorkerJoined {
                        worker_id: id.clone(),
                        started_at: incarnation.clone(),
                        supported_task_types: seen.snapshot.supported_task_types.clone(),
                        gpus: seen.snapshot.hardware.gpus.len(),
                        simulated: seen.snapshot.simulated,
                    }));
                }
            } else {
                if seen.left {
                    live.depart(id);
                } else {
                    live.remove(id);
                }
                seen.indexed = false;
                if state.joined_workers.get(id) == Some(incarnation) && state.lost_workers.get(id) != Some(incarnation)
                {
                    let reason = if seen.left {
                        "left the fleet".to_owned()
                    } else {
                        format!(
                            "no heartbeat for {}s (ttl {}s)",
                            now.saturating_sub(seen.updated_ms) / 1000,
                            seen.snapshot.ttl_sec
                        )
                    };
                    fleet_events.push(EventBody::WorkerLost(WorkerLost {
                        worker_id: id.clone(),
                        started_at: incarnation.clone(),
                        reason,
                    }));
                }
            }
        };
        if std::mem::take(&mut self.scan_all) {
            fleet_changed.clear();
            for (id, seen) in fleet.iter_mut() {
                look(id, seen);
            }
        } else {
            for id in std::mem::take(fleet_changed) {
                if let Some(seen) = fleet.get_mut(&id) {
                    look(&id, seen);
                }
            }
        }
        // Not yet stored, they are found again on the next tick.
        self.publish_all(fleet_events).await?;
        if !self.resent_after_takeover {
            self.resend_dispatched().await?;
            self.resent_after_takeover = true;
        }
        let deciding = tokio::time::Instant::now();
        let whole = self.requests.is_whole();
        let actions =
            schedule::decide_with(&self.state, &mut self.live, now, &self.config.schedule, &mut self.requests);
        metrics::histogram!("flowmesh_decide_seconds").record(deciding.elapsed().as_secs_f64());
        if whole {
            self.last_whole = (deciding, deciding.elapsed());
        }
        let releases = if std::mem::take(&mut self.look_for_releases) {
            self.releases.look(&self.state, &self.live, &self.config.schedule, now)
        } else {
            Vec::new()
        };
        // A round's events first, all in flight at once. A dispatch carries its task's work
        // order, so the worker runs nothing the log does not show; an order that holds a secret
        // (kept out of the log) is sent on the worker's work subject only once every
        // `task.dispatched` is stored (a crash in between is completed by `resend_dispatched`).
        let mut bodies = Vec::with_capacity(actions.len());
        let mut orders = Vec::new();
        let mut hints = Vec::new();
        let mut waiting = Vec::new();
        for action in actions {
            match action {
                Action::Hint(pending) => waiting.push(pending),
                Action::Publish(body) => {
                    // A prewarm hint is recorded, then delivered on the worker's control subject.
                    if let EventBody::WorkerPrewarmRequested(p) = &body {
                        hints.push((subjects::prewarm(&p.worker_id), p.model.clone()));
                    }
                    bodies.push(body);
                }
                Action::Dispatch { mut event, mut order } => {
                    if !order.needs_secrets() {
                        event.order = Some(Box::new(order));
                        bodies.push(EventBody::TaskDispatched(event));
                        continue;
                    }
                    // A task whose secret cannot be read yet stays waiting; others go ahead.
                    if let Err(e) = secrets::restore(&self.handles.js, &mut order).await {
                        warn!(task_id = %order.task_id, error = %e, "secret not readable; dispatch deferred");
                        continue;
                    }
                    let worker = event.worker_id.clone();
                    let body = EventBody::TaskDispatched(event);
                    orders.push((body.derive_id(0), (worker, order)));
                    bodies.push(body);
                }
            }
        }
        let dispatches = bodies.iter().filter(|b| matches!(b, EventBody::TaskDispatched(_))).count();
        let stood_for = self.publish_all(bodies).await?;
        // An order goes only with a dispatch of this router's: where another router's dispatch
        // of the same attempt stood for it, the order is that router's to send.
        let orders: Vec<_> = orders.into_iter().filter(|(id, _)| !stood_for.contains(id)).map(|(_, o)| o).collect();
        for (subject, model) in hints {
            let _ = self.client.publish(subject, model.into()).await;
        }
        // Best effort, asked again on the next tick while the order still waits.
        for release in releases {
            info!(task_id = %release.task_id, worker_id = %release.worker_id, "the queued order could run sooner elsewhere; asking for it back");
            metrics::counter!("flowmesh_releases_asked_total").increment(1);
            let _ = self.client.publish(subjects::release(&release.worker_id), release.task_id.into()).await;
        }
        // Best effort, like the live logs: a watcher that misses one sees the next change.
        for pending in waiting {
            let subject = subjects::hint(&pending.task.workflow_id, &pending.task.task_id);
            let event = Event::new(EventBody::TaskPending(pending), clock::now_rfc3339(), 0);
            let _ = self.client.publish(subject, serde_json::to_vec(&event).expect("events serialize").into()).await;
        }
        self.send_orders(&orders).await?;
        metrics::counter!("flowmesh_dispatches_total").increment(dispatches as u64);
        Ok(())
    }

    /// Sends work orders with every ack in flight at once, then waits for all of them.
    async fn send_orders(&self, orders: &[(String, flowmesh_domain::work::WorkOrder)]) -> Result<(), EdgeError> {
        let mut sent = Vec::with_capacity(orders.len());
        for (worker, order) in orders {
            let payload = serde_json::to_vec(order).expect("work orders serialize");
            sent.push(publish::send(&self.handles.js, subjects::work(worker), &order.msg_id(), payload).await?);
        }
        for in_flight in sent {
            in_flight.stored(&self.handles.js).await?;
        }
        Ok(())
    }

    /// A router that crashed between a `task.dispatched` and the work order holding its secret
    /// left a task no worker has; re-sending the order under its id completes that dispatch (the
    /// stream and the worker's journal drop a copy that did arrive). Every other order is inside
    /// its stored dispatch.
    async fn resend_dispatched(&self) -> Result<(), EdgeError> {
        let mut orders = Vec::new();
        for wf in self.state.running_workflows() {
            for t in wf.tasks.iter().filter(|t| t.status == TaskStatus::Dispatched) {
                let Some(worker) = t.worker_id.as_deref() else {
                    continue;
                };
                if let Ok(spec) = schedule::resolve_spec(wf, t) {
                    let mut order = schedule::work_order(wf, t, spec);
                    if !order.needs_secrets() {
                        continue;
                    }
                    if let Err(e) = secrets::restore(&self.handles.js, &mut order).await {
                        return Err(EdgeError::transient(order.msg_id(), std::io::Error::other(e)));
                    }
                    orders.push((worker.to_owned(), order));
                }
            }
        }
        self.send_orders(&orders).await
    }

    /// Cancellation reaches a running task through its worker's control subject; repeating it
    /// each tick covers a worker that had not started the task when the first one went out.
    async fn resend_cancels(&self) {
        if !self.leader {
            return;
        }
        for wf in self.state.running_workflows_unordered() {
            for t in wf.tasks.iter().filter(|t| t.cancel_requested && t.status.is_on_worker()) {
                if let Some(worker) = t.worker_id.as_deref() {
                    let _ = self.client.publish(subjects::cancel(worker), t.def.task_id.clone().into()).await;
                }
            }
        }
    }
}

/// A whole round is never asked for more often than keeps it under a fiftieth of the router's
/// time, and at least every `WHOLE_ROUND_AT_LEAST_EVERY`: on every tick while what runs is small
/// (a round of everything costs well under 10 ms), every few seconds with tens of thousands of
/// workflows waiting.
fn whole_round_every(last_cost: Duration, tick: Duration) -> Duration {
    (last_cost * 50).clamp(tick, WHOLE_ROUND_AT_LEAST_EVERY.max(tick))
}

/// The longest a time-based rule (the no-worker grace) waits past its time to be looked at.
const WHOLE_ROUND_AT_LEAST_EVERY: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::{
        Seqs, gone_for_good, heard_within_ttl, keep_ended, keep_ended_sec, received_before_start, whole_round_every,
    };
    use std::time::Duration;

    #[test]
    fn a_worker_is_live_within_its_ttl_whatever_its_snapshot_says() {
        for (now_ms, heard_ms, ttl_sec, live) in [
            (10_000, 0, 10, true),
            (10_001, 0, 10, false),
            (5_000, 5_000, 0, true),
            (5_001, 5_000, 0, false),
            // Heard "after" now (another thread's clock read): live.
            (1_000, 2_000, 0, true),
            // A TTL whose milliseconds do not fit in u64: for ever, not an overflow.
            (u64::MAX, 0, u64::MAX, true),
            (u64::MAX, 0, u64::MAX / 1000 + 1, true),
            (u64::MAX, 0, 0, false),
        ] {
            assert_eq!(heard_within_ttl(now_ms, heard_ms, ttl_sec), live, "{now_ms} {heard_ms} {ttl_sec}");
        }
    }

    #[test]
    fn a_worker_is_forgotten_once_gone_for_good() {
        let day = 24 * 3600 * 1000;
        // (live, left, settled, silent for, forgotten)
        for (live, left, settled, silent_ms, forgotten, why) in [
            (true, false, true, 0, false, "live"),
            (false, true, true, 0, true, "left cleanly, its loss folded: that incarnation is over"),
            (false, true, false, day, false, "left, but its loss is not yet in the fold"),
            (false, false, true, 60_000, false, "silent a minute: it may come back as the same incarnation"),
            (false, false, true, day - 1, false, "silent just under the limit"),
            (false, false, true, day, true, "silent a whole day, its loss folded"),
            (false, false, false, 2 * day, false, "silent, its loss not yet folded"),
        ] {
            assert_eq!(gone_for_good(live, left, settled, silent_ms, day), forgotten, "{why}");
        }
    }

    #[test]
    fn a_workflow_s_sequences_are_kept_in_order_in_place_and_beyond() {
        for count in [0, 1, 3, 4, 5, 9] {
            let mut seqs = Seqs::default();
            (1..=count).for_each(|seq| seqs.push(seq * 10));
            assert_eq!(seqs.iter().collect::<Vec<_>>(), (1..=count).map(|seq| seq * 10).collect::<Vec<_>>());
            assert_eq!(
                seqs.more.len() as u64,
                count.saturating_sub(4),
                "{count}: only what does not fit goes to the heap"
            );
        }
    }

    #[test]
    fn the_kept_period_is_for_ever_or_at_least_a_minute() {
        for (text, want) in [
            ("0", Ok(None)),
            ("60", Ok(Some(60))),
            ("604800", Ok(Some(604_800))),
            ("59", Err("shorter than a minute")),
            ("1", Err("shorter than a minute")),
            ("-1", Err("not a number of seconds")),
            ("a week", Err("not a number of seconds")),
        ] {
            let got = keep_ended_sec(text).map(|sec| keep_ended(sec).map(|d| d.as_secs()));
            match (got, want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{text}"),
                (Err(got), Err(want)) => assert!(got.contains(want), "{text}: {got}"),
                (got, want) => panic!("{text}: {got:?}, wanted {want:?}"),
            }
        }
    }

    #[test]
    fn a_whole_round_is_paced_by_its_cost() {
        let tick = Duration::from_millis(500);
        let ms = Duration::from_millis;
        // (last whole round's cost, how long until the next one)
        for (cost, every) in [
            (ms(0), tick),
            (ms(2), tick),
            (ms(10), tick),
            (ms(20), ms(1_000)),
            (ms(70), ms(3_500)),
            (ms(400), ms(5_000)),
        ] {
            assert_eq!(whole_round_every(cost, tick), every, "a whole round of {cost:?}");
        }
        // A tick longer than the bound still gives one whole round per tick.
        assert_eq!(whole_round_every(ms(1), Duration::from_secs(8)), Duration::from_secs(8));
    }

    /// Ages are taken between server timestamps, so any offset of the router's clock cancels out.
    #[test]
    fn snapshot_ages_at_start_do_not_depend_on_the_router_clock() {
        let server = [1_000_000u64, 1_000_000 - 5_000, 1_000_000 - 300_000];
        let freshest = 1_000_000;
        for router_now in [1_000_000u64, 1_000_000 + 3_600_000, 1_000_000 - 600_000] {
            let ages: Vec<u64> =
                server.iter().map(|&c| router_now - received_before_start(c, freshest, router_now)).collect();
            assert_eq!(ages, vec![0, 5_000, 300_000], "router clock at {router_now}");
        }
        // A clock at zero (or an entry older than the epoch of the router's clock) never underflows.
        assert_eq!(received_before_start(0, 10_000, 5_000), 0);
    }
}
