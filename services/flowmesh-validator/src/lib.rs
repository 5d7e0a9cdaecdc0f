//! The validator: turns raw submissions into `submission.accepted` or `submission.rejected`.
//!
//! Stateless; any number of copies share the durable consumer `validators`. A verdict's id is
//! `sub.<seq>.verdict`, so a submission redelivered after a crash gets the same verdict id and
//! the event stream keeps one. The message is acked only after the verdict is stored.

use async_nats::jetstream::{self, AckKind, consumer::pull};
use flowmesh_domain::event::{Author, SubmissionAccepted, SubmissionRef, SubmissionRejected};
use flowmesh_domain::{Event, EventBody, Problem, Workflow, ids, validate_submission};
use flowmesh_nats::{Handles, Shutdown, clock, publish, subjects};
use futures_util::{FutureExt, StreamExt};
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
    // Off the async workers: the schemas take milliseconds to compile.
    tokio::task::spawn_blocking(flowmesh_domain::schema::compile_submission_schemas).await?;
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
    // time: no verdict waits for another's ack. What has arrived together is handled together
    // (one hand-off to a blocking thread for all of it), so a busy validator pays the hand-offs
    // once per batch, not once per submission.
    let limit = config.in_flight.max(1);
    let mut taken = 0usize;
    let mut batches = tokio::task::JoinSet::new();
    // Each batch's size by its task, so that what a batch took is given back even if it panicked.
    let mut sizes = std::collections::HashMap::new();
    loop {
        tokio::select! {
            next = flowmesh_nats::consume::next(&mut messages, &mut shutdown), if taken < limit => match next {
                Some(message) => {
                    let mut batch = vec![message];
                    while taken + batch.len() < limit {
                        match messages.next().now_or_never() {
                            Some(Some(Ok(message))) => batch.push(message),
                            Some(Some(Err(e))) => {
                                warn!(error = %e, "pull failed; retrying");
                                break;
                            }
                            // Nothing more has arrived, or the stream ended (the next pull says so).
                            _ => break,
                        }
                    }
                    let size = batch.len();
                    taken += size;
                    let (js, instance) = (handles.js.clone(), config.instance.clone());
                    let spawned = batches.spawn(async move { handle(&js, batch, &instance, config.ack_wait).await });
                    sizes.insert(spawned.id(), size);
                }
                None => break,
            },
            Some(done) = batches.join_next_with_id(), if !batches.is_empty() => {
                let id = match done {
                    Ok((id, stored)) => {
                        verdicts += stored as u64;
                        status.set(counted(verdicts));
                        id
                    }
                    Err(e) => {
                        warn!(error = %e, "a batch of submissions ended without its verdicts; they are redelivered after the ack wait");
                        e.id()
                    }
                };
                taken = taken.saturating_sub(sizes.remove(&id).unwrap_or(0));
            }
        }
    }
    while batches.join_next().await.is_some() {}
    info!("validator stopped");
    Ok(())
}

