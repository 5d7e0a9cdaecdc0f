//! Reading the event log: a one-off read up to now, or following it, with a subject filter so
//! looking at one workflow does not read the whole log. One ordered consumer per read.
//!
//! A message that is not an event its subject's author may write ([`Event::read`]) never stops
//! a reader: it is skipped, counted (`flowmesh_events_unreadable_total`) and, by `events`,
//! shown with its stream sequence and subject.
//!
//! Readers show derived facts as if stored: [`entries`] folds what it reads and puts the
//! `workflow.completed` that nobody stores (a workflow whose every task completed) right after
//! the last task's end (`State::apply_deriving`). Folds ([`fold`]) derive it themselves.

use async_nats::jetstream::{self, consumer};
use flowmesh_domain::Event;
use flowmesh_domain::event::Layout;
use flowmesh_nats::{retry, subjects};
use futures_util::{Stream, StreamExt};

/// A message of the log as a reader sees it.
#[derive(Debug, Clone)]
pub enum Read {
    Event(Box<Event>),
    Skipped(Skipped),
}

/// A message no reader folds: where it is and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Skipped {
    pub seq: u64,
    pub subject: String,
    pub reason: String,
}

/// Events matching `filter`, oldest first, skipping (with a warning) what is not readable.
pub async fn events(
    js: &jetstream::Context,
    filter: String,
    follow: bool,
) -> anyhow::Result<impl Stream<Item = anyhow::Result<Event>>> {
    Ok(entries(js, filter, follow).await?.filter_map(|read| futures_util::future::ready(readable(read))))
}

/// The event read, or `None` (with a warning) for a message that is not one.
fn readable(read: anyhow::Result<Read>) -> Option<anyhow::Result<Event>> {
    match read {
        Ok(Read::Event(event)) => Some(Ok(*event)),
        Ok(Read::Skipped(s)) => {
            tracing::warn!(seq = s.seq, subject = %s.subject, reason = %s.reason, "unreadable event skipped");
            None
        }
        Err(e) => Some(Err(e)),
    }
}

/// Messages matching `filter` (`flowmesh.events.>` for all), oldest first, each derived
/// `workflow.completed` after the task's end that implies it (only where `filter` takes in the
/// workflow's `submission.accepted`, which says what its tasks are). Without `follow`, the
/// stream ends at the last message present when it was opened.
pub async fn entries(
    js: &jetstream::Context,
    filter: String,
    follow: bool,
) -> anyhow::Result<impl Stream<Item = anyhow::Result<Read>>> {
    let stored = stored(js, filter, follow).await?;
    Ok(stored
        .scan(flowmesh_domain::state::State::default(), |state, read| {
            let derived = match &read {
                Ok(Read::Event(event)) => state.apply_deriving(event).1,
                _ => None,
            };
            let reads = std::iter::once(read).chain(derived.map(|event| Ok(Read::Event(Box::new(event)))));
            futures_util::future::ready(Some(futures_util::stream::iter(reads)))
        })
        .flatten())
}

/// The stored messages matching `filter`, oldest first (what [`entries`] reads). A view of part
/// of the log reads first where a log written before the worker-first layout kept the same
/// events (`subjects::legacy_view`; every such event is older than every worker-first one), up
/// to now, then `filter` itself.
async fn stored(
    js: &jetstream::Context,
    filter: String,
    follow: bool,
) -> anyhow::Result<impl Stream<Item = anyhow::Result<Read>>> {
    let legacy = match subjects::legacy_view(&filter) {
        Some(legacy) => Some(read(js, legacy, false, Layout::Legacy).await?),
        None => None,
    };
    let now = read(js, filter, follow, Layout::WorkerFirst).await?;
    Ok(futures_util::stream::iter(legacy).flatten().chain(now))
}

