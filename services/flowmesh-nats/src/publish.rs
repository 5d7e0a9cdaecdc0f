//! Publishing events with their deterministic ids, and telling a retry's duplicate from an id
//! that somebody else claimed first.
//!
//! JetStream drops a message whose `Nats-Msg-Id` it has already stored, on any subject of the
//! stream. Our ids derive from their cause, so a writer that retries after a crash is stored
//! once; but anyone who may write *some* subject of the stream can predict them. NATS
//! permissions say who may write which subject, so the stored copy a duplicate points at stands
//! for our message when its subject says the same writer wrote it (a retry, or another instance
//! of the same service: two routers dispatching one attempt), or when it ends the same task
//! attempt and was written by someone who may end it (see [`stands_for`]). Any other copy is a
//! pre-claimed id: the message is stored again under an id nobody can predict, and the claim is
//! counted. A retry of such a message finds that copy as the latest on its own subject and
//! stores nothing more.

use crate::error::EdgeError;
use crate::subjects;
use async_nats::jetstream::{self, context::PublishAckFuture, message::PublishMessage, publish::PublishAck};
use bytes::Bytes;
use flowmesh_domain::Event;
use flowmesh_domain::event::Author;
use std::io::Read;
use tracing::{info, warn};

/// A message sent and not yet acknowledged: everything needed to check its ack.
pub struct InFlight {
    ack: PublishAckFuture,
    subject: String,
    msg_id: String,
    /// Shared with the message sent, not copied: kept only to check a duplicate's copy.
    payload: Bytes,
}

/// What became of a message: stored as sent (a retry finding its own earlier copy included), or
/// not stored because a copy another writer stored first stands for it ([`stands_for`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    Written(u64),
    StoodFor(u64),
}

impl Settled {
    /// The stream sequence of the message, or of the copy that stands for it.
    pub fn sequence(self) -> u64 {
        match self {
            Settled::Written(sequence) | Settled::StoodFor(sequence) => sequence,
        }
    }
}

impl InFlight {
    /// Waits for the stream's ack; returns the stream sequence (for a pre-claimed id, that of
    /// the copy stored again under a fresh id; where another writer's copy stands for it, that
    /// copy's).
    pub async fn stored(self, js: &jetstream::Context) -> Result<u64, EdgeError> {
        self.settled(js).await.map(Settled::sequence)
    }

    /// [`InFlight::stored`], saying whether the message was stored or another writer's copy
    /// stood for it: a router sends a secret-holding order only for a dispatch of its own.
    pub async fn settled(self, js: &jetstream::Context) -> Result<Settled, EdgeError> {
        let InFlight { ack, subject, msg_id, payload } = self;
        let ack = ack.await.map_err(|e| EdgeError::transient(format!("ack of {msg_id} on {subject}"), e))?;
        if !ack.duplicate {
            return Ok(Settled::Written(ack.sequence));
        }
        // Rare, and it takes requests of its own: boxed, so every writer's wait stays small.
        Box::pin(settle_duplicate(js, ack, subject, &msg_id, payload)).await
    }
}

/// Sends `payload` on a subject only its author writes, with `msg_id`, without waiting: callers
/// keep many in flight and then wait for each with [`InFlight::stored`].
pub async fn send(
    js: &jetstream::Context,
    subject: String,
    msg_id: &str,
    payload: impl Into<Bytes>,
) -> Result<InFlight, EdgeError> {
    let payload = payload.into();
    let ack = publish_json(js, subject.clone(), msg_id, payload.clone()).await?;
    Ok(InFlight { ack, subject, msg_id: msg_id.to_owned(), payload })
}

/// Sends `event`, written by `author`, on its subject with `Nats-Msg-Id = event.id`.
pub async fn send_event(js: &jetstream::Context, event: &Event, author: Author<'_>) -> Result<InFlight, EdgeError> {
    send_written(js, event, author, serde_json::to_vec(event).expect("events serialize").into()).await
}

/// [`send_event`] for an event already serialized as `json` (a worker's report, written to its
/// journal in the same bytes).
pub async fn send_written(
    js: &jetstream::Context,
    event: &Event,
    author: Author<'_>,
    json: Bytes,
) -> Result<InFlight, EdgeError> {
    send(js, subjects::event(&event.subject_suffix(author)), &event.id, json).await
}

/// [`publish_event`] for an event already serialized as `json`.
pub async fn publish_written(
    js: &jetstream::Context,
    event: &Event,
    author: Author<'_>,
    json: Bytes,
) -> Result<u64, EdgeError> {
    send_written(js, event, author, json).await?.stored(js).await
}

