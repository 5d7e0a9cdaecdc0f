//! Where a task's files live and how they are read back. Each worker stores its tasks' files in
//! its own object store, `flowmesh_artifacts_<worker_id>` (only that worker and the admin may
//! write it); workers that share one NATS user share `flowmesh_artifacts`. Whoever reads a file
//! named in a `task.completed` (a downstream worker, `flowmesh result fetch`) checks its bytes
//! against the digest that event reports, not against the store's own record.

use crate::{EdgeError, subjects};
use async_nats::jetstream::{self, object_store::ObjectStore};
use flowmesh_domain::event::{Artifact, Event, EventBody};
use flowmesh_domain::ids::{WorkflowIds, workflow_of_object};
use futures_util::{StreamExt, TryStreamExt};
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;
use tokio::sync::Mutex;

/// Opens a worker's own object store, creating it where it is missing with the settings of the
/// shared `flowmesh_artifacts` (storage, age limit, replicas, consumer limit), which the
/// topology has in place; one found with another consumer limit is given the shared one's
/// (`topology::ensure_consumer_limit`: only where this user may update it).
pub async fn ensure_bucket(js: &jetstream::Context, bucket: &str) -> Result<ObjectStore, EdgeError> {
    if let Ok(store) = js.get_object_store(bucket).await {
        let like = shared_settings(js).await?;
        crate::topology::ensure_consumer_limit(js, &subjects::object_stream(bucket), like.max_consumers).await?;
        return Ok(store);
    }
    match create_bucket(js, bucket).await {
        Ok(store) => Ok(store),
        // Another process of the same worker id may have created it meanwhile.
        Err(e) => js.get_object_store(bucket).await.map_err(|_| e),
    }
}

/// The shared store's stream settings, which every worker's own store takes.
async fn shared_settings(js: &jetstream::Context) -> Result<jetstream::stream::Config, EdgeError> {
    let shared_stream = subjects::object_stream(subjects::ARTIFACTS_BUCKET);
    // Looking the stream up reads its info: one request, its answer kept.
    let shared = js
        .get_stream(&shared_stream)
        .await
        .map_err(|e| EdgeError::transient(format!("looking up {shared_stream}"), e))?;
    Ok(shared.cached_info().config.clone())
}

/// Creates a worker's own object store (succeeding too where one of the same settings exists).
/// Its stream is made here, as an object store's always is (its chunk and record subjects,
/// rollups for the records, direct reads, refusing when full), so that it can carry the shared
/// store's consumer limit, which the client's `create_object_store` cannot set.
pub async fn create_bucket(js: &jetstream::Context, bucket: &str) -> Result<ObjectStore, EdgeError> {
    use jetstream::stream::{Config, DiscardPolicy};
    let like = shared_settings(js).await?;
    let config = Config {
        name: subjects::object_stream(bucket),
        description: Some(format!("Task results and artifacts stored by one worker ({bucket}).")),
        subjects: vec![format!("$O.{bucket}.C.>"), format!("$O.{bucket}.M.>")],
        max_age: like.max_age,
        storage: like.storage,
        num_replicas: like.num_replicas,
        max_consumers: like.max_consumers,
        discard: DiscardPolicy::New,
        allow_rollup: true,
        allow_direct: true,
        ..Default::default()
    };
    let refused = |e: String| {
        EdgeError::transient(
            format!(
                "creating the worker's object store {bucket} (its NATS user must be allowed to create it: \
                 `flowmesh streams server-config --worker ID` makes such users; workers sharing one user \
                 set WORKER_ARTIFACTS_BUCKET={})",
                subjects::ARTIFACTS_BUCKET
            ),
            std::io::Error::other(e),
        )
    };
    js.create_stream(config).await.map_err(|e| refused(e.to_string()))?;
    js.get_object_store(bucket).await.map_err(|e| refused(e.to_string()))
}

/// Every stream FlowMesh stores messages in: `subjects::all_streams` and each worker's own
/// object store that exists now.
pub async fn product_streams(js: &jetstream::Context) -> Result<Vec<String>, EdgeError> {
    use futures_util::TryStreamExt;
    let own = format!("{}_", subjects::object_stream(subjects::ARTIFACTS_BUCKET));
    let names: Vec<String> =
        js.stream_names().try_collect().await.map_err(|e| EdgeError::transient("listing streams", e))?;
    let mut streams = subjects::all_streams().to_vec();
    streams.extend(names.into_iter().filter(|n| n.starts_with(&own)));
    Ok(streams)
}

