//! The validator: turns raw submissions into `submission.accepted` or `submission.rejected`.
//!
//! Stateless; any number of copies share the durable consumer `validators`. A verdict's id is
//! `sub.<seq>.verdict`, so a submission redelivered after a crash gets the same verdict id and
//! the event stream keeps one. The message is acked only after the verdict is stored.

use async_nats::jetstream::{self, AckKind, consumer::pull};
use flowmesh_domain::event::{Author, SubmissionAccepted, SubmissionRef, SubmissionRejected};
use flowmesh_domain::{Event, EventBody, Problem, ids, validate_submission};
use flowmesh_nats::{Handles, Shutdown, clock, publish, subjects};
use std::time::Duration;
use tracing::{info, instrument, warn};

/// Largest event we will try to store; the events stream refuses anything over 1 MiB.
const MAX_EVENT_BYTES: usize = 1024 * 1024 - 4096;

#[derive(Debug, Clone)]
pub struct Config {
    /// The durable consumer shared by all validators.
    pub consumer: String,
    /// How long the server waits for an ack before redelivering to another validator.
    pub ack_wait: Duration,
    /// This instance's name, recorded in its verdicts.
    pub instance: String,
    /// Submissions pulled at a time; small batches spread the load over many validators.
    pub batch: usize,
    /// Submissions being validated, or their verdicts being stored, at once.
    pub in_flight: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            consumer: subjects::VALIDATORS_CONSUMER.to_owned(),
            // Short, so that what a killed validator had pulled goes to another one soon; a long
            // validation keeps its message with progress acks instead (`handle`).
            ack_wait: Duration::from_secs(5),
            instance: format!("{}-{}", flowmesh_nats::host::name(), std::process::id()),
            batch: 64,
            in_flight: 64,
        }
    }
}

/// The shared durable consumer, created on first use and brought to this configuration on every
/// start (an older deployment's ack wait is updated, not kept).
pub async fn consumer(
    js: &jetstream::Context,
    config: &Config,
) -> anyhow::Result<jetstream::consumer::Consumer<pull::Config>> {
    let stream = js.get_stream(subjects::SUBMISSIONS_STREAM).await?;
    Ok(stream
        .create_consumer(pull::Config {
            durable_name: Some(config.consumer.clone()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait: config.ack_wait,
            max_ack_pending: 256,
            ..Default::default()
        })
        .await?)
}

/// Runs until `shutdown` fires.
pub async fn run(config: Config, handles: Handles, mut shutdown: Shutdown) -> anyhow::Result<()> {
    let consumer = consumer(&handles.js, &config).await?;
    let status = flowmesh_nats::status::Status::default();
    let mut verdicts = 0u64;
    let counted = |verdicts: u64| serde_json::json!({ "instance": config.instance, "consumer": config.consumer, "verdicts": verdicts });
    status.set(counted(verdicts));
    let _service = flowmesh_nats::status::serve(
        &handles.js.client(),
        "validator",
        "validator",
        "FlowMesh validator: submissions to verdicts",
        status.clone(),
    )
    .await?;
    let mut messages = consumer.stream().max_messages_per_batch(config.batch).messages().await?;
    info!(consumer = %config.consumer, "validator ready");
    // Submissions are validated and their verdicts stored concurrently, up to `in_flight` at a
    // time: no verdict waits for another's ack.
    let limit = config.in_flight.max(1);
    let mut in_flight = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            next = flowmesh_nats::consume::next(&mut messages, &mut shutdown), if in_flight.len() < limit => match next {
                Some(message) => {
                    let (js, instance) = (handles.js.clone(), config.instance.clone());
                    in_flight.spawn(async move { handle(&js, message, &instance, config.ack_wait).await });
                }
                None => break,
            },
            Some(_) = in_flight.join_next(), if !in_flight.is_empty() => {
                verdicts += 1;
                status.set(counted(verdicts));
            }
        }
    }
    while in_flight.join_next().await.is_some() {}
    info!("validator stopped");
    Ok(())
}

