//! Fills the secret placeholders of a work order (`serve`'s `apiKey`) from the stored submission:
//! the event log never holds the value, only the order sent to the worker that runs the task.

use async_nats::jetstream;
use flowmesh_domain::work::WorkOrder;
use flowmesh_domain::{ids, secret};
use flowmesh_nats::subjects;

/// Puts the task's secrets into `order`; a no-op for an order without placeholders.
pub async fn restore(js: &jetstream::Context, order: &mut WorkOrder) -> Result<(), String> {
    if !secret::is_redacted(&order.spec) {
        return Ok(());
    }
    let seq =
        ids::submission_seq(&order.workflow_id).ok_or_else(|| format!("{} names no submission", order.workflow_id))?;
    let stream = js.get_stream(subjects::SUBMISSIONS_STREAM).await.map_err(|e| e.to_string())?;
    let message = stream
        .get_raw_message(seq)
        .await
        .map_err(|e| format!("submission {seq} of {} is not readable: {e}", order.workflow_id))?;
    secret::restore(std::sync::Arc::make_mut(&mut order.spec), &message.payload, &order.stage)
}
