//! The permission matrix: every shipped role (and a per-worker and a per-submitter user made by
//! `flowmesh_nats::auth::server_config`, as `flowmesh streams server-config` makes them) against
//! every action that matters. An allowed action must succeed; a forbidden one must fail *and*
//! the server must report a permissions violation for it on that connection, so a refusal is
//! never a timeout we merely assumed. Each user connects with its own inbox prefix, as the
//! binaries do: every allowed JetStream call below also proves replies arrive there.

use async_nats::jetstream::{self, consumer, message::PublishMessage, stream};
use flowmesh_nats::subjects;
use futures_util::StreamExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tests::{DEADLINE, World, role_password};

/// The users of the matrix: the five shipped roles, a per-worker user and a named submitter.
const USERS: [&str; 7] = ["submitter", "alice", "worker", "worker-own", "validator", "router", "admin"];

fn password(user: &str) -> &'static str {
    match user {
        "alice" => "alice-secret",
        "worker-own" => "own-secret",
        role => role_password(role),
    }
}

/// One user's connection, and every server error reported on it.
struct Login {
    client: async_nats::Client,
    js: jetstream::Context,
    errors: Arc<Mutex<Vec<String>>>,
}

async fn login(world: &World, user: &str) -> anyhow::Result<Login> {
    let errors = Arc::new(Mutex::new(Vec::new()));
    let seen = errors.clone();
    let client = async_nats::ConnectOptions::with_user_and_password(user.into(), password(user).into())
        .custom_inbox_prefix(subjects::inbox_prefix(user))
        .event_callback(move |event| {
            let seen = seen.clone();
            async move {
                if let async_nats::Event::ServerError(e) = event {
                    seen.lock().unwrap().push(e.to_string());
                }
            }
        })
        .connect(world.url())
        .await?;
    // A refused request is never answered: a short timeout keeps each refusal short.
    let js = jetstream::ContextBuilder::new().timeout(Duration::from_secs(1)).build(client.clone());
    Ok(Login { client, js, errors })
}

/// What a user tries. `fragment` is a part of the subject the server names when it refuses.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Action {
    Submit,
    WriteVerdict,
    WriteDispatch,
    WriteRequeue,
    EndWorkflow,
    WritePurgeRecord,
    ReportAsOwn,
    ReportAsOther,
    SendWork,
    SendHint,
    HearHints,
    HearEvents,
    WriteOwnSnapshot,
    WriteOtherSnapshot,
    TakeRouterLease,
    ReadSubmission,
    ReadWorkOrder,
    ReadLogMessage,
    FollowLog,
    TakeOwnDispatches,
    TakeOthersDispatches,
    NameConsumerOnLog,
    StoreArtifact,
    CreateOwnStore,
    StoreInOwnStore,
    StoreInOthersStore,
    FetchArtifact,
    FetchFromOthersStore,
    PurgeArtifacts,
    PurgeOwnStore,
    PruneOwnStore,
    PurgeLog,
    DeleteLogMessage,
    DeleteConsumer,
    CreateStream,
    DeleteStream,
    HearOtherWorkersCancels,
    HearOtherWorkersReleases,
    ReadSharedInbox,
    ReadAlicesInbox,
    RollUpFleet,
    RollUpArtifacts,
    RollUpOthersStore,
}

use Action::*;

