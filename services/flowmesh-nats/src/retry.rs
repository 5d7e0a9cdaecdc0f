//! One way to retry. `Backoff` tries an operation again after pauses that double up to a ceiling,
//! until it succeeds, fails in a way that waiting does not mend, its budget is spent, or the
//! shutdown it watches fires; the caller learns which (`GaveUp`). Every retry loop in the
//! workspace is one of these: riding out a cluster's failover (`patiently`: while a NATS node is
//! lost, JetStream calls fail for a few seconds), a worker's reports and uploads, waiting for
//! JetStream at start-up.

use crate::Shutdown;
use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::consumer::StreamErrorKind;
use async_nats::jetstream::context::{ConsumerInfoErrorKind, GetStreamErrorKind, PublishErrorKind, RequestErrorKind};
use async_nats::jetstream::stream::ConsumerErrorKind;
use async_nats::jetstream::{self, consumer, context, stream};
use std::fmt::Display;
use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;

/// How long a command-line call waits for a cluster to recover before it reports the error.
pub const FAILOVER_BUDGET: Duration = Duration::from_secs(30);

/// Runs `op` until it succeeds, fails with an error that is not transient, or `budget` has passed.
/// `what` names the call in the log line each retry writes.
pub async fn patiently<T, F, Fut>(what: &str, budget: Duration, op: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    Backoff::new(Duration::from_millis(200), Duration::from_secs(2), Shutdown::never())
        .within(budget)
        .retry(what, op, is_transient)
        .await
        .map_err(|gave_up| gave_up.last)
}

/// A retry policy: the first pause, the ceiling the doubling stops at, an optional budget, and
/// the shutdown that ends the waiting.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    ceiling: Duration,
    budget: Option<Duration>,
    stop: Shutdown,
}

/// Why `Backoff::retry` returned without a success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// The error is not one that waiting mends.
    Permanent,
    /// Another pause would end past the budget.
    BudgetSpent,
    /// The shutdown fired.
    Shutdown,
}

/// The end of a retry that did not succeed: why, and the last error seen.
#[derive(Debug)]
pub struct GaveUp<E> {
    pub why: Why,
    pub last: E,
}

impl Backoff {
    /// Pauses of `first`, doubling up to `ceiling`, for as long as it takes, until `stop` fires.
    pub fn new(first: Duration, ceiling: Duration, stop: Shutdown) -> Backoff {
        Backoff { first, ceiling, budget: None, stop }
    }

    /// Gives up once another pause would end more than `budget` after the first try.
    pub fn within(self, budget: Duration) -> Backoff {
        Backoff { budget: Some(budget), ..self }
    }

    /// Runs `op` until it succeeds or gives up; errors that `transient` rejects end it at once.
    /// Each retry writes a warning naming `what` and the error.
    pub async fn retry<T, E, F, Fut>(
        &self,
        what: &str,
        mut op: F,
        transient: impl Fn(&E) -> bool,
    ) -> Result<T, GaveUp<E>>
    where
        E: Display,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let deadline = self.budget.map(|budget| Instant::now() + budget);
        let mut stop = self.stop.clone();
        let mut pause = self.first;
        loop {
            let last = match op().await {
                Ok(value) => return Ok(value),
                Err(e) => e,
            };
            let why = if !transient(&last) {
                Some(Why::Permanent)
            } else if stop.is_set() {
                Some(Why::Shutdown)
            } else if deadline.is_some_and(|deadline| Instant::now() + pause >= deadline) {
                Some(Why::BudgetSpent)
            } else {
                None
            };
            if let Some(why) = why {
                return Err(GaveUp { why, last });
            }
            tracing::warn!(error = %last, "{what}: failed; retrying in {pause:?}");
            tokio::select! {
                _ = stop.wait() => return Err(GaveUp { why: Why::Shutdown, last }),
                _ = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(self.ceiling);
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

    fn quick(stop: Shutdown) -> Backoff {
        Backoff::new(QUICK, Duration::from_secs(2), stop)
    }

    fn timed_out() -> anyhow::Error {
        context::RequestError::new(RequestErrorKind::TimedOut).into()
    }

    /// Retries an operation that always times out; how many calls it made, and how it ended.
    async fn always_timing_out(backoff: &Backoff) -> (usize, GaveUp<anyhow::Error>) {
        let mut calls = 0;
        let failed = backoff
            .retry(
                "test",
                || {
                    calls += 1;
                    async { Err::<(), _>(timed_out()) }
                },
                is_transient,
            )
            .await;
        (calls, failed.expect_err("it never succeeds"))
    }

    #[tokio::test]
    async fn retries_transient_errors_until_success_and_stops_at_the_first_other() {
        let mut calls = 0;
        let value = quick(Shutdown::never())
            .retry(
                "test",
                || {
                    calls += 1;
                    let n = calls;
                    async move { if n < 4 { Err(timed_out()) } else { Ok(n) } }
                },
                is_transient,
            )
            .await
            .unwrap();
        assert_eq!(value, 4);

        let mut calls = 0;
        let gave_up = quick(Shutdown::never())
            .retry(
                "test",
                || {
                    calls += 1;
                    async { Err::<(), _>(stream::ConsumerError::new(ConsumerErrorKind::InvalidName).into()) }
                },
                is_transient,
            )
            .await
            .unwrap_err();
        assert_eq!((calls, gave_up.why), (1, Why::Permanent), "{}", gave_up.last);
    }

    #[tokio::test]
    async fn gives_up_when_the_budget_is_spent() {
        let (calls, gave_up) = always_timing_out(&quick(Shutdown::never()).within(Duration::from_millis(200))).await;
        assert_eq!(gave_up.why, Why::BudgetSpent);
        assert!(is_transient(&gave_up.last));
        // Pauses of 1, 2, 4 … 64 ms fit in 200 ms (127 ms in all); the next, 128 ms, would not.
        assert!((2..=8).contains(&calls), "{calls} calls");
    }

    #[tokio::test]
    async fn gives_up_when_shutdown_fires_before_or_during_a_pause() {
        // Fired before the retry: one try, then no pause at all.
        let (trigger, stop) = crate::shutdown::channel();
        trigger.fire();
        let (calls, gave_up) = always_timing_out(&quick(stop)).await;
        assert_eq!((calls, gave_up.why), (1, Why::Shutdown));

        // Fired during an hour-long pause: the pause ends with it.
        let (trigger, stop) = crate::shutdown::channel();
        let hour = Duration::from_secs(3600);
        let backoff = Backoff::new(hour, hour, stop);
        let retry = always_timing_out(&backoff);
        let fire = async {
            tokio::task::yield_now().await;
            trigger.fire();
            std::future::pending::<()>().await
        };
        let gave_up = tokio::time::timeout(Duration::from_secs(30), async {
            tokio::select! {
                (_, gave_up) = retry => gave_up,
                _ = fire => unreachable!("fire never ends"),
            }
        })
        .await
        .expect("the shutdown ends the pause");
        assert_eq!(gave_up.why, Why::Shutdown);
    }
}
