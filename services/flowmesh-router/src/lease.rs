//! The router lease: one active router at a time, held in `flowmesh_control` under
//! `router-leader`, renewed every third of its TTL, taken over once it has gone stale.
//!
//! Staleness is judged by each contender on its own clock: a lease whose revision has not changed
//! for a whole TTL since this router first saw that revision is stale. No router compares its
//! clock with a time another host wrote, so clocks that drift apart neither delay a takeover nor
//! let a standby take a lease its holder is still renewing.

use async_nats::jetstream::kv;
use serde::{Deserialize, Serialize};

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
}