/// Publishes `event` and waits for the ack. Returns the stream sequence (the original one when
/// this author had already stored it).
pub async fn publish_event(js: &jetstream::Context, event: &Event, author: Author<'_>) -> Result<u64, EdgeError> {
    send_event(js, event, author).await?.stored(js).await
}

/// What became of a message whose ack said it was a duplicate: when no copy stands for it, it
/// is stored again under an unpredictable id.
async fn settle_duplicate(
    js: &jetstream::Context,
    ack: PublishAck,
    subject: String,
    msg_id: &str,
    payload: Bytes,
) -> Result<Settled, EdgeError> {
    let what = || format!("the message behind duplicate {} of {}", ack.sequence, ack.stream);
    let stream = js.get_stream_no_info(&ack.stream).await.map_err(|e| EdgeError::transient(what(), e))?;
    let copy = stream.get_raw_message(ack.sequence).await.map_err(|e| EdgeError::transient(what(), e))?;
    if copy.subject.as_str() == subject {
        return Ok(Settled::Written(ack.sequence));
    }
    if stands_for((&subject, &payload), (copy.subject.as_str(), &copy.payload)) {
        // Rare, and worth seeing: two routers deciding at once, or two ends of one attempt.
        metrics::counter!("flowmesh_stood_for_total").increment(1);
        info!(%msg_id, %subject, copy = %copy.subject, "another writer stored this first; its copy stands for ours");
        return Ok(Settled::StoodFor(ack.sequence));
    }
    // A retry of an event this author already stored again (its ack was lost, or it stopped
    // before acking its input): that copy is the latest on its own subject.
    if let Some(sequence) = stored_again_on(&stream, &subject, msg_id).await? {
        return Ok(Settled::Written(sequence));
    }
    metrics::counter!("flowmesh_preclaimed_ids_total").increment(1);
    let fresh = format!("{msg_id}~{}", unpredictable());
    warn!(%msg_id, %subject, claimed_at = ack.sequence, %fresh, "message id was claimed on another subject; storing under a fresh id");
    let ack = publish_json(js, subject.clone(), &fresh, payload).await?;
    let ack = ack.await.map_err(|e| EdgeError::transient(format!("ack of {fresh} on {subject}"), e))?;
    Ok(Settled::Written(ack.sequence))
}

/// Whether a message stored first under our message's id, `copy` (subject, payload), stands for
/// `ours`, so that storing ours as well would only repeat it:
/// - its subject says the same writer wrote it: the same worker's reports, any service's events
///   (validators, routers and operators, whom the log trusts alike: two routers that both
///   dispatched one attempt for a moment, around a lease changing hands, or two validators'
///   verdicts), or an order on the work stream, which only routers write;
/// - or both end the same task attempt, and the copy's writer may end it: a service, or the
///   worker that `ours` (a service's end, a lost worker's) names. One end per attempt is what
///   the log keeps; the other end comes second and changes nothing.
///
/// A report in another worker's name, or an unreadable body, stands for nothing: that is a
/// pre-claimed id.
pub fn stands_for(ours: (&str, &[u8]), copy: (&str, &[u8])) -> bool {
    use crate::subjects::{event_suffix, work_worker};
    let ((subject, payload), (copy_subject, copy_payload)) = (ours, copy);
    let (suffix, copy_suffix) = match (event_suffix(subject), event_suffix(copy_subject)) {
        (Some(suffix), Some(copy_suffix)) => (suffix, copy_suffix),
        (None, None) => {
            let both_work = work_worker(subject).is_some() && work_worker(copy_subject).is_some();
            return subject == copy_subject || both_work;
        }
        _ => return false,
    };
    let copy_author = Author::of(copy_suffix);
    if Author::of(suffix) == copy_author {
        return true;
    }
    let (Ok(ours), Ok(copy)) =
        (Event::read_skipping_orders(suffix, payload), Event::read_skipping_orders(copy_suffix, copy_payload))
    else {
        return false;
    };
    let same_end = ours.body.is_task_terminal() && copy.body.is_task_terminal() && ours.body.task() == copy.body.task();
    same_end
        && match copy_author {
            Author::Service => true,
            Author::Worker(worker) => ours.body.reporter() == Some(worker),
        }
}