/// The stored messages matching `filter`, oldest first; reading a legacy view, only those in the
/// legacy layout (its filter may take in a worker-first subject whose worker is named like the
/// workflow it looks for).
async fn read(
    js: &jetstream::Context,
    filter: String,
    follow: bool,
    layout: Layout,
) -> anyhow::Result<impl Stream<Item = anyhow::Result<Read>>> {
    // Opening the consumer needs the cluster's meta leader: ride out its election after a node loss.
    let (messages, pending) = retry::patiently("opening the event log", retry::FAILOVER_BUDGET, || async {
        let stream = js.get_stream(subjects::EVENTS_STREAM).await?;
        let mut consumer = stream
            .create_consumer(consumer::pull::OrderedConfig {
                filter_subject: filter.clone(),
                deliver_policy: consumer::DeliverPolicy::All,
                ..Default::default()
            })
            .await?;
        let pending = consumer.info().await?.num_pending;
        Ok((consumer.messages().await?, pending))
    })
    .await?;
    let done = !follow && pending == 0;
    let reads = futures_util::stream::unfold((messages, done), move |(mut messages, done)| async move {
        if done {
            return None;
        }
        loop {
            match messages.next().await? {
                // An ordered consumer rebuilds itself after a reconnect or a server restart;
                // while following, its interim errors are only a pause.
                Err(e) if follow => tracing::debug!(error = %e, "event stream interrupted; resuming"),
                Err(e) => return Some((Err(anyhow::anyhow!("reading events: {e}")), (messages, true))),
                Ok(message) => {
                    let info = message.info().ok();
                    let last = !follow && info.as_ref().is_some_and(|i| i.pending == 0);
                    let suffix = subjects::event_suffix(&message.subject).unwrap_or_default();
                    if layout == Layout::Legacy && Layout::of(suffix) == Layout::WorkerFirst {
                        return Some((Ok(None), (messages, last)));
                    }
                    let read = match Event::read(suffix, &message.payload) {
                        Ok(event) => Read::Event(Box::new(event)),
                        Err(reason) => {
                            metrics::counter!("flowmesh_events_unreadable_total").increment(1);
                            Read::Skipped(Skipped {
                                seq: info.map_or(0, |i| i.stream_sequence),
                                subject: message.subject.to_string(),
                                reason: reason.to_string(),
                            })
                        }
                    };
                    return Some((Ok(Some(read)), (messages, last)));
                }
            }
        }
    });
    Ok(reads.filter_map(|read| futures_util::future::ready(read.transpose())))
}

/// The fold over every event matching `filter`, up to now.
pub async fn fold(js: &jetstream::Context, filter: String) -> anyhow::Result<flowmesh_domain::state::State> {
    let mut state = flowmesh_domain::state::State::default();
    let stream = stored(js, filter, false).await?;
    futures_util::pin_mut!(stream);
    while let Some(read) = stream.next().await {
        if let Some(event) = readable(read) {
            state.apply(&event?);
        }
    }
    Ok(state)
}

/// The fold of the workflow that holds task `task_id`, read with that workflow's filter: a task
/// is born in its workflow's `submission.accepted`, which its own subjects do not match.
pub async fn fold_task(js: &jetstream::Context, task_id: &str) -> anyhow::Result<flowmesh_domain::state::State> {
    let workflow_id = flowmesh_domain::ids::workflow_of_task(task_id)
        .ok_or_else(|| anyhow::anyhow!("{task_id:?} is not a task id (wf-<n>-<stage>)"))?;
    let state = fold(js, subjects::workflow_events(workflow_id)).await?;
    if state.task(task_id).is_none() {
        match purged(js, workflow_id).await {
            Some(why) => anyhow::bail!("{why}"),
            None => anyhow::bail!("no task {task_id}"),
        }
    }
    Ok(state)
}

/// Why the log holds nothing of `workflow_id` where the latest retention record lists it: the
/// router purged its events, and the workers remove its files with them. `None` otherwise (an
/// unreadable record included: the caller then says the workflow is unknown).
pub async fn purged(js: &jetstream::Context, workflow_id: &str) -> Option<String> {
    let (_, purged) = flowmesh_nats::artifacts::purged_workflows(js).await.ok()??;
    purged.contains(workflow_id).then(|| {
        format!(
            "{workflow_id} ended longer ago than the router keeps events (ROUTER_KEEP_ENDED_SEC): its events were \
             purged, and its files are removed with them"
        )
    })
}
