//! Riding out a cluster's failover. While a NATS node is lost, JetStream calls fail for a few
//! seconds (a request times out, nobody answers, a stream or the meta group elects a new leader);
//! `patiently` tries such calls again within a budget and returns every other error at once.

use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::consumer::StreamErrorKind;
use async_nats::jetstream::context::{ConsumerInfoErrorKind, GetStreamErrorKind, PublishErrorKind, RequestErrorKind};
use async_nats::jetstream::stream::ConsumerErrorKind;
use async_nats::jetstream::{self, consumer, context, stream};
use std::future::Future;
use std::time::Duration;

/// How long a command-line call waits for a cluster to recover before it reports the error.
pub const FAILOVER_BUDGET: Duration = Duration::from_secs(30);

/// Runs `op` until it succeeds, fails with an error that is not transient, or `budget` has passed.
/// `what` names the call in the log line each retry writes.
pub async fn patiently<T, F, Fut>(what: &str, budget: Duration, op: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    retry(what, budget, Duration::from_millis(200), op).await
}

/// `patiently`, with the first pause given; the pause doubles up to 2 s.
async fn retry<T, F, Fut>(what: &str, budget: Duration, first_pause: Duration, mut op: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    let deadline = tokio::time::Instant::now() + budget;
    let mut pause = first_pause;
    loop {
        match op().await {
            Ok(value) => return Ok(value),
            Err(e) if is_transient(&e) && tokio::time::Instant::now() + pause < deadline => {
                tracing::warn!(error = %e, "{what}: NATS is failing over; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Whether any error in `error`'s chain is one a failover produces.
pub fn is_transient(error: &anyhow::Error) -> bool {
    error.chain().any(transient_cause)
}

fn transient_cause(e: &(dyn std::error::Error + 'static)) -> bool {
    if let Some(e) = e.downcast_ref::<context::GetStreamError>() {
        return match e.kind() {
            GetStreamErrorKind::Request => true,
            GetStreamErrorKind::JetStream(e) => unavailable(&e),
            _ => false,
        };
    }
    if let Some(e) = e.downcast_ref::<stream::ConsumerError>() {
        return match e.kind() {
            ConsumerErrorKind::TimedOut | ConsumerErrorKind::Request => true,
            ConsumerErrorKind::JetStream(e) => unavailable(&e),
            _ => false,
        };
    }
    if let Some(e) = e.downcast_ref::<context::ConsumerInfoError>() {
        return match e.kind() {
            ConsumerInfoErrorKind::TimedOut
            | ConsumerInfoErrorKind::NoResponders
            | ConsumerInfoErrorKind::Request
            | ConsumerInfoErrorKind::Offline => true,
            ConsumerInfoErrorKind::JetStream(e) => unavailable(&e),
            _ => false,
        };
    }
    if let Some(e) = e.downcast_ref::<context::RequestError>() {
        return matches!(e.kind(), RequestErrorKind::TimedOut | RequestErrorKind::NoResponders);
    }
    if let Some(e) = e.downcast_ref::<consumer::StreamError>() {
        return e.kind() == StreamErrorKind::TimedOut;
    }
    if let Some(e) = e.downcast_ref::<context::PublishError>() {
        return matches!(e.kind(), PublishErrorKind::TimedOut | PublishErrorKind::BrokenPipe);
    }
    if let Some(e) = e.downcast_ref::<jetstream::Error>() {
        return unavailable(e);
    }
    false
}

/// JetStream's own answer that it cannot serve the call right now. A stream at its limits or a
/// server out of storage also answers 503, but waiting out a failover does not change that: the
/// caller is told at once.
fn unavailable(e: &jetstream::Error) -> bool {
    let full = [ErrorCode::STREAM_STORE_FAILED, ErrorCode::INSUFFICIENT_RESOURCES].contains(&e.error_code());
    !full && e.code() == 503
        || [
            ErrorCode::CLUSTER_NOT_AVAILABLE,
            ErrorCode::CLUSTER_NOT_LEADER,
            ErrorCode::STREAM_OFFLINE,
            ErrorCode::CONSUMER_OFFLINE,
        ]
        .contains(&e.error_code())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_failover_errors_are_transient() {
        let cases: Vec<(anyhow::Error, bool)> = vec![
            (context::GetStreamError::new(GetStreamErrorKind::Request).into(), true),
            (context::GetStreamError::new(GetStreamErrorKind::InvalidStreamName).into(), false),
            (stream::ConsumerError::new(ConsumerErrorKind::TimedOut).into(), true),
            (stream::ConsumerError::new(ConsumerErrorKind::InvalidName).into(), false),
            (context::ConsumerInfoError::new(ConsumerInfoErrorKind::NoResponders).into(), true),
            (context::ConsumerInfoError::new(ConsumerInfoErrorKind::NotFound).into(), false),
            (context::RequestError::new(RequestErrorKind::TimedOut).into(), true),
            (context::RequestError::new(RequestErrorKind::InvalidSubject).into(), false),
            (consumer::StreamError::new(StreamErrorKind::TimedOut).into(), true),
            (context::PublishError::new(PublishErrorKind::TimedOut).into(), true),
            (context::PublishError::new(PublishErrorKind::WrongLastSequence).into(), false),
            (anyhow::anyhow!("stream FLOWMESH_EVENTS not found"), false),
            (js_error(503, 10008, "jetstream cluster not available").into(), true),
            (js_error(503, 0, "no leader").into(), true),
            (js_error(503, 10077, "maximum messages exceeded").into(), false),
            (js_error(503, 10023, "insufficient resources").into(), false),
            // Wrapped with context: the cause still decides.
            (anyhow::Error::from(stream::ConsumerError::new(ConsumerErrorKind::Request)).context("opening"), true),
        ];
        for (error, want) in cases {
            assert_eq!(is_transient(&error), want, "{error:#}");
        }
    }

    /// An error as JetStream answers it.
    fn js_error(code: u16, err_code: u64, description: &str) -> jetstream::Error {
        serde_json::from_value(serde_json::json!({"code": code, "err_code": err_code, "description": description}))
            .expect("a JetStream error")
    }

    const QUICK: Duration = Duration::from_millis(1);

    #[tokio::test]
    async fn retries_transient_errors_until_success_and_stops_at_the_first_other() {
        let mut calls = 0;
        let value =
            retry("test", FAILOVER_BUDGET, QUICK, || {
                calls += 1;
                let n = calls;
                async move {
                    if n < 4 { Err(stream::ConsumerError::new(ConsumerErrorKind::TimedOut).into()) } else { Ok(n) }
                }
            })
            .await
            .unwrap();
        assert_eq!(value, 4);

        let mut calls = 0;
        let error = retry("test", FAILOVER_BUDGET, QUICK, || {
            calls += 1;
            async { Err::<(), _>(stream::ConsumerError::new(ConsumerErrorKind::InvalidName).into()) }
        })
        .await
        .unwrap_err();
        assert_eq!(calls, 1, "{error}");
    }

    #[tokio::test]
    async fn gives_up_when_the_budget_is_spent() {
        let mut calls = 0;
        let error = retry("test", Duration::from_millis(200), QUICK, || {
            calls += 1;
            async { Err::<(), _>(context::RequestError::new(RequestErrorKind::TimedOut).into()) }
        })
        .await
        .unwrap_err();
        assert!(is_transient(&error));
        // Pauses of 1, 2, 4 … 64 ms fit in 200 ms (127 ms in all); the next, 128 ms, would not.
        assert!((2..=8).contains(&calls), "{calls} calls");
    }
}