/// Every cell: the action, the users allowed to do it (all others must be refused).
const MATRIX: &[(Action, &[&str])] = &[
    (Submit, &["submitter", "alice", "admin"]),
    (WriteVerdict, &["validator", "admin"]),
    (WriteDispatch, &["router", "admin"]),
    (WriteRequeue, &["router", "admin"]),
    (EndWorkflow, &["router", "admin"]),
    // Routers drop every workflow a purge record lists, running or not.
    (WritePurgeRecord, &["router", "admin"]),
    // The router completes a merged task in its leader's worker's name (ARCHITECTURE.md).
    (ReportAsOwn, &["worker", "worker-own", "router", "admin"]),
    (ReportAsOther, &["worker", "router", "admin"]),
    (SendWork, &["router", "admin"]),
    (SendHint, &["router", "admin"]),
    (HearHints, &["submitter", "alice", "admin"]),
    // Events as they are published (how `flowmesh bench` hears ends): what a reader of the log
    // may read anyway, without a consumer.
    (HearEvents, &["submitter", "alice", "admin"]),
    (WriteOwnSnapshot, &["worker", "worker-own", "admin"]),
    (WriteOtherSnapshot, &["worker", "admin"]),
    (TakeRouterLease, &["router", "admin"]),
    (ReadSubmission, &["router", "admin"]),
    (ReadWorkOrder, &["worker", "router", "admin"]),
    (ReadLogMessage, &["submitter", "alice", "worker", "worker-own", "validator", "router", "admin"]),
    (FollowLog, &["submitter", "alice", "worker", "worker-own", "router", "admin"]),
    // A worker's queue is a named consumer on the log's dispatches to it: nobody else may make
    // or reconfigure it, and named consumers on the log are not for readers.
    (TakeOwnDispatches, &["worker", "worker-own", "router", "admin"]),
    (TakeOthersDispatches, &["worker", "router", "admin"]),
    (NameConsumerOnLog, &["router", "admin"]),
    // A per-worker user stores files only in its own store (`flowmesh_artifacts_own`); the shared
    // worker user, one identity for all workers, only in the shared one.
    (StoreArtifact, &["worker", "admin"]),
    (CreateOwnStore, &["worker-own", "admin"]),
    (StoreInOwnStore, &["worker-own", "admin"]),
    (StoreInOthersStore, &["admin"]),
    (FetchArtifact, &["submitter", "alice", "worker", "worker-own", "admin"]),
    (FetchFromOthersStore, &["submitter", "alice", "worker", "worker-own", "admin"]),
    (PurgeArtifacts, &["admin"]),
    (PurgeOwnStore, &["worker-own", "admin"]),
    // As a worker prunes its store of purged workflows' files: the purge record read, the store
    // listed, an object purged whole.
    (PruneOwnStore, &["worker-own", "admin"]),
    // Retention: the router purges the events of workflows that ended long enough ago.
    (PurgeLog, &["router", "admin"]),
    (DeleteLogMessage, &["router", "admin"]),
    (DeleteConsumer, &["admin"]),
    (CreateStream, &["admin"]),
    (DeleteStream, &["admin"]),
    (HearOtherWorkersCancels, &["worker", "admin"]),
    (HearOtherWorkersReleases, &["worker", "admin"]),
    (ReadSharedInbox, &["admin"]),
    (ReadAlicesInbox, &["alice", "admin"]),
    // Last: the admin's cells wipe a bucket. The fleet bucket refuses rollups to everyone
    // (`allow_rollup: false` in its definition), those who may write it included.
    (RollUpFleet, &[]),
    (RollUpArtifacts, &["admin"]),
    (RollUpOthersStore, &["admin"]),
];

/// Cells where the server allows what the policy forbids. Permissions see subjects, not headers,
/// and a stream that takes rollups (an object store does: its metadata uses `Nats-Rollup: sub`)
/// also takes `Nats-Rollup: all` from anyone who may write one of its subjects: the shared worker
/// user can empty the shared artifact store. A per-worker user writes only its own store, so it
/// can empty only that (`RollUpOthersStore` is refused). (The fleet bucket takes no rollups at
/// all: `RollUpFleet`.) Each gap is asserted to be still open, so whoever closes one must remove
/// it here (ARCHITECTURE.md, "Roles").
const KNOWN_GAPS: &[(Action, &str)] = &[(RollUpArtifacts, "worker")];

/// The own store of the matrix's per-worker user, and another worker's.
const OWN_STORE: &str = "flowmesh_artifacts_own";
const OTHERS_STORE: &str = "flowmesh_artifacts_other";

/// The scratch stream `CreateStream` makes and `DeleteStream` removes (admin's only).
const SCRATCH: &str = "FLOWMESH_BENCH_RAW_matrix";

