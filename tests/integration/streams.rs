//! The streams, buckets and object stores as the server holds them: what their definitions in
//! `streams/` set is what the server enforces.

use async_nats::jetstream::consumer::pull;
use flowmesh_nats::subjects;
use std::time::Duration;
use tests::{World, worker_config};

/// Readers that come and go within a minute: each `flowmesh submit`, `watch`, `events` or
/// `workflow list` opens a consumer on the log that the server keeps a while after its reader
/// left, and a fleet keeps one durable consumer per worker.
const READERS: usize = 1_100;

#[tokio::test]
async fn the_log_and_every_store_take_more_consumers_than_the_servers_default_thousand() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    // A worker makes its own object store at start.
    world.worker(worker_config(&world, "w1", None)).await?;
    let js = &world.handles.js;
    let own = subjects::object_stream(&subjects::artifacts_bucket("w1"));
    let deadline = tokio::time::Instant::now() + tests::DEADLINE;
    while js.get_stream(&own).await.is_err() {
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "the worker made no store {own}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for name in flowmesh_nats::artifacts::product_streams(js).await? {
        let mut stream = js.get_stream(&name).await?;
        let limit = stream.info().await?.config.max_consumers;
        assert!(limit >= 100_000, "{name} takes at most {limit} consumers");
    }
    // A worker's own store found with another limit gets the shared store's when it is opened.
    let shared = js.get_stream(subjects::object_stream(subjects::ARTIFACTS_BUCKET)).await?.info().await?.config.clone();
    let mut older = js.get_stream(&own).await?.info().await?.config.clone();
    older.max_consumers = 500;
    js.update_stream(&older).await?;
    flowmesh_nats::artifacts::ensure_bucket(js, &subjects::artifacts_bucket("w1")).await?;
    let limit = js.get_stream(&own).await?.info().await?.config.max_consumers;
    assert_eq!(limit, shared.max_consumers, "{own} reopened");
    // A deployment made before the limit was defined gets it when a service starts.
    let mut old = js.get_stream(subjects::EVENTS_STREAM).await?.info().await?.config.clone();
    old.max_consumers = -1;
    js.update_stream(&old).await?;
    flowmesh_nats::topology::Handles::ensure(&world.client, &flowmesh_nats::topology::Topology::load(1)?).await?;
    let limit = js.get_stream(subjects::EVENTS_STREAM).await?.info().await?.config.max_consumers;
    assert!(limit >= 100_000, "after a restart the log takes at most {limit} consumers");
    // And the server honours the log's limit.
    let log = js.get_stream(subjects::EVENTS_STREAM).await?;
    for n in 0..READERS {
        let reader = pull::Config { inactive_threshold: Duration::from_secs(60), ..Default::default() };
        log.create_consumer(reader).await.map_err(|e| anyhow::anyhow!("reader {n}: {e}"))?;
    }
    world.shutdown().await;
    Ok(())
}
