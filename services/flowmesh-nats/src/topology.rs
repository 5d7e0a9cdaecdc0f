//! The streams, buckets and object store, defined in `streams/` and applied idempotently.
//!
//! `streams/*.json` are embedded at build time: the files are the single source of truth. A
//! definition that already exists and differs is a `Conflict`: we never delete or rewrite data.

use crate::error::EdgeError;
use crate::subjects;
use async_nats::jetstream::{self, kv, object_store, stream};
use serde::Deserialize;
use std::time::Duration;

const SUBMISSIONS: &str = include_str!("../../../streams/FLOWMESH_SUBMISSIONS.json");
const EVENTS: &str = include_str!("../../../streams/FLOWMESH_EVENTS.json");
const WORK: &str = include_str!("../../../streams/FLOWMESH_WORK.json");
const WORKERS: &str = include_str!("../../../streams/flowmesh_workers.kv.json");
const CONTROL: &str = include_str!("../../../streams/flowmesh_control.kv.json");
const ARTIFACTS: &str = include_str!("../../../streams/flowmesh_artifacts.obj.json");

/// A key-value bucket definition (`streams/*.kv.json`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvDef {
    pub bucket: String,
    pub description: String,
    pub history: i64,
    /// Whether the bucket's stream takes rollup headers (a KV purge needs them). A bucket that
    /// is never purged turns them off: permissions cannot see headers, so anyone who may write
    /// one key could otherwise send `Nats-Rollup: all` and empty the bucket.
    #[serde(default = "rollups_allowed")]
    pub allow_rollup: bool,
    pub max_age_sec: u64,
    pub max_value_size: i32,
    /// How many consumers its stream takes (see `ensure_consumer_limit`).
    pub max_consumers: i32,
    pub storage: stream::StorageType,
    pub num_replicas: usize,
}

/// An object store definition (`streams/*.obj.json`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObjDef {
    pub bucket: String,
    pub description: String,
    pub max_age_sec: u64,
    /// How many consumers its stream takes (see `ensure_consumer_limit`); a worker's own store
    /// takes what the shared one does.
    pub max_consumers: i32,
    pub storage: stream::StorageType,
    pub num_replicas: usize,
}

/// Every definition, with the replica count chosen for this deployment.
#[derive(Debug, Clone)]
pub struct Topology {
    /// The replica count every definition was given.
    pub replicas: usize,
    pub streams: Vec<stream::Config>,
    pub buckets: Vec<KvDef>,
    pub objects: Vec<ObjDef>,
}

impl Topology {
    /// Loads the embedded definitions; `replicas` overrides `num_replicas` everywhere.
    pub fn load(replicas: usize) -> Result<Topology, EdgeError> {
        let stream = |file: &'static str, text: &str| -> Result<stream::Config, EdgeError> {
            let mut config: stream::Config =
                serde_json::from_str(text).map_err(|e| EdgeError::Definition { file, message: e.to_string() })?;
            config.num_replicas = replicas;
            Ok(config)
        };
        let kv = |file: &'static str, text: &str| -> Result<KvDef, EdgeError> {
            let mut def: KvDef =
                serde_json::from_str(text).map_err(|e| EdgeError::Definition { file, message: e.to_string() })?;
            def.num_replicas = replicas;
            Ok(def)
        };
        let mut artifacts: ObjDef = serde_json::from_str(ARTIFACTS)
            .map_err(|e| EdgeError::Definition { file: "flowmesh_artifacts.obj.json", message: e.to_string() })?;
        artifacts.num_replicas = replicas;
        Ok(Topology {
            replicas,
            streams: vec![
                stream("FLOWMESH_SUBMISSIONS.json", SUBMISSIONS)?,
                stream("FLOWMESH_EVENTS.json", EVENTS)?,
                stream("FLOWMESH_WORK.json", WORK)?,
            ],
            buckets: vec![kv("flowmesh_workers.kv.json", WORKERS)?, kv("flowmesh_control.kv.json", CONTROL)?],
            objects: vec![artifacts],
        })
    }

    /// The consumer limit a worker's own object store takes: the shared store's.
    pub fn store_consumer_limit(&self) -> i32 {
        self.objects.iter().map(|o| o.max_consumers).max().unwrap_or_default()
    }
}

/// Handles on everything a service uses, once the topology is in place.
#[derive(Clone)]
pub struct Handles {
    pub js: jetstream::Context,
    pub workers: kv::Store,
    pub control: kv::Store,
    pub artifacts: object_store::ObjectStore,
}