impl Action {
    /// What a stream (not a permission) answers when it refuses the action to a user whose
    /// permissions allow the subject.
    fn refused_by_stream(self) -> Option<&'static str> {
        match self {
            RollUpFleet => Some("rollup"),
            _ => None,
        }
    }

    fn fragment(self) -> &'static str {
        match self {
            Submit => "flowmesh.submit",
            WriteVerdict => "submission.accepted",
            WriteDispatch => "own.wf-1.wf-1-main.task.dispatched",
            WriteRequeue => "task.requeued",
            EndWorkflow => "workflow.completed",
            WritePurgeRecord => "workflows.purged",
            ReportAsOwn => "own.wf-1.wf-1-main.task.completed",
            ReportAsOther => "other.wf-1.wf-1-main.task.completed",
            SendWork => "flowmesh.work.own",
            SendHint => "flowmesh.hints.wf-1.",
            HearHints => "flowmesh.hints.wf-1.*",
            HearEvents => "flowmesh.events.*.*.*.task.completed",
            WriteOwnSnapshot => "$KV.flowmesh_workers.own",
            WriteOtherSnapshot => "$KV.flowmesh_workers.other",
            RollUpFleet => "$KV.flowmesh_workers",
            RollUpArtifacts => "$O.flowmesh_artifacts.",
            TakeRouterLease => "$KV.flowmesh_control.router-leader",
            ReadSubmission => "FLOWMESH_SUBMISSIONS",
            ReadWorkOrder => "FLOWMESH_WORK",
            ReadLogMessage => "FLOWMESH_EVENTS",
            FollowLog => "CONSUMER.CREATE.FLOWMESH_EVENTS",
            TakeOwnDispatches => "CONSUMER.CREATE.FLOWMESH_EVENTS.worker-own.",
            TakeOthersDispatches => "CONSUMER.CREATE.FLOWMESH_EVENTS.worker-other.",
            NameConsumerOnLog => "CONSUMER.CREATE.FLOWMESH_EVENTS.spy.",
            StoreArtifact => "$O.flowmesh_artifacts.",
            CreateOwnStore => "STREAM.CREATE.OBJ_flowmesh_artifacts_own",
            StoreInOwnStore => "$O.flowmesh_artifacts_own",
            StoreInOthersStore => "$O.flowmesh_artifacts_other",
            FetchArtifact => "OBJ_flowmesh_artifacts",
            FetchFromOthersStore => "OBJ_flowmesh_artifacts_other",
            PurgeArtifacts => "STREAM.PURGE.OBJ_flowmesh_artifacts",
            PurgeOwnStore => "STREAM.PURGE.OBJ_flowmesh_artifacts_own",
            PruneOwnStore => "$O.flowmesh_artifacts_own",
            RollUpOthersStore => "$O.flowmesh_artifacts_other",
            PurgeLog => "STREAM.PURGE.FLOWMESH_EVENTS",
            DeleteLogMessage => "STREAM.MSG.DELETE.FLOWMESH_EVENTS",
            DeleteConsumer => "CONSUMER.DELETE.FLOWMESH_EVENTS",
            CreateStream => "STREAM.CREATE",
            DeleteStream => "STREAM.DELETE",
            HearOtherWorkersCancels => "flowmesh.control.other.cancel",
            HearOtherWorkersReleases => "flowmesh.control.other.release",
            ReadSharedInbox => "_INBOX.>",
            ReadAlicesInbox => "_INBOX_alice.>",
        }
    }

    /// Tries the action as `me`; `Ok` when the server did it.
    async fn run(self, user: &str, me: &Login, world: &World, seeds: &Seeds) -> Result<(), String> {
        let event = |first: &str, suffix: &str| subjects::event(&format!("{first}.wf-1.{suffix}"));
        match self {
            Submit => store(&me.js, subjects::SUBMIT.to_owned(), b"apiVersion: flowmesh/v1").await,
            WriteVerdict => store(&me.js, event("_", "_.submission.accepted"), b"{}").await,
            WriteDispatch => store(&me.js, event("own", "wf-1-main.task.dispatched"), b"{}").await,
            WriteRequeue => store(&me.js, event("_", "wf-1-main.task.requeued"), b"{}").await,
            EndWorkflow => store(&me.js, event("_", "_.workflow.completed"), b"{}").await,
            WritePurgeRecord => store(&me.js, subjects::purge_records(), b"{}").await,
            ReportAsOwn => store(&me.js, event("own", "wf-1-main.task.completed"), b"{}").await,
            ReportAsOther => store(&me.js, event("other", "wf-1-main.task.completed"), b"{}").await,
            SendWork => store(&me.js, subjects::work("own"), b"{}").await,
            // A core publish: refused by the server or heard by the admin's subscription.
            SendHint => {
                // One subject per user: the cells run at once, and one user's hint must not
                // count as another's.
                let subject = subjects::hint("wf-1", &format!("wf-1-{user}"));
                let listener = login(world, "admin").await.map_err(text)?;
                let mut heard = listener.client.subscribe(subject.clone()).await.map_err(text)?;
                listener.client.flush().await.map_err(text)?;
                until_heard(&me.client, &subject, &mut heard).await
            }
            HearHints => hear(me, world, &subjects::workflow_hints("wf-1"), &subjects::hint("wf-1", "wf-1-main")).await,
            HearEvents => {
                let probe = subjects::event("w-1.wf-hear.wf-hear-main.task.completed");
                hear(me, world, &subjects::events_of_kind("task.completed"), &probe).await
            }
            WriteOwnSnapshot => kv_put(&me.js, subjects::WORKERS_BUCKET, "own").await,
            WriteOtherSnapshot => kv_put(&me.js, subjects::WORKERS_BUCKET, "other").await,
            // `Nats-Rollup: all` on a key one may write would purge every other key of the bucket.
            RollUpFleet => roll_up(&me.js, format!("$KV.{}.own", subjects::WORKERS_BUCKET)).await,
            RollUpArtifacts => roll_up(&me.js, format!("$O.{}.C.matrix", subjects::ARTIFACTS_BUCKET)).await,
            RollUpOthersStore => roll_up(&me.js, format!("$O.{OTHERS_STORE}.C.matrix")).await,
            TakeRouterLease => kv_put(&me.js, subjects::CONTROL_BUCKET, "router-leader").await,
            ReadSubmission => read(&me.js, subjects::SUBMISSIONS_STREAM, seeds.submission).await,
            ReadWorkOrder => read(&me.js, subjects::WORK_STREAM, seeds.work_order).await,
            ReadLogMessage => read(&me.js, subjects::EVENTS_STREAM, 1).await,
            FollowLog => follow(&me.js).await,
            TakeOwnDispatches => dispatch_queue(&me.js, "worker-own", subjects::dispatches("own")).await,
            TakeOthersDispatches => dispatch_queue(&me.js, "worker-other", subjects::dispatches("other")).await,
            NameConsumerOnLog => dispatch_queue(&me.js, "spy", subjects::all_events()).await,
            StoreArtifact => put_object(&me.js, subjects::ARTIFACTS_BUCKET, user).await,
            // As a worker makes its store at start (another allowed user may have made it first:
            // creating one of the same settings again succeeds).
            CreateOwnStore => flowmesh_nats::artifacts::create_bucket(&me.js, OWN_STORE).await.map(drop).map_err(text),
            StoreInOwnStore => put_object(&me.js, OWN_STORE, user).await,
            StoreInOthersStore => put_object(&me.js, OTHERS_STORE, user).await,
            FetchArtifact => fetch(&me.js, subjects::ARTIFACTS_BUCKET, &seeds.artifact).await,
            FetchFromOthersStore => fetch(&me.js, OTHERS_STORE, &seeds.artifact).await,
            PurgeArtifacts => purge_store(&me.js, subjects::ARTIFACTS_BUCKET).await,
            PurgeOwnStore => purge_store(&me.js, OWN_STORE).await,
            PruneOwnStore => prune_store(&me.js, OWN_STORE, user).await,
            PurgeLog => {
                let stream = me.js.get_stream_no_info(subjects::EVENTS_STREAM).await.map_err(text)?;
                stream.purge().filter(subjects::event("nothing.>")).await.map(drop).map_err(text)
            }
            DeleteLogMessage => {
                // As retention deletes: several users may, so the seed is deleted already, and
                // one already gone counts as deleted (the permission is on the request).
                flowmesh_nats::retention::delete_event(&me.js, seeds.sacrifice).await
            }
            DeleteConsumer => {
                let stream = me.js.get_stream_no_info(subjects::EVENTS_STREAM).await.map_err(text)?;
                stream.delete_consumer("victim").await.map(drop).map_err(text)
            }
            CreateStream => me
                .js
                .create_stream(stream::Config {
                    name: SCRATCH.to_owned(),
                    subjects: vec![subjects::bench_raw("matrix")],
                    ..Default::default()
                })
                .await
                .map(drop)
                .map_err(text),
            DeleteStream => me.js.delete_stream(SCRATCH).await.map(drop).map_err(text),
            HearOtherWorkersCancels => hear(me, world, &subjects::cancel("other"), &subjects::cancel("other")).await,
            HearOtherWorkersReleases => hear(me, world, &subjects::release("other"), &subjects::release("other")).await,
            ReadSharedInbox => hear(me, world, "_INBOX.>", "_INBOX.matrix-probe").await,
            ReadAlicesInbox => {
                hear(me, world, &subjects::inbox("alice"), &format!("{}.probe", subjects::inbox_prefix("alice"))).await
            }
        }
    }
}

