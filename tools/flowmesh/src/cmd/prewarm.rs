//! `flowmesh worker prewarm ID MODEL`: asks an idle worker to load a model ahead of a backlog.
//! The hint is recorded as `worker.prewarm_requested` and delivered on the worker's control
//! subject; the worker's snapshot then lists the model among its `warm_models`.

use flowmesh_domain::event::{Author, WorkerPrewarm};
use flowmesh_domain::{Event, EventBody, ids};
use flowmesh_nats::{clock, publish, subjects};
use std::process::ExitCode;

pub async fn run(
    client: &async_nats::Client,
    js: &async_nats::jetstream::Context,
    worker_id: &str,
    model: &str,
) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(ids::is_valid_worker_id(worker_id), "{worker_id:?} is not a worker id");
    anyhow::ensure!(!model.trim().is_empty(), "name a model, e.g. Qwen/Qwen3-0.6B");
    let now = clock::now_ms();
    let body =
        EventBody::WorkerPrewarmRequested(WorkerPrewarm { worker_id: worker_id.to_owned(), model: model.to_owned() });
    publish::publish_event(js, &Event::new(body, clock::rfc3339(now), now), Author::Service).await?;
    client.publish(subjects::prewarm(worker_id), model.to_owned().into()).await?;
    client.flush().await?;
    println!("prewarm hint for {model} sent to {worker_id}; `flowmesh worker info {worker_id}` lists it once warm");
    Ok(ExitCode::SUCCESS)
}