impl Handles {
    /// Applies the topology (creating what is missing, refusing conflicts) and opens the handles.
    pub async fn ensure(client: &async_nats::Client, topology: &Topology) -> Result<Handles, EdgeError> {
        let js = jetstream::new(client.clone());
        for config in &topology.streams {
            ensure_stream(&js, config).await?;
        }
        for def in &topology.buckets {
            ensure_kv(&js, def).await?;
        }
        for def in &topology.objects {
            ensure_object_store(&js, def).await?;
        }
        let kv = |name: &'static str| {
            let js = js.clone();
            async move {
                js.get_key_value(name).await.map_err(|e| EdgeError::transient(format!("opening bucket {name}"), e))
            }
        };
        let workers = kv(subjects::WORKERS_BUCKET).await?;
        let control = kv(subjects::CONTROL_BUCKET).await?;
        let artifacts = js
            .get_object_store(subjects::ARTIFACTS_BUCKET)
            .await
            .map_err(|e| EdgeError::transient("opening the artifacts store", e))?;
        Ok(Handles { js, workers, control, artifacts })
    }
}

async fn existing(js: &jetstream::Context, name: &str) -> Result<Option<stream::Config>, EdgeError> {
    match js.get_stream(name).await {
        // The lookup reads the stream's info: its answer is the config.
        Ok(s) => Ok(Some(s.cached_info().config.clone())),
        Err(e) if is_not_found(&e.to_string()) => Ok(None),
        Err(e) => Err(EdgeError::transient(format!("looking up stream {name}"), e)),
    }
}

fn is_not_found(message: &str) -> bool {
    let m = message.to_lowercase();
    m.contains("not found") || m.contains("10059")
}

fn conflict(
    kind: &'static str,
    name: &str,
    field: &'static str,
    expected: impl std::fmt::Debug,
    found: impl std::fmt::Debug,
) -> EdgeError {
    EdgeError::Conflict {
        kind,
        name: name.to_owned(),
        field,
        expected: format!("{expected:?}"),
        found: format!("{found:?}"),
    }
}

/// The fields whose difference changes behaviour; the rest (description, limits we do not set)
/// may drift without harm.
fn compare_stream(want: &stream::Config, have: &stream::Config) -> Result<(), EdgeError> {
    let name = &want.name;
    let mut want_subjects = want.subjects.clone();
    let mut have_subjects = have.subjects.clone();
    want_subjects.sort();
    have_subjects.sort();
    if want_subjects != have_subjects {
        return Err(conflict("stream", name, "subjects", want_subjects, have_subjects));
    }
    if want.retention != have.retention {
        return Err(conflict("stream", name, "retention", want.retention, have.retention));
    }
    if want.storage != have.storage {
        return Err(conflict("stream", name, "storage", want.storage, have.storage));
    }
    if want.discard != have.discard {
        return Err(conflict("stream", name, "discard", want.discard, have.discard));
    }
    // Limits decide what is refused; with `discard: old` they would silently drop acknowledged
    // submissions, so a stream whose limits differ from `streams/` is a conflict too.
    if want.max_messages != have.max_messages {
        return Err(conflict("stream", name, "max_msgs", want.max_messages, have.max_messages));
    }
    if want.max_bytes != have.max_bytes {
        return Err(conflict("stream", name, "max_bytes", want.max_bytes, have.max_bytes));
    }
    if want.max_age != have.max_age {
        return Err(conflict("stream", name, "max_age", want.max_age, have.max_age));
    }
    if want.max_message_size != have.max_message_size {
        return Err(conflict("stream", name, "max_msg_size", want.max_message_size, have.max_message_size));
    }
    if want.duplicate_window != have.duplicate_window {
        return Err(conflict("stream", name, "duplicate_window", want.duplicate_window, have.duplicate_window));
    }
    // Replicas are a property of the deployment, not of the definition: a client started with the
    // default of 1 must work against a cluster that runs R3. Say so, do not refuse.
    if want.num_replicas != have.num_replicas {
        tracing::debug!(stream = %name, have = have.num_replicas, asked = want.num_replicas, "stream has another replica count");
    }
    Ok(())
}