fn text(e: impl std::fmt::Display) -> String {
    e.to_string()
}

async fn put_object(js: &jetstream::Context, bucket: &str, user: &str) -> Result<(), String> {
    let store = js.get_object_store(bucket).await.map_err(text)?;
    let mut data: &[u8] = b"made by the matrix";
    store.put(format!("wf-1-main/matrix-{user}.txt").as_str(), &mut data).await.map(drop).map_err(text)
}

async fn fetch(js: &jetstream::Context, bucket: &str, name: &str) -> Result<(), String> {
    let store = js.get_object_store(bucket).await.map_err(text)?;
    let mut object = store.get(name).await.map_err(text)?;
    let mut bytes = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut object, &mut bytes).await.map_err(text)?;
    if bytes == b"seeded" { Ok(()) } else { Err(format!("read {bytes:?}")) }
}

async fn purge_store(js: &jetstream::Context, bucket: &str) -> Result<(), String> {
    let stream = js.get_stream_no_info(subjects::object_stream(bucket)).await.map_err(text)?;
    // A filter that matches nothing: the permission is on the request, not on what it purges.
    stream.purge().filter(format!("$O.{bucket}.C.nothing")).await.map(drop).map_err(text)
}

/// Stores a file of workflow `wf-424242` and the chunk of an upload that stopped halfway, and
/// prunes the store as if that workflow were purged and every orphan old (listing its records
/// and chunks, reading the orphan's newest chunk, purging): the file and the orphan, and only
/// they, must go. Those who may not write the store are refused the file first.
async fn prune_store(js: &jetstream::Context, bucket: &str, user: &str) -> Result<(), String> {
    let objects = js.get_object_store(bucket).await.map_err(text)?;
    let mut data: &[u8] = b"of a purged workflow";
    objects.put(format!("wf-424242-main/prune-{user}.txt").as_str(), &mut data).await.map_err(text)?;
    store(js, format!("$O.{bucket}.C.HALFWAY"), b"an upload's first chunk").await?;
    let mut purged = flowmesh_domain::ids::WorkflowIds::default();
    purged.insert("wf-424242");
    match flowmesh_nats::artifacts::prune(js, bucket, &purged, Duration::ZERO).await.map_err(text)? {
        pruned if pruned.removed == 1 && pruned.orphans == 1 && pruned.failed == 0 => Ok(()),
        pruned => Err(format!("{pruned:?}")),
    }
}

