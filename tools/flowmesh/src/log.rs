//! Reading the event log: a one-off read up to now, or following it, with a subject filter so
//! looking at one workflow does not read the whole log. One ordered consumer per read.

use async_nats::jetstream::{self, consumer};
use flowmesh_domain::Event;
use flowmesh_nats::{retry, subjects};
use futures_util::{Stream, StreamExt};

/// Events matching `filter` (`flowmesh.events.>` for all), oldest first. Without `follow`, the
/// stream ends at the last event present when it was opened.
pub async fn events(
    js: &jetstream::Context,
    filter: String,
    follow: bool,
) -> anyhow::Result<impl Stream<Item = anyhow::Result<Event>>> {
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
    Ok(futures_util::stream::unfold((messages, done), move |(mut messages, done)| async move {
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
                    let last = !follow && message.info().map(|i| i.pending == 0).unwrap_or(false);
                    let event = serde_json::from_slice::<Event>(&message.payload)
                        .map_err(|e| anyhow::anyhow!("event on {} is not readable: {e}", message.subject));
                    return Some((event, (messages, last)));
                }
            }
        }
    }))
}

/// The fold over every event matching `filter`, up to now.
pub async fn fold(js: &jetstream::Context, filter: String) -> anyhow::Result<flowmesh_domain::state::State> {
    let mut state = flowmesh_domain::state::State::default();
    let stream = events(js, filter, false).await?;
    futures_util::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        state.apply(&event?);
    }
    Ok(state)
}

/// The fold of the workflow that holds task `task_id`, read with that workflow's filter: a task
/// is born in its workflow's `submission.accepted`, which its own subjects do not match.
pub async fn fold_task(js: &jetstream::Context, task_id: &str) -> anyhow::Result<flowmesh_domain::state::State> {
    let workflow_id = flowmesh_domain::ids::workflow_of_task(task_id)
        .ok_or_else(|| anyhow::anyhow!("{task_id:?} is not a task id (wf-<n>-<stage>)"))?;
    let state = fold(js, subjects::workflow_events(workflow_id)).await?;
    anyhow::ensure!(state.task(task_id).is_some(), "no task {task_id}");
    Ok(state)
}