/// The sequence of the latest message on `subject` when it is `msg_id` stored again under a fresh
/// id (`<msg_id>~…`): only this author writes the subject, so the copy is its own.
async fn stored_again_on(
    stream: &jetstream::stream::Stream<()>,
    subject: &str,
    msg_id: &str,
) -> Result<Option<u64>, EdgeError> {
    use async_nats::jetstream::stream::LastRawMessageErrorKind;
    let latest = match stream.get_last_raw_message_by_subject(subject).await {
        Ok(latest) => latest,
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(None),
        Err(e) => return Err(EdgeError::transient(format!("the latest message on {subject}"), e)),
    };
    let id = latest.headers.get(async_nats::header::NATS_MESSAGE_ID).map(|v| v.as_str());
    let again = id.and_then(|id| id.strip_prefix(msg_id)).is_some_and(|rest| rest.starts_with('~'));
    Ok(again.then_some(latest.sequence))
}

/// 128 bits from the kernel's random source, in hex: an id suffix nobody can guess.
fn unpredictable() -> String {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .expect("the kernel's random source is readable");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Publishes any payload to a stream subject with a message id.
async fn publish_json(
    js: &jetstream::Context,
    subject: String,
    msg_id: &str,
    payload: Bytes,
) -> Result<PublishAckFuture, EdgeError> {
    js.send_publish(subject.clone(), PublishMessage::build().payload(payload).message_id(msg_id))
        .await
        .map_err(|e| EdgeError::transient(format!("publish to {subject}"), e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowmesh_domain::event::{FailureReason, TaskCompleted, TaskDispatched, TaskFailed, TaskRef};
    use flowmesh_domain::{Event, EventBody};

    /// A stored message: (subject, payload).
    type Message = (String, Vec<u8>);

    fn attempt(n: u32) -> TaskRef {
        TaskRef { workflow_id: "wf-3".into(), task_id: "wf-3-s1".into(), stage: "s1".into(), attempt: n }
    }

    /// `body` as `author` writes it: (subject, payload).
    fn written(body: EventBody, author: Author<'_>) -> Message {
        let event = Event::new(body, "2026-11-27T00:00:00Z".into(), 0);
        (subjects::event(&event.subject_suffix(author)), serde_json::to_vec(&event).unwrap())
    }

    fn completed(n: u32, worker: &str) -> Message {
        let body = TaskCompleted {
            task: attempt(n),
            worker_id: worker.into(),
            result: None,
            result_object: None,
            artifacts: Vec::new(),
            upload_ms: None,
            started_at: None,
        };
        written(EventBody::TaskCompleted(body), Author::Worker(worker))
    }

    /// The router's end of an attempt whose worker was lost (`worker`), or that none held.
    fn lost(n: u32, worker: Option<&str>) -> Message {
        let body = TaskFailed {
            task: attempt(n),
            worker_id: worker.map(str::to_owned),
            reason: FailureReason::WorkerLost,
            message: "lost".into(),
            retryable: false,
        };
        written(EventBody::TaskFailed(body), Author::Service)
    }

    fn dispatched(worker: &str) -> Message {
        let body = TaskDispatched {
            task: attempt(1),
            worker_id: worker.into(),
            task_type: "echo".into(),
            message: String::new(),
            order: None,
        };
        written(EventBody::TaskDispatched(body), Author::Service)
    }

    #[test]
    fn a_copy_stands_for_ours_when_its_writer_may_have_written_ours_or_ended_the_same_attempt() {
        let claim = (subjects::event("evil.wf-3.wf-3-s1.task.updated"), b"{}".to_vec());
        let work = |w: &str| (subjects::work(w), b"order".to_vec());
        #[rustfmt::skip]
        let table: Vec<(&str, Message, Message, bool)> = vec![
            ("the same report again", completed(1, "w1"), completed(1, "w1"), true),
            ("two routers dispatching one attempt", dispatched("w2"), dispatched("w1"), true),
            ("two routers' orders for one attempt", work("w2"), work("w1"), true),
            ("the worker's end after the router's", completed(1, "w1"), lost(1, Some("w1")), true),
            ("the router's end after that worker's", lost(1, Some("w1")), completed(1, "w1"), true),
            ("the router's end after another worker's", lost(1, Some("w1")), completed(1, "w2"), false),
            ("the router's end of an unheld attempt after a worker's", lost(1, None), completed(1, "w2"), false),
            ("a worker's end after another worker's", completed(1, "w1"), completed(1, "w2"), false),
            ("a worker's end after a claim in its id", completed(1, "w1"), claim.clone(), false),
            ("a service's event after a claim in its id", dispatched("w1"), claim, false),
            ("the router's end of another attempt", completed(1, "w1"), lost(2, Some("w1")), false),
            ("an order after an event", work("w1"), dispatched("w1"), false),
        ];
        for (case, ours, copy, expected) in table {
            let found = stands_for((&ours.0, &ours.1), (&copy.0, &copy.1));
            assert_eq!(found, expected, "{case}: {} after {}", ours.0, copy.0);
        }
    }
}
