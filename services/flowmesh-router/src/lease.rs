//! The router lease: one active router at a time, held in `flowmesh_control` under
//! `router-leader`, renewed every third of its TTL, taken over once it has expired.

use async_nats::jetstream::kv;
use serde::{Deserialize, Serialize};

pub const KEY: &str = "router-leader";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lease {
    pub holder: String,
    pub expires_ms: u64,
}

/// Whether `me` may take or keep a lease currently `held` at time `now_ms` (pure).
pub fn may_hold(held: Option<&Lease>, me: &str, now_ms: u64) -> bool {
    match held {
        None => true,
        Some(lease) => lease.holder == me || lease.expires_ms <= now_ms,
    }
}

/// Tries to take or renew the lease; `Ok(true)` when `me` holds it afterwards.
/// Compare-and-set on the KV revision makes two contenders agree on one winner.
pub async fn acquire(store: &kv::Store, me: &str, ttl_ms: u64, now_ms: u64) -> Result<bool, String> {
    let entry = store.entry(KEY).await.map_err(|e| e.to_string())?;
    let current = entry
        .as_ref()
        .filter(|e| matches!(e.operation, kv::Operation::Put))
        .and_then(|e| serde_json::from_slice::<Lease>(&e.value).ok());
    if !may_hold(current.as_ref(), me, now_ms) {
        return Ok(false);
    }
    let next =
        serde_json::to_vec(&Lease { holder: me.to_owned(), expires_ms: now_ms + ttl_ms }).expect("lease serializes");
    let written = match &entry {
        Some(e) => store.update(KEY, next.into(), e.revision).await.map(|_| ()).map_err(|e| e.to_string()),
        None => store.create(KEY, next.into()).await.map(|_| ()).map_err(|e| e.to_string()),
    };
    Ok(written.is_ok())
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
    fn lease_rules() {
        let held = Lease { holder: "a".into(), expires_ms: 1000 };
        assert!(may_hold(None, "b", 0));
        assert!(may_hold(Some(&held), "a", 500), "the holder renews");
        assert!(!may_hold(Some(&held), "b", 999), "a live lease is respected");
        assert!(may_hold(Some(&held), "b", 1000), "an expired lease is taken over");
    }
}