/// Publishes with JetStream and waits for the stream's ack.
async fn store(js: &jetstream::Context, subject: String, payload: &'static [u8]) -> Result<(), String> {
    let ack = js.send_publish(subject, PublishMessage::build().payload(payload.into())).await.map_err(text)?;
    tokio::time::timeout(Duration::from_secs(2), ack).await.map_err(text)?.map(drop).map_err(text)
}

async fn kv_put(js: &jetstream::Context, bucket: &str, key: &str) -> Result<(), String> {
    let kv = js.get_key_value(bucket).await.map_err(text)?;
    kv.put(key, "{}".into()).await.map(drop).map_err(text)
}

/// Reads one message by sequence (`STREAM.MSG.GET`).
async fn read(js: &jetstream::Context, stream: &str, seq: u64) -> Result<(), String> {
    let stream = js.get_stream_no_info(stream).await.map_err(text)?;
    stream.get_raw_message(seq).await.map(drop).map_err(text)
}

/// Opens an ordered consumer on the log and takes its first message, as every CLI view does.
async fn follow(js: &jetstream::Context) -> Result<(), String> {
    let stream = js.get_stream_no_info(subjects::EVENTS_STREAM).await.map_err(text)?;
    let consumer = stream
        .create_consumer(consumer::pull::OrderedConfig {
            deliver_policy: consumer::DeliverPolicy::All,
            ..Default::default()
        })
        .await
        .map_err(text)?;
    let mut messages = consumer.messages().await.map_err(text)?;
    match tokio::time::timeout(Duration::from_secs(2), messages.next()).await {
        Ok(Some(Ok(_))) => Ok(()),
        other => Err(format!("no message: {other:?}")),
    }
}

