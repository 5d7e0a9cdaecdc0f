//! Publishing events with their deterministic ids, waiting for the stream's acknowledgement.

use crate::error::EdgeError;
use crate::subjects;
use async_nats::jetstream::{self, context::PublishAckFuture, message::PublishMessage};
use flowmesh_domain::Event;

/// Publishes `event` on its subject with `Nats-Msg-Id = event.id` and waits for the ack.
/// Returns the stream sequence (the original one when the server saw a duplicate).
pub async fn publish_event(js: &jetstream::Context, event: &Event) -> Result<u64, EdgeError> {
    let ack = send_event(js, event).await?;
    let ack = ack.await.map_err(|e| EdgeError::transient(format!("ack of event {}", event.id), e))?;
    Ok(ack.sequence)
}

/// Sends without waiting for the ack, for callers that pipeline several events.
pub async fn send_event(js: &jetstream::Context, event: &Event) -> Result<PublishAckFuture, EdgeError> {
    let payload = serde_json::to_vec(event).expect("events serialize");
    publish_json(js, subjects::event(&event.subject_suffix()), &event.id, payload).await
}

/// Publishes any payload to a stream subject with a message id.
pub async fn publish_json(
    js: &jetstream::Context,
    subject: String,
    msg_id: &str,
    payload: Vec<u8>,
) -> Result<PublishAckFuture, EdgeError> {
    js.send_publish(subject.clone(), PublishMessage::build().payload(payload.into()).message_id(msg_id))
        .await
        .map_err(|e| EdgeError::transient(format!("publish to {subject}"), e))
}
