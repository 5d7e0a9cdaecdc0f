//! Pulling the next message of a JetStream consumer while honouring a shutdown.

use crate::shutdown::Shutdown;
use async_nats::jetstream;
use futures_util::{Stream, StreamExt};
use tracing::warn;

/// The next message, or `None` once `shutdown` fires or the consumer ends. Pull errors (a
/// reconnect, a missed heartbeat) are logged and waited out: the consumer resumes by itself.
pub async fn next<E: std::fmt::Display>(
    messages: &mut (impl Stream<Item = Result<jetstream::Message, E>> + Unpin),
    shutdown: &mut Shutdown,
) -> Option<jetstream::Message> {
    loop {
        tokio::select! {
            _ = shutdown.wait() => return None,
            next = messages.next() => match next {
                Some(Ok(message)) => return Some(message),
                Some(Err(e)) => warn!(error = %e, "pull failed; retrying"),
                None => return None,
            },
        }
    }
}
