//! Retention: removing messages of the event log.

use crate::subjects;
use async_nats::jetstream::{Context, ErrorCode, response::Response};

/// Deletes one message of the log by its sequence, without overwriting its bytes (the server
/// marks it deleted); one already gone counts as deleted.
pub async fn delete_event(js: &Context, seq: u64) -> Result<(), String> {
    #[derive(serde::Deserialize)]
    struct Deleted {}
    let request = serde_json::json!({"seq": seq, "no_erase": true});
    let answer: Response<Deleted> =
        js.request(subjects::event_delete_request(), &request).await.map_err(|e| e.to_string())?;
    match answer {
        Response::Ok(_) => Ok(()),
        // "sequence N not found", or "no message found" for one deleted before.
        Response::Err { error }
            if error.error_code() == ErrorCode::SEQUENCE_NOT_FOUND
                || error.to_string().contains("no message found") =>
        {
            Ok(())
        }
        Response::Err { error } => Err(error.to_string()),
    }
}

/// Purges every event of one workflow by its subjects, those a log written before the
/// worker-first layout has included (`subjects::legacy_workflow_events`); returns how many
/// messages went. The costly way (the server recounts every consumer's pending): for a workflow
/// whose sequences the router does not know.
pub async fn purge_workflow(log: &async_nats::jetstream::stream::Stream, workflow_id: &str) -> Result<u64, String> {
    let legacy = subjects::legacy_workflow_events(workflow_id);
    let mut purged = 0;
    for filter in std::iter::once(subjects::workflow_events(workflow_id)).chain(legacy) {
        purged += log.purge().filter(filter).await.map_err(|e| e.to_string())?.purged;
    }
    Ok(purged)
}