/// Creates (or updates to the same settings) the durable push consumer `name` on the log, as a
/// worker makes its dispatch queue. Every user asks for the same settings per name, so cells
/// that run at once agree.
async fn dispatch_queue(js: &jetstream::Context, name: &str, filter: String) -> Result<(), String> {
    let stream = js.get_stream_no_info(subjects::EVENTS_STREAM).await.map_err(text)?;
    stream
        .create_consumer(consumer::push::Config {
            durable_name: Some(name.to_owned()),
            deliver_subject: subjects::dispatch_inbox(&subjects::inbox_prefix(name), name),
            filter_subject: filter,
            ack_policy: consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await
        .map(drop)
        .map_err(text)
}

/// Subscribes to `filter` and waits for a probe the admin publishes on `probe`.
async fn hear(me: &Login, world: &World, filter: &str, probe: &str) -> Result<(), String> {
    let mut subscription = me.client.subscribe(filter.to_owned()).await.map_err(text)?;
    me.client.flush().await.map_err(text)?;
    // The server may refuse the subscription after it was sent: publish until heard or refused.
    until_heard(&world.client, probe, &mut subscription).await.map_err(|_| format!("nothing heard on {filter}"))
}

/// A message with `Nats-Rollup: all` on `subject`: on a subject one may write, it would purge
/// every other message of the stream.
async fn roll_up(js: &jetstream::Context, subject: String) -> Result<(), String> {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Rollup", "all");
    let ack = js.publish_with_headers(subject, headers, "{}".into()).await.map_err(text)?;
    ack.await.map(drop).map_err(text)
}

/// Publishes on `subject` from `publisher` again and again until `subscription` hears it (a
/// single delivery can be slow on a loaded machine), for up to 5 s.
async fn until_heard(
    publisher: &async_nats::Client,
    subject: &str,
    subscription: &mut async_nats::Subscriber,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::time::Instant::now() < deadline {
        publisher.publish(subject.to_owned(), "{}".into()).await.map_err(text)?;
        publisher.flush().await.map_err(text)?;
        if let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(250), subscription.next()).await {
            return Ok(());
        }
    }
    Err(format!("nothing published on {subject} was delivered within 5 s"))
}

/// Messages the cells read, stored by the admin before the matrix runs.
struct Seeds {
    submission: u64,
    work_order: u64,
    /// A message of the log, deleted already.
    sacrifice: u64,
    artifact: String,
}

async fn seed(world: &World) -> anyhow::Result<Seeds> {
    let js = &world.handles.js;
    let event = js.publish(subjects::event("wf-1._.submission.rejected"), "{}".into()).await?.await?;
    assert_eq!(event.sequence, 1, "the log's first message is the one every role may read");
    let submission = js.publish(subjects::SUBMIT, "a document".into()).await?.await?.sequence;
    let work_order = js.publish(subjects::work("own"), "{}".into()).await?.await?.sequence;
    let sacrifice = js.publish(subjects::event("wf-1._.workflow.failed"), "{}".into()).await?.await?.sequence;
    // A message after it, so that it lies inside the stream (the last one cannot be deleted).
    js.publish(subjects::event("wf-1._.workflow.cancelled"), "{}".into()).await?.await?;
    js.get_stream(subjects::EVENTS_STREAM).await?.delete_message(sacrifice).await?;
    let artifact = "wf-1-main/results.json".to_owned();
    let mut data: &[u8] = b"seeded";
    world.handles.artifacts.put(artifact.as_str(), &mut data).await?;
    // Another worker's store, made as that worker would make it; the matrix's own is made by a cell.
    let mut data: &[u8] = b"seeded";
    flowmesh_nats::artifacts::ensure_bucket(js, OTHERS_STORE).await?.put(artifact.as_str(), &mut data).await?;
    js.get_stream(subjects::EVENTS_STREAM)
        .await?
        .create_consumer(consumer::pull::Config { durable_name: Some("victim".to_owned()), ..Default::default() })
        .await?;
    Ok(Seeds { submission, work_order, sacrifice, artifact })
}

/// Waits until the server has reported a permissions violation naming `fragment` on `me`.
async fn violation(me: &Login, fragment: &str, before: usize) -> Result<String, Vec<String>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let errors = me.errors.lock().unwrap()[before..].to_vec();
        if let Some(found) =
            errors.iter().find(|e| e.to_lowercase().contains("permissions violation") && e.contains(fragment))
        {
            return Ok(found.clone());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(errors);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One cell: `None` when `user` may do `action` and did, or may not and was refused with a
/// permissions violation; otherwise what was wrong.
async fn cell(
    action: Action,
    allowed: &[&str],
    user: &str,
    me: &Login,
    world: &World,
    seeds: &Seeds,
) -> Option<String> {
    let before = me.errors.lock().unwrap().len();
    let outcome = action.run(user, me, world, seeds).await;
    if KNOWN_GAPS.contains(&(action, user)) {
        return outcome
            .err()
            .map(|e| format!("{user} {action:?}: a known gap is closed ({e}): remove it from KNOWN_GAPS"));
    }
    match (allowed.contains(&user), outcome) {
        (true, Ok(())) => None,
        (true, Err(e)) => Some(format!("{user} {action:?}: refused, should be allowed: {e}")),
        (false, Ok(())) => Some(format!("{user} {action:?}: allowed, should be refused")),
        (false, Err(e)) if action.refused_by_stream().is_some_and(|why| e.to_lowercase().contains(why)) => None,
        (false, Err(e)) => violation(me, action.fragment(), before).await.err().map(|errors| {
            format!(
                "{user} {action:?}: failed ({e}) without a permissions violation naming {:?}; server said {errors:?}",
                action.fragment()
            )
        }),
    }
}

#[tokio::test]
async fn every_role_may_do_exactly_its_cells_of_the_matrix() -> anyhow::Result<()> {
    let config = flowmesh_nats::auth::server_config(&["own".to_owned(), "other".to_owned()], &["alice".to_owned()])
        .map_err(|e| anyhow::anyhow!(e))?;
    let world = World::start_secured_with(
        &config,
        &[
            ("FLOWMESH_WORKER_OWN_PASSWORD", "own-secret"),
            ("FLOWMESH_WORKER_OTHER_PASSWORD", "other-secret"),
            ("FLOWMESH_SUBMITTER_ALICE_PASSWORD", "alice-secret"),
        ],
    )
    .await?;
    let seeds = seed(&world).await?;
    let mut logins = Vec::new();
    for user in USERS {
        logins.push((user, login(&world, user).await?));
    }
    let started = tokio::time::Instant::now();
    let mut wrong = Vec::new();
    for (action, allowed) in MATRIX {
        // Everyone but the admin at once (each on its own connection); the admin last, since
        // its cells may delete what the others are refused.
        let (admin, others): (Vec<_>, Vec<_>) = logins.iter().partition(|(user, _)| *user == "admin");
        let outcomes = futures_util::future::join_all(
            others.iter().map(|(user, me)| cell(*action, allowed, user, me, &world, &seeds)),
        )
        .await;
        wrong.extend(outcomes.into_iter().flatten());
        for (user, me) in admin {
            wrong.extend(cell(*action, allowed, user, me, &world, &seeds).await);
        }
    }
    assert!(wrong.is_empty(), "{} wrong cell(s):\n{}", wrong.len(), wrong.join("\n"));
    assert!(started.elapsed() < DEADLINE * 10, "the matrix took {:?}", started.elapsed());
    world.shutdown().await;
    Ok(())
}