async fn handle(js: &jetstream::Context, message: jetstream::Message, instance: &str, ack_wait: Duration) {
    let verdict = publish_verdict(js, &message, instance);
    tokio::pin!(verdict);
    // Tell the server the message is being worked on, so a slow validation is not redelivered.
    let every = ack_wait / 2;
    let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    let outcome = loop {
        tokio::select! {
            outcome = &mut verdict => break outcome,
            _ = progress.tick() => { let _ = message.ack_with(AckKind::Progress).await; }
        }
    };
    match outcome {
        Ok(event) => {
            info!(workflow_id = %event.body.scope().0, verdict = event.body.kind(), "verdict stored");
            if let Err(e) = message.ack().await {
                // The verdict is stored; a redelivery re-derives the same id and is deduplicated.
                warn!(error = %e, "ack failed after the verdict was stored");
            }
        }
        Err(Some(e)) => {
            warn!(error = %e, "could not store the verdict; will retry");
            let _ = message.ack_with(AckKind::Nak(Some(Duration::from_secs(1)))).await;
        }
        Err(None) => {
            warn!("message without JetStream metadata; terminating it");
            let _ = message.ack_with(AckKind::Term).await;
        }
    }
}

/// Validates one submission and stores its verdict, without acknowledging the message: the
/// caller acks once this returns `Ok`. `Err(None)` means the message can never be processed.
#[instrument(skip_all, fields(seq))]
pub async fn publish_verdict(
    js: &jetstream::Context,
    message: &jetstream::Message,
    instance: &str,
) -> Result<Event, Option<flowmesh_nats::EdgeError>> {
    let (seq, stream) = match message.info() {
        Ok(info) => (info.stream_sequence, info.stream.to_owned()),
        Err(_) => return Err(None),
    };
    tracing::Span::current().record("seq", seq);
    let msg_id = message
        .headers
        .as_ref()
        .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
        .map(|v| v.as_str().to_owned());
    let body = message.payload.to_vec();
    let workflow_id = ids::workflow_id(seq);
    let wf = workflow_id.clone();
    // Validation is CPU work on untrusted input: keep it off the async workers.
    let started = std::time::Instant::now();
    let verdict = tokio::task::spawn_blocking(move || validate_submission(&body, &wf)).await;
    metrics::histogram!("flowmesh_validation_seconds").record(started.elapsed().as_secs_f64());
    let verdict =
        verdict.unwrap_or_else(|e| Err(vec![Problem::new("/", format!("validator failed on this input: {e}"))]));
    let submission = SubmissionRef { stream, seq, msg_id, validated_by: Some(instance.to_owned()) };
    let event = verdict_event(submission, workflow_id, verdict);
    publish::publish_event(js, &event, Author::Service).await.map_err(Some)?;
    let verdict = if matches!(event.body, EventBody::SubmissionAccepted(_)) { "accepted" } else { "rejected" };
    metrics::counter!("flowmesh_verdicts_total", "verdict" => verdict).increment(1);
    Ok(event)
}

/// Builds the verdict event; an accepted workflow too large to record becomes a rejection.
pub fn verdict_event(
    submission: SubmissionRef,
    workflow_id: String,
    verdict: Result<flowmesh_domain::Workflow, Vec<Problem>>,
) -> Event {
    let now = clock::now_rfc3339();
    let rejected = |errors| {
        EventBody::SubmissionRejected(SubmissionRejected {
            workflow_id: workflow_id.clone(),
            submission: submission.clone(),
            errors: flowmesh_domain::problem::cap(errors),
        })
    };
    let body = match verdict {
        Ok(workflow) => {
            let task_ids = workflow.tasks.iter().map(|t| t.task_id.clone()).collect();
            let body = EventBody::SubmissionAccepted(SubmissionAccepted {
                workflow_id: workflow_id.clone(),
                submission: submission.clone(),
                task_ids,
                workflow,
            });
            let size = serde_json::to_vec(&body).map(|v| v.len()).unwrap_or(usize::MAX);
            if size > MAX_EVENT_BYTES {
                rejected(vec![Problem::new(
                    "/spec",
                    format!(
                        "the expanded workflow is {size} bytes, over the {MAX_EVENT_BYTES}-byte event limit; use fewer or smaller stages"
                    ),
                )])
            } else {
                body
            }
        }
        Err(errors) => rejected(errors),
    };
    Event::new(body, now, 0)
}