/// The latest retention record (`workflows.purged`): every workflow whose events the router has
/// removed from the log, with the record's sequence there (a later record has a higher one);
/// `None` where nothing was ever purged. Only the router and the admin may write that subject,
/// and the record is believed only where `Event::read` accepts it. A log whose every record was
/// written before the worker-first layout has its latest on the legacy subject.
pub async fn purged_workflows(js: &jetstream::Context) -> Result<Option<(u64, WorkflowIds)>, EdgeError> {
    use async_nats::jetstream::stream::LastRawMessageErrorKind;
    let what = "reading the latest purge record";
    let log = js.get_stream_no_info(subjects::EVENTS_STREAM).await.map_err(|e| EdgeError::transient(what, e))?;
    let mut found = None;
    for subject in [subjects::purge_records(), subjects::legacy_purge_records()] {
        match log.get_last_raw_message_by_subject(&subject).await {
            Ok(message) => {
                found = Some(message);
                break;
            }
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => {}
            Err(e) => return Err(EdgeError::transient(what, e)),
        }
    }
    let Some(message) = found else { return Ok(None) };
    let suffix = subjects::event_suffix(&message.subject).unwrap_or_default();
    match Event::read(suffix, &message.payload) {
        Ok(Event { body: EventBody::WorkflowsPurged(record), .. }) => Ok(Some((message.sequence, record.workflows))),
        Ok(event) => Err(EdgeError::Unreadable {
            what: format!("the purge record at seq {}", message.sequence),
            why: format!("it is a {}", event.body.kind()),
        }),
        Err(why) => Err(EdgeError::Unreadable {
            what: format!("the purge record at seq {}", message.sequence),
            why: why.to_string(),
        }),
    }
}

/// What one pruning of an object store found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pruned {
    /// Objects of purged workflows removed (their chunks and their record).
    pub removed: u64,
    /// Chunks of uploads no record names, removed (`orphans_older_than`).
    pub orphans: u64,
    /// Objects of purged workflows, or orphaned chunks, that could not be removed: the next
    /// pruning finds them again.
    pub failed: u64,
    /// Objects kept: of workflows still in the log, or not named after a task.
    pub kept: u64,
}

/// How long chunks that no record names are kept, counted from the newest of them. They are what
/// an upload leaves when it stops halfway (a worker killed while storing a file: its chunks are
/// stored one by one and the record last), and what an object stored over another leaves where
/// its writer may not purge (the shared store). An upload in progress stores a chunk every
/// moment, so an hour without one is an upload that will never write its record.
pub const ORPHANS_OLDER_THAN: Duration = Duration::from_secs(3600);

/// Objects removed at once by one pruning.
const REMOVALS_IN_FLIGHT: usize = 16;

/// What one pruning removes: an object (its chunks, then its record), or an orphan's chunks.
enum Doomed {
    Object { name: String, nuid: String },
    Orphan { chunks: String },
}

