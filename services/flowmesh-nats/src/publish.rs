//! Publishing events with their deterministic ids, and telling a retry's duplicate from an id
//! that somebody else claimed first.
//!
//! JetStream drops a message whose `Nats-Msg-Id` it has already stored, on any subject of the
//! stream. Our ids derive from their cause, so a writer that retries after a crash is stored
//! once; but anyone who may write *some* subject of the stream can predict them. Only one author
//! may write a given subject (NATS permissions), so a duplicate whose stored copy is on our own
//! subject is our own earlier publish, and one on another subject is a pre-claimed id: the event
//! is stored again under an id nobody can predict, and the claim is counted. A retry of such an
//! event finds that copy as the latest on its own subject and stores nothing more.

use crate::error::EdgeError;
use crate::subjects;
use async_nats::jetstream::{self, context::PublishAckFuture, message::PublishMessage, publish::PublishAck};
use flowmesh_domain::Event;
use flowmesh_domain::event::Author;
use std::io::Read;
use tracing::warn;

/// A message sent and not yet acknowledged: everything needed to check its ack.
pub struct InFlight {
    ack: PublishAckFuture,
    subject: String,
    msg_id: String,
    payload: Vec<u8>,
}

impl InFlight {
    /// Waits for the stream's ack; returns the stream sequence (for a pre-claimed id, that of
    /// the copy stored again under a fresh id).
    pub async fn stored(self, js: &jetstream::Context) -> Result<u64, EdgeError> {
        let InFlight { ack, subject, msg_id, payload } = self;
        let ack = ack.await.map_err(|e| EdgeError::transient(format!("ack of {msg_id} on {subject}"), e))?;
        settle(js, ack, subject, &msg_id, payload).await
    }
}

/// Sends `payload` on a subject only its author writes, with `msg_id`, without waiting: callers
/// keep many in flight and then wait for each with [`InFlight::stored`].
pub async fn send(
    js: &jetstream::Context,
    subject: String,
    msg_id: &str,
    payload: Vec<u8>,
) -> Result<InFlight, EdgeError> {
    let ack = publish_json(js, subject.clone(), msg_id, payload.clone()).await?;
    Ok(InFlight { ack, subject, msg_id: msg_id.to_owned(), payload })
}

/// Sends `event`, written by `author`, on its subject with `Nats-Msg-Id = event.id`.
pub async fn send_event(js: &jetstream::Context, event: &Event, author: Author<'_>) -> Result<InFlight, EdgeError> {
    let payload = serde_json::to_vec(event).expect("events serialize");
    send(js, subjects::event(&event.subject_suffix(author)), &event.id, payload).await
}

/// Publishes `event` and waits for the ack. Returns the stream sequence (the original one when
/// this author had already stored it).
pub async fn publish_event(js: &jetstream::Context, event: &Event, author: Author<'_>) -> Result<u64, EdgeError> {
    send_event(js, event, author).await?.stored(js).await
}

/// The sequence of a message whose ack came back: for an unexpected duplicate, stores it again
/// under an unpredictable id.
async fn settle(
    js: &jetstream::Context,
    ack: PublishAck,
    subject: String,
    msg_id: &str,
    payload: Vec<u8>,
) -> Result<u64, EdgeError> {
    if !ack.duplicate || stored_on(js, &ack, &subject).await? {
        return Ok(ack.sequence);
    }
    // A retry of an event this author already stored again (its ack was lost, or it stopped
    // before acking its input): that copy is the latest on its own subject.
    if let Some(sequence) = stored_again_on(js, &ack.stream, &subject, msg_id).await? {
        return Ok(sequence);
    }
    metrics::counter!("flowmesh_preclaimed_ids_total").increment(1);
    let fresh = format!("{msg_id}~{}", unpredictable());
    warn!(%msg_id, %subject, claimed_at = ack.sequence, %fresh, "message id was claimed on another subject; storing under a fresh id");
    let ack = publish_json(js, subject.clone(), &fresh, payload).await?;
    let ack = ack.await.map_err(|e| EdgeError::transient(format!("ack of {fresh} on {subject}"), e))?;
    Ok(ack.sequence)
}

/// Whether the message a duplicate ack points at is on `subject`.
async fn stored_on(js: &jetstream::Context, ack: &PublishAck, subject: &str) -> Result<bool, EdgeError> {
    let what = || format!("the message behind duplicate {} of {}", ack.sequence, ack.stream);
    let stream = js.get_stream_no_info(&ack.stream).await.map_err(|e| EdgeError::transient(what(), e))?;
    let stored = stream.get_raw_message(ack.sequence).await.map_err(|e| EdgeError::transient(what(), e))?;
    Ok(stored.subject.as_str() == subject)
}

/// The sequence of the latest message on `subject` when it is `msg_id` stored again under a fresh
/// id (`<msg_id>~…`): only this author writes the subject, so the copy is its own.
async fn stored_again_on(
    js: &jetstream::Context,
    stream: &str,
    subject: &str,
    msg_id: &str,
) -> Result<Option<u64>, EdgeError> {
    use async_nats::jetstream::stream::LastRawMessageErrorKind;
    let what = || format!("the latest message on {subject}");
    let stream = js.get_stream_no_info(stream).await.map_err(|e| EdgeError::transient(what(), e))?;
    let latest = match stream.get_last_raw_message_by_subject(subject).await {
        Ok(latest) => latest,
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(None),
        Err(e) => return Err(EdgeError::transient(what(), e)),
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
    payload: Vec<u8>,
) -> Result<PublishAckFuture, EdgeError> {
    js.send_publish(subject.clone(), PublishMessage::build().payload(payload.into()).message_id(msg_id))
        .await
        .map_err(|e| EdgeError::transient(format!("publish to {subject}"), e))
}