async fn ensure_stream(js: &jetstream::Context, config: &stream::Config) -> Result<(), EdgeError> {
    if let Some(mut have) = existing(js, &config.name).await? {
        // The one change made in place: an older deployment's `discard: old` becomes `new` (the
        // stream then refuses when full instead of dropping what it had acknowledged; nothing
        // stored changes).
        if have.discard == stream::DiscardPolicy::Old && config.discard == stream::DiscardPolicy::New {
            have.discard = stream::DiscardPolicy::New;
            js.update_stream(&have)
                .await
                .map_err(|e| EdgeError::transient(format!("setting discard new on {}", config.name), e))?;
            tracing::info!(stream = %config.name, "discard policy upgraded from old to new");
        }
        // And an older deployment's longer duplicate window is shortened to the definition's:
        // the server keeps every id inside the window in memory (the events stream's former
        // 2 h held gigabytes at a thousand workflows a second), and what arrives again later is
        // harmless to its readers (ARCHITECTURE, "Duplicate windows"). Nothing stored changes.
        if have.duplicate_window > config.duplicate_window {
            let longer = have.duplicate_window;
            have.duplicate_window = config.duplicate_window;
            js.update_stream(&have)
                .await
                .map_err(|e| EdgeError::transient(format!("shortening the duplicate window of {}", config.name), e))?;
            tracing::info!(stream = %config.name, from = ?longer, to = ?config.duplicate_window, "duplicate window shortened");
        }
        set_consumer_limit(js, &mut have, config.max_consumers).await;
        return compare_stream(config, &have);
    }
    match js.create_stream(config.clone()).await {
        Ok(_) => Ok(()),
        // Another service created it between our look-up and our create: compare with theirs.
        Err(e) => match existing(js, &config.name).await? {
            Some(have) => compare_stream(config, &have),
            None => Err(EdgeError::transient(format!("creating stream {}", config.name), e)),
        },
    }
}

fn compare_bucket(
    kind: &'static str,
    name: &str,
    max_age: Duration,
    history: Option<i64>,
    have: &stream::Config,
) -> Result<(), EdgeError> {
    if have.max_age != max_age {
        return Err(conflict(kind, name, "max_age", max_age, have.max_age));
    }
    if let Some(history) = history
        && have.max_messages_per_subject != history
    {
        return Err(conflict(kind, name, "history", history, have.max_messages_per_subject));
    }
    Ok(())
}

/// Gives stream `name` the consumer limit `want` where it has another. nats-server 2.15 puts a
/// limit of 1,000 consumers on every stream that sets none (and still reports -1): a fleet of
/// more workers (a durable consumer each on the log) could not start, and a thousand readers
/// within the server's 30 s grace for a departed one (`flowmesh submit`, `watch`, `events`)
/// were refused. Nothing stored changes. A user who may not update streams (every role but the
/// admin) is told to have the admin apply the definitions, and goes on.
pub async fn ensure_consumer_limit(js: &jetstream::Context, name: &str, want: i32) -> Result<(), EdgeError> {
    if let Some(mut have) = existing(js, name).await? {
        set_consumer_limit(js, &mut have, want).await;
    }
    Ok(())
}

async fn set_consumer_limit(js: &jetstream::Context, have: &mut stream::Config, want: i32) {
    if have.max_consumers == want {
        return;
    }
    let mut config = have.clone();
    config.max_consumers = want;
    match js.update_stream(&config).await {
        Ok(_) => {
            tracing::info!(stream = %have.name, from = have.max_consumers, to = want, "consumer limit set");
            *have = config;
        }
        Err(e) => tracing::warn!(
            stream = %have.name, has = have.max_consumers, defined = want, error = %e,
            "the stream keeps the server's consumer limit (1,000 where it sets none): the admin sets the defined one with `flowmesh streams apply`"
        ),
    }
}

fn rollups_allowed() -> bool {
    true
}

async fn ensure_kv(js: &jetstream::Context, def: &KvDef) -> Result<(), EdgeError> {
    let stream_name = format!("KV_{}", def.bucket);
    let max_age = Duration::from_secs(def.max_age_sec);
    if let Some(mut have) = existing(js, &stream_name).await? {
        set_consumer_limit(js, &mut have, def.max_consumers).await;
        return compare_bucket("bucket", &def.bucket, max_age, Some(def.history), &have);
    }
    let config = kv::Config {
        bucket: def.bucket.clone(),
        description: def.description.clone(),
        history: def.history,
        max_age,
        max_value_size: def.max_value_size,
        storage: def.storage,
        num_replicas: def.num_replicas,
        ..Default::default()
    };
    if let Err(e) = js.create_key_value(config).await {
        match existing(js, &stream_name).await? {
            Some(have) => {
                return compare_bucket("bucket", &def.bucket, max_age, Some(def.history), &have);
            }
            None => {
                return Err(EdgeError::transient(format!("creating bucket {}", def.bucket), e));
            }
        }
    }
    // async-nats creates every bucket with rollups on and no consumer limit; whoever created it
    // may change both, read once and updated together (a bucket found existing keeps its
    // rollups: only the admin may update a stream).
    let mut have = existing(js, &stream_name).await?.ok_or_else(|| {
        EdgeError::transient(format!("setting up bucket {}", def.bucket), std::io::Error::other("the bucket vanished"))
    })?;
    if !def.allow_rollup && have.allow_rollup {
        let mut config = have.clone();
        config.allow_rollup = false;
        config.max_consumers = def.max_consumers;
        js.update_stream(&config)
            .await
            .map_err(|e| EdgeError::transient(format!("turning rollups off on bucket {}", def.bucket), e))?;
        have = config;
    }
    set_consumer_limit(js, &mut have, def.max_consumers).await;
    Ok(())
}