/// Removes from object store `bucket` every file of a workflow in `purged` (its name's task, see
/// `ids::workflow_of_object`), so a task's files go when retention removes its workflow's events
/// and no sooner, and the chunks that no record names whose newest chunk is older than
/// `orphans_older_than` (`ORPHANS_OLDER_THAN`). Each object goes whole: its chunks first,
/// then its record, so one left half removed (a crash between the two) is still listed and
/// removed by the next pruning, and no tombstone stays behind (a store's `delete` keeps one
/// record per object for ever). Needs the right to purge that store's stream: a worker has it
/// for its own store, the admin for every one.
pub async fn prune(
    js: &jetstream::Context,
    bucket: &str,
    purged: &WorkflowIds,
    orphans_older_than: Duration,
) -> Result<Pruned, EdgeError> {
    let store = js.get_object_store(bucket).await.map_err(|e| EdgeError::transient(format!("opening {bucket}"), e))?;
    let stream = subjects::object_stream(bucket);
    let stream =
        js.get_stream_no_info(&stream).await.map_err(|e| EdgeError::transient(format!("opening {stream}"), e))?;
    let listing = format!("listing {bucket}");
    let mut list = store.list().await.map_err(|e| EdgeError::transient(listing.clone(), e))?;
    let mut doomed = Vec::new();
    // Every upload a record names, listed before the chunks are: an upload that writes its
    // record meanwhile has chunks too new to be taken for an orphan's.
    let mut named = HashSet::new();
    let mut pruned = Pruned::default();
    while let Some(info) = list.try_next().await.map_err(|e| EdgeError::transient(listing.clone(), e))? {
        named.insert(info.nuid.clone());
        if workflow_of_object(&info.name).is_some_and(|workflow| purged.contains(workflow)) {
            doomed.push(Doomed::Object { name: info.name, nuid: info.nuid });
        } else {
            pruned.kept += 1;
        }
    }
    let orphaned = orphans(&stream, bucket, &named, orphans_older_than).await?;
    doomed.extend(orphaned.into_iter().map(|chunks| Doomed::Orphan { chunks }));
    let removals = futures_util::stream::iter(doomed)
        .map(|doomed| {
            let stream = &stream;
            // What went: `true` for an orphan's chunks, `false` for an object.
            async move {
                use base64::Engine;
                match doomed {
                    Doomed::Object { name, nuid } => {
                        let record = base64::engine::general_purpose::URL_SAFE.encode(&name);
                        stream.purge().filter(format!("$O.{bucket}.C.{nuid}")).await?;
                        stream.purge().filter(format!("$O.{bucket}.M.{record}")).await?;
                        Ok::<_, async_nats::jetstream::stream::PurgeError>(false)
                    }
                    Doomed::Orphan { chunks } => {
                        stream.purge().filter(chunks).await?;
                        Ok(true)
                    }
                }
            }
        })
        .buffer_unordered(REMOVALS_IN_FLIGHT);
    futures_util::pin_mut!(removals);
    while let Some(removed) = removals.next().await {
        match removed {
            Ok(true) => pruned.orphans += 1,
            Ok(false) => pruned.removed += 1,
            Err(e) => {
                tracing::debug!(%bucket, error = %e, "could not remove an object of a purged workflow or an orphan's chunks");
                pruned.failed += 1;
            }
        }
    }
    Ok(pruned)
}

/// The chunk subjects of `bucket` that no upload in `named` owns and whose newest chunk was
/// stored longer than `older_than` ago (by the server's clock, against ours).
async fn orphans(
    stream: &jetstream::stream::Stream<()>,
    bucket: &str,
    named: &HashSet<String>,
    older_than: Duration,
) -> Result<Vec<String>, EdgeError> {
    use async_nats::jetstream::stream::LastRawMessageErrorKind;
    let prefix = format!("$O.{bucket}.C.");
    let listing = || format!("listing the chunks of {bucket}");
    let mut chunks =
        stream.info_with_subjects(format!("{prefix}>")).await.map_err(|e| EdgeError::transient(listing(), e))?;
    let mut unnamed = Vec::new();
    while let Some((subject, _)) = chunks.try_next().await.map_err(|e| EdgeError::transient(listing(), e))? {
        if subject.strip_prefix(&prefix).is_some_and(|nuid| !named.contains(nuid)) {
            unnamed.push(subject);
        }
    }
    let now = time::OffsetDateTime::now_utc();
    let mut old = Vec::new();
    for subject in unnamed {
        match stream.get_last_raw_message_by_subject(&subject).await {
            Ok(newest) if now - newest.time >= older_than => old.push(subject),
            Ok(_) => {}
            // Removed meanwhile (an object stored again purges its old chunks).
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => {}
            Err(e) => return Err(EdgeError::transient(format!("reading the newest chunk of {subject}"), e)),
        }
    }
    Ok(old)
}

/// Every object store of FlowMesh's: the shared one and each worker's own that exists now.
pub async fn stores(js: &jetstream::Context) -> Result<Vec<String>, EdgeError> {
    let prefix = subjects::object_stream("");
    Ok(product_streams(js).await?.iter().filter_map(|s| s.strip_prefix(&prefix)).map(str::to_owned).collect())
}

/// Why a stored file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{object} is not in {bucket}: {message}")]
    Missing { bucket: String, object: String, message: String },
    #[error("reading {object} from {bucket}: {message}")]
    Read { bucket: String, object: String, message: String },
    #[error("{object} in {bucket} is not what was stored: digest {found}, expected {expected}")]
    Corrupt { bucket: String, object: String, found: String, expected: String },
}

/// The object stores a reader has opened, by name (a task's files may be in any worker's).
pub struct Stores {
    js: jetstream::Context,
    open: Mutex<BTreeMap<String, ObjectStore>>,
}

impl Stores {
    pub fn new(js: &jetstream::Context) -> Stores {
        Stores { js: js.clone(), open: Mutex::new(BTreeMap::new()) }
    }

    async fn store(&self, bucket: &str) -> Result<ObjectStore, String> {
        let mut open = self.open.lock().await;
        if let Some(store) = open.get(bucket) {
            return Ok(store.clone());
        }
        let store = self.js.get_object_store(bucket).await.map_err(|e| e.to_string())?;
        open.insert(bucket.to_owned(), store.clone());
        Ok(store)
    }