/// Validates a batch, stores its verdicts and acks each message whose verdict is stored;
/// returns how many verdicts were stored.
async fn handle(js: &jetstream::Context, batch: Vec<jetstream::Message>, instance: &str, ack_wait: Duration) -> usize {
    let verdicts = publish_verdicts(js, &batch, instance);
    tokio::pin!(verdicts);
    // Tell the server the messages are being worked on, so a slow validation is not redelivered.
    let every = ack_wait / 2;
    let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    let outcomes = loop {
        tokio::select! {
            outcomes = &mut verdicts => break outcomes,
            _ = progress.tick() => {
                for message in &batch {
                    let _ = message.ack_with(AckKind::Progress).await;
                }
            }
        }
    };
    let mut stored = 0;
    for (message, outcome) in batch.iter().zip(outcomes) {
        match outcome {
            Ok(event) => {
                stored += 1;
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
    stored
}

/// What storing one verdict came to: the event stored, or why not (`None`: the message can
/// never be processed).
pub type Stored = Result<Event, Option<flowmesh_nats::EdgeError>>;

/// Validates one submission and stores its verdict, without acknowledging the message: the
/// caller acks once this returns `Ok`.
pub async fn publish_verdict(js: &jetstream::Context, message: &jetstream::Message, instance: &str) -> Stored {
    let mut stored = publish_verdicts(js, std::slice::from_ref(message), instance).await;
    stored.pop().expect("one outcome per message")
}

/// A submission to validate: its body and the workflow id it would get; `None` where the
/// message was unreadable.
type Document = Option<(bytes::Bytes, String)>;

/// A document's verdict, with its workflow id; `None` where the message was unreadable.
type Verdict = Option<(String, Result<Workflow, Vec<Problem>>)>;

/// The most submission bytes a batch may hold and still be validated on the async worker that
/// took it: one typical document (1.8 KB: about 110 µs of work on a slow day of the project's
/// machine, 350 µs where the YAML parser reads it; BENCHMARKS, the core tables) or a few small
/// ones. Under load batches are larger and go to a blocking thread.
const VALIDATE_IN_PLACE_BYTES: usize = 2 * 1024;

/// Whether a batch is cheap enough to validate without a hand-off: small, and with no `&` or
/// `*` in any document. Anchors and aliases are the one way a small YAML document makes the
/// parser work far beyond its size (a 614-byte alias bomb takes ~0.1 s to reach the node
/// budget); without them the work is bounded by the bytes.
fn validate_in_place(documents: &[Document]) -> bool {
    let mut bytes = 0;
    documents.iter().flatten().all(|(body, _)| {
        bytes += body.len();
        bytes <= VALIDATE_IN_PLACE_BYTES && !body.iter().any(|b| matches!(b, b'&' | b'*'))
    })
}

/// Each document's verdict, in order.
fn validate_all(documents: Vec<Document>) -> Vec<Verdict> {
    documents
        .into_iter()
        .map(|document| {
            let (body, workflow_id) = document?;
            let verdict = std::panic::catch_unwind(|| validate_submission(&body, &workflow_id))
                .unwrap_or_else(|_| Err(vec![Problem::new("/", "the validator failed on this input")]));
            Some((workflow_id, verdict))
        })
        .collect()
}

/// Validates submissions and stores their verdicts, all sent before any ack is awaited; one
/// outcome per message, in order. Acknowledges none of the messages.
#[instrument(skip_all, fields(submissions = messages.len()))]
pub async fn publish_verdicts(js: &jetstream::Context, messages: &[jetstream::Message], instance: &str) -> Vec<Stored> {
    let submissions: Vec<Option<(u64, String, Option<String>)>> = messages
        .iter()
        .map(|message| {
            let info = message.info().ok()?;
            let msg_id = message
                .headers
                .as_ref()
                .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
                .map(|v| v.as_str().to_owned());
            Some((info.stream_sequence, info.stream.to_owned(), msg_id))
        })
        .collect();
    let documents: Vec<Document> = messages
        .iter()
        .zip(&submissions)
        .map(|(message, submission)| Some((message.payload.clone(), ids::workflow_id(submission.as_ref()?.0))))
        .collect();
    // Validation is CPU work on untrusted input, so it goes off the async workers, all of the
    // batch in one hand-off; but a batch of one small plain document (the rule at a steady,
    // light load) costs less than waking a blocking thread and being woken back, so it is
    // validated here. A panic on one document is that document's rejection only.
    let started = std::time::Instant::now();
    let verdicts = if validate_in_place(&documents) {
        validate_all(documents)
    } else {
        tokio::task::spawn_blocking(move || validate_all(documents))
            .await
            // Each document's panic is caught in `validate_all`; the batch's task ending here
            // leaves its messages unacked, and they come again after the ack wait (`run` gives
            // back what it took).
            .expect("a batch's validation runs to its end")
    };
    metrics::histogram!("flowmesh_validation_seconds").record(started.elapsed().as_secs_f64());
    let mut sent = Vec::with_capacity(messages.len());
    for (submission, verdict) in submissions.into_iter().zip(verdicts) {
        let (Some((seq, stream, msg_id)), Some((workflow_id, verdict))) = (submission, verdict) else {
            sent.push(Err(None));
            continue;
        };
        let submission = SubmissionRef { stream, seq, msg_id, validated_by: Some(instance.to_owned()) };
        let (event, payload) = verdict_event(submission, workflow_id, verdict);
        let subject = subjects::event(&event.subject_suffix(Author::Service));
        sent.push(publish::send(js, subject, &event.id, payload).await.map(|f| (event, f)).map_err(Some));
    }
    let mut stored = Vec::with_capacity(sent.len());
    for outcome in sent {
        stored.push(match outcome {
            Ok((event, in_flight)) => match in_flight.stored(js).await {
                Ok(_) => {
                    let verdict =
                        if matches!(event.body, EventBody::SubmissionAccepted(_)) { "accepted" } else { "rejected" };
                    metrics::counter!("flowmesh_verdicts_total", "verdict" => verdict).increment(1);
                    Ok(event)
                }
                Err(e) => Err(Some(e)),
            },
            Err(e) => Err(e),
        });
    }
    stored
}

/// Builds the verdict event and its payload; an accepted workflow too large to record becomes a
/// rejection. The payload is the one serialisation of the event: it is what gets measured and sent.
pub fn verdict_event(
    submission: SubmissionRef,
    workflow_id: String,
    verdict: Result<flowmesh_domain::Workflow, Vec<Problem>>,
) -> (Event, Vec<u8>) {
    let now = clock::now_rfc3339();
    let rejected = |errors| {
        EventBody::SubmissionRejected(SubmissionRejected {
            workflow_id: workflow_id.clone(),
            submission: submission.clone(),
            errors: flowmesh_domain::problem::cap(errors),
        })
    };
    let serialised = |body| {
        let event = Event::new(body, now.clone(), 0);
        let payload = serde_json::to_vec(&event).expect("events serialize");
        (event, payload)
    };
    match verdict {
        Ok(workflow) => {
            let task_ids = workflow.tasks.iter().map(|t| t.task_id.clone()).collect();
            let (event, payload) = serialised(EventBody::SubmissionAccepted(SubmissionAccepted {
                workflow_id: workflow_id.clone(),
                submission: submission.clone(),
                task_ids,
                workflow,
            }));
            if payload.len() <= MAX_EVENT_BYTES {
                return (event, payload);
            }
            let size = payload.len();
            serialised(rejected(vec![Problem::new(
                "/spec",
                format!(
                    "the expanded workflow is {size} bytes, over the {MAX_EVENT_BYTES}-byte event limit; use fewer or smaller stages"
                ),
            )]))
        }
        Err(errors) => serialised(rejected(errors)),
    }
}

#[cfg(test)]
mod tests {
    use super::{VALIDATE_IN_PLACE_BYTES, validate_in_place};

    /// A batch of these bodies; `None` stands for an unreadable message.
    fn batch(bodies: &[Option<&str>]) -> Vec<super::Document> {
        bodies.iter().map(|b| b.map(|b| (bytes::Bytes::from(b.to_owned()), "wf".to_owned()))).collect()
    }

    #[test]
    fn only_a_small_batch_with_no_anchor_or_alias_is_validated_in_place() {
        let plain = Some("kind: EchoTask\nspec:\n  taskType: echo\n");
        let large = "x".repeat(VALIDATE_IN_PLACE_BYTES + 1);
        let half = "x".repeat(VALIDATE_IN_PLACE_BYTES / 2 + 1);
        let cases = [
            ("one plain document", vec![plain], true),
            ("a few plain documents", vec![plain, plain, plain], true),
            ("an unreadable message among them", vec![plain, None], true),
            ("nothing", vec![], true),
            ("one document over the limit", vec![Some(large.as_str())], false),
            ("two that are over it together", vec![Some(half.as_str()), Some(half.as_str())], false),
            ("an anchor", vec![plain, Some("a: &x [1]\n")], false),
            ("an alias", vec![Some("b: *x\n")], false),
        ];
        for (what, bodies, want) in cases {
            assert_eq!(validate_in_place(&batch(&bodies)), want, "{what}");
        }
    }
}
