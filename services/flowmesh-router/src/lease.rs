//! The router lease: one active router at a time, held in `flowmesh_control` under
//! `router-leader`, renewed every third of its TTL, taken over once it has gone stale.
//!
//! Staleness is judged by each contender on its own clock: a lease whose revision has not changed
//! for a whole TTL since this router first saw that revision is stale. No router compares its
//! clock with a time another host wrote, so clocks that drift apart neither delay a takeover nor
//! let a standby take a lease its holder is still renewing.

use async_nats::jetstream::kv;
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

pub const KEY: &str = "router-leader";

/// The lease's value. `expires_ms` is the holder's own estimate, for people reading the bucket;
/// no decision uses it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lease {
    pub holder: String,
    pub expires_ms: u64,
}

/// A revision of another router's lease as this router saw it: first at `since_ms`, own clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub revision: u64,
    pub since_ms: u64,
}

/// Whether another router's lease, now at `revision`, may be taken over at `now_ms`; updates
/// `seen` (pure). A revision seen for the first time starts the clock.
pub fn stale(revision: u64, seen: &mut Option<Seen>, now_ms: u64, ttl_ms: u64) -> bool {
    match seen {
        Some(s) if s.revision == revision => now_ms.saturating_sub(s.since_ms) >= ttl_ms,
        _ => {
            *seen = Some(Seen { revision, since_ms: now_ms });
            false
        }
    }
}

/// Tries to take or renew the lease; `Ok(true)` when `me` holds it afterwards. `seen` is what
/// this router remembers of another holder's lease between calls. Compare-and-set on the KV
/// revision makes contenders agree on one winner.
pub async fn acquire(
    store: &kv::Store,
    me: &str,
    ttl_ms: u64,
    now_ms: u64,
    seen: &mut Option<Seen>,
) -> Result<bool, String> {
    let entry = store.entry(KEY).await.map_err(|e| e.to_string())?;
    let held = entry.as_ref().filter(|e| matches!(e.operation, kv::Operation::Put));
    if let Some(e) = held {
        let mine = serde_json::from_slice::<Lease>(&e.value).is_ok_and(|lease| lease.holder == me);
        if !mine && !stale(e.revision, seen, now_ms, ttl_ms) {
            return Ok(false);
        }
    }
    let next =
        serde_json::to_vec(&Lease { holder: me.to_owned(), expires_ms: now_ms + ttl_ms }).expect("lease serializes");
    // A lost compare-and-set (another router wrote first) means only that the lease is not ours.
    let written = match &entry {
        Some(e) => store.update(KEY, next.into(), e.revision).await.is_ok(),
        None => store.create(KEY, next.into()).await.is_ok(),
    };
    if written {
        *seen = None;
    }
    Ok(written)
}

/// How long a leader may go on acting on its lease. A standby takes the lease over once a
/// revision has stood a whole TTL on its own clock since it first saw it, and it cannot see a
/// revision before the leader's renewal wrote it, which is after the leader asked. So a leader
/// that acts only until two thirds of a TTL after its last successful renewal asked stops before
/// any standby may start: the last third is for clocks that run at different rates and for what
/// it has in flight. One late renewal costs nothing; a router that stalled (a slow machine, a
/// stopped process) and wakes to a backlog no longer decides on it before it has renewed.
#[derive(Debug, Clone, Copy, Default)]
pub struct Held {
    until: Option<Instant>,
}

impl Held {
    /// A renewal asked at `asked_at` succeeded.
    pub fn renewed(&mut self, asked_at: Instant, ttl: Duration) {
        self.until = Some(asked_at + ttl * 2 / 3);
    }

    /// The lease is another router's, or could not be checked.
    pub fn lost(&mut self) {
        self.until = None;
    }

    /// Whether the leader may act at `now`.
    pub fn at(&self, now: Instant) -> bool {
        self.until.is_some_and(|until| now < until)
    }
}

/// Gives the lease up so a standby can take over at once.
pub async fn release(store: &kv::Store, me: &str) {
    if let Ok(Some(entry)) = store.entry(KEY).await
        && let Ok(lease) = serde_json::from_slice::<Lease>(&entry.value)
        && lease.holder == me
    {
        let _ = store.delete_expect_revision(KEY, Some(entry.revision)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_stale_after_a_ttl_without_a_new_revision_on_the_local_clock() {
        let ttl = 10_000;
        let mut seen = None;
        // (revision now in the bucket, this router's clock, stale?)
        let steps = [
            (7, 1_000, false),  // first sight starts the clock
            (7, 10_999, false), // not yet a whole TTL
            (8, 11_000, false), // the holder renewed: the clock starts again
            (8, 20_999, false),
            (8, 21_000, true), // a TTL without a renewal
        ];
        for (revision, now, want) in steps {
            assert_eq!(stale(revision, &mut seen, now, ttl), want, "revision {revision} at {now}");
        }
        // Whatever the clock reads (a router far behind or ahead of the holder's host), only the
        // time it measured itself counts.
        for start in [0u64, 5, 1_000_000_000_000] {
            let mut seen = None;
            assert!(!stale(3, &mut seen, start, ttl));
            assert!(!stale(3, &mut seen, start + ttl - 1, ttl));
            assert!(stale(3, &mut seen, start + ttl, ttl));
        }
    }

    #[test]
    fn a_leader_acts_until_two_thirds_of_a_ttl_after_its_last_renewal_asked() {
        let ttl = Duration::from_secs(3);
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut held = Held::default();
        assert!(!held.at(t0), "never renewed");
        held.renewed(t0, ttl);
        for (ms, want) in [(0, true), (1_999, true), (2_000, false), (60_000, false)] {
            assert_eq!(held.at(at(ms)), want, "{ms} ms after the renewal asked");
        }
        // The next renewal, a third of a TTL later, moves the end on; one that fails ends it.
        held.renewed(at(1_000), ttl);
        assert!(held.at(at(2_999)));
        assert!(!held.at(at(3_000)));
        held.lost();
        assert!(!held.at(at(1_500)));
    }
}