    /// The bytes of object `object` in `bucket`.
    pub async fn read(&self, bucket: &str, object: &str) -> Result<Vec<u8>, FetchError> {
        let missing =
            |message: String| FetchError::Missing { bucket: bucket.to_owned(), object: object.to_owned(), message };
        let store = self.store(bucket).await.map_err(missing)?;
        let mut reader = store.get(object).await.map_err(|e| missing(e.to_string()))?;
        let mut bytes = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut reader, &mut bytes).await.map_err(|e| FetchError::Read {
            bucket: bucket.to_owned(),
            object: object.to_owned(),
            message: e.to_string(),
        })?;
        Ok(bytes)
    }

    /// The bytes of a file a task reported, checked against the digest in its report.
    pub async fn fetch(&self, artifact: &Artifact) -> Result<Vec<u8>, FetchError> {
        let bucket = bucket_of(artifact);
        let bytes = self.read(bucket, &artifact.object).await?;
        let found = crate::digest::sha256(&bytes);
        if found != artifact.digest {
            return Err(FetchError::Corrupt {
                bucket: bucket.to_owned(),
                object: artifact.object.clone(),
                found,
                expected: artifact.digest.clone(),
            });
        }
        Ok(bytes)
    }

    /// The first of `buckets` that holds `object` (a task's log, which no event lists), or `None`.
    /// No report names its digest, so it is checked against the one its store records (a
    /// worker's own store is written by that worker alone).
    pub async fn find(&self, buckets: &[String], object: &str) -> Result<Option<Vec<u8>>, FetchError> {
        for bucket in buckets {
            let bytes = match self.read(bucket, object).await {
                Ok(bytes) => bytes,
                Err(FetchError::Missing { .. }) => continue,
                Err(e) => return Err(e),
            };
            let recorded = match self.store(bucket).await {
                Ok(store) => store.info(object).await.ok().and_then(|info| info.digest),
                Err(_) => None,
            };
            let found = crate::digest::sha256(&bytes);
            if let Some(expected) = recorded
                && expected != found
            {
                let (bucket, object) = (bucket.clone(), object.to_owned());
                return Err(FetchError::Corrupt { bucket, object, found, expected });
            }
            return Ok(Some(bytes));
        }
        Ok(None)
    }
}

/// The store an artifact record names.
pub fn bucket_of(artifact: &Artifact) -> &str {
    artifact.bucket.as_deref().unwrap_or(subjects::ARTIFACTS_BUCKET)
}

/// Where a task's unlisted files (its logs) may be, most likely first: the store its reported
/// files name, the own store of the worker that ran it, the shared store.
pub fn task_buckets(worker_id: Option<&str>, artifacts: &[Artifact]) -> Vec<String> {
    let named = artifacts.iter().map(|a| bucket_of(a).to_owned());
    let own = worker_id.map(subjects::artifacts_bucket);
    let mut buckets: Vec<String> = Vec::new();
    for bucket in named.chain(own).chain([subjects::ARTIFACTS_BUCKET.to_owned()]) {
        if !buckets.contains(&bucket) {
            buckets.push(bucket);
        }
    }
    buckets
}

#[cfg(test)]
mod tests {
    use super::*;

    fn artifact(bucket: Option<&str>) -> Artifact {
        Artifact {
            name: "results.json".into(),
            object: "wf-1-a/results.json".into(),
            size: 2,
            digest: "SHA-256=x".into(),
            bucket: bucket.map(str::to_owned),
        }
    }

    #[test]
    fn a_tasks_logs_are_looked_for_where_its_files_are_first() {
        let cases: Vec<(Option<&str>, Vec<Artifact>, Vec<&str>)> = vec![
            (
                Some("w1"),
                vec![artifact(Some("flowmesh_artifacts_w1"))],
                vec!["flowmesh_artifacts_w1", "flowmesh_artifacts"],
            ),
            (Some("w1"), vec![], vec!["flowmesh_artifacts_w1", "flowmesh_artifacts"]),
            (Some("w1"), vec![artifact(None)], vec!["flowmesh_artifacts", "flowmesh_artifacts_w1"]),
            (None, vec![], vec!["flowmesh_artifacts"]),
        ];
        for (worker, artifacts, want) in cases {
            assert_eq!(task_buckets(worker, &artifacts), want, "{worker:?} {artifacts:?}");
        }
    }
}