async fn ensure_object_store(js: &jetstream::Context, def: &ObjDef) -> Result<(), EdgeError> {
    let stream_name = format!("OBJ_{}", def.bucket);
    let max_age = Duration::from_secs(def.max_age_sec);
    if let Some(mut have) = existing(js, &stream_name).await? {
        set_consumer_limit(js, &mut have, def.max_consumers).await;
        return compare_bucket("object store", &def.bucket, max_age, None, &have);
    }
    let config = object_store::Config {
        bucket: def.bucket.clone(),
        description: Some(def.description.clone()),
        max_age,
        storage: def.storage,
        num_replicas: def.num_replicas,
        ..Default::default()
    };
    if let Err(e) = js.create_object_store(config).await {
        match existing(js, &stream_name).await? {
            Some(have) => return compare_bucket("object store", &def.bucket, max_age, None, &have),
            None => {
                return Err(EdgeError::transient(format!("creating object store {}", def.bucket), e));
            }
        }
    }
    ensure_consumer_limit(js, &stream_name, def.max_consumers).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every definition takes the replica count asked for, and the topology remembers it; a
    /// worker's own store takes the shared store's consumer limit.
    #[test]
    fn a_topology_carries_its_replicas_and_the_stores_limit() {
        for replicas in [1, 3] {
            let topology = Topology::load(replicas).unwrap();
            assert_eq!(topology.replicas, replicas);
            assert!(topology.streams.iter().all(|s| s.num_replicas == replicas));
            assert!(topology.buckets.iter().all(|b| b.num_replicas == replicas));
            let shared = topology.objects.iter().find(|o| o.bucket == subjects::ARTIFACTS_BUCKET).unwrap();
            assert_eq!(topology.store_consumer_limit(), shared.max_consumers);
            assert!(shared.max_consumers >= 100_000, "{}", shared.max_consumers);
        }
    }

    /// A running stream that differs from its definition where behaviour changes is a conflict
    /// naming the field; replicas and descriptions may differ.
    #[test]
    fn streams_that_differ_where_it_matters_are_conflicts() {
        let topology = Topology::load(1).unwrap();
        let want = topology.streams.iter().find(|s| s.name == subjects::SUBMISSIONS_STREAM).unwrap().clone();
        assert_eq!(want.discard, stream::DiscardPolicy::New, "a full submissions stream refuses, never drops");
        type Change = Box<dyn Fn(&mut stream::Config)>;
        let cases: Vec<(&str, Change, Option<&str>)> = vec![
            ("the same", Box::new(|_| {}), None),
            ("more replicas", Box::new(|c| c.num_replicas = 3), None),
            ("another description", Box::new(|c| c.description = Some("x".into())), None),
            ("discard old", Box::new(|c| c.discard = stream::DiscardPolicy::Old), Some("discard")),
            ("an operator's max_msgs", Box::new(|c| c.max_messages = 100), Some("max_msgs")),
            ("an operator's max_bytes", Box::new(|c| c.max_bytes = 1 << 20), Some("max_bytes")),
            ("another age", Box::new(|c| c.max_age = Duration::from_secs(60)), Some("max_age")),
            ("other subjects", Box::new(|c| c.subjects = vec!["x".into()]), Some("subjects")),
        ];
        for (what, change, field) in cases {
            let mut have = want.clone();
            change(&mut have);
            let found = match compare_stream(&want, &have) {
                Ok(()) => None,
                Err(EdgeError::Conflict { field, .. }) => Some(field),
                Err(e) => panic!("{what}: {e}"),
            };
            assert_eq!(found, field, "{what}");
        }
    }
}
