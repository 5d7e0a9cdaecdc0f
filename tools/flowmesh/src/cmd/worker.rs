//! `flowmesh worker list|info|cordon|uncordon|drain|prewarm`: the fleet as its snapshots and the
//! log show it, and the operators' requests to it. (`flowmesh worker` with no subcommand runs a
//! worker: `serve`.)

use flowmesh::{log, table, views};
use flowmesh_domain::EventBody;
use flowmesh_domain::event::{WorkerCordon, WorkerPrewarm};
use flowmesh_domain::ids;
use flowmesh_nats::cli::NatsArgs;
use flowmesh_nats::subjects;
use std::process::ExitCode;

#[derive(clap::Subcommand)]
pub enum Command {
    /// Every worker with its task types, hardware, slots and staleness.
    List {
        #[arg(long)]
        json: bool,
    },
    /// One worker's whole snapshot.
    Info { id: String },
    /// Stop placing new work on a worker.
    Cordon { id: String },
    /// Place work on a worker again (also ends a drain).
    Uncordon { id: String },
    /// Stop placing new work on a worker and let what it runs finish; `worker list` shows
    /// `draining (N running)`, then `drained` (safe to stop it).
    Drain { id: String },
    /// Ask an idle worker to load a model ahead of the tasks that need it (a hint).
    Prewarm { id: String, model: String },
}

pub async fn run(nats: &NatsArgs, command: Command) -> anyhow::Result<ExitCode> {
    let (client, handles) = nats.handles("flowmesh-cli").await?;
    match command {
        Command::Prewarm { id, model } => {
            // The hint is recorded as `worker.prewarm_requested` and delivered on the worker's
            // control subject; the worker's snapshot then lists the model among its `warm_models`.
            anyhow::ensure!(ids::is_valid_worker_id(&id), "{id:?} is not a worker id");
            anyhow::ensure!(!model.trim().is_empty(), "name a model, e.g. Qwen/Qwen3-0.6B");
            let body = EventBody::WorkerPrewarmRequested(WorkerPrewarm { worker_id: id.clone(), model: model.clone() });
            super::operate(&handles.js, body).await?;
            client.publish(subjects::prewarm(&id), model.clone().into()).await?;
            client.flush().await?;
            println!("prewarm hint for {model} sent to {id}; `flowmesh worker info {id}` lists it once warm");
        }
        Command::List { json } => {
            let workers = views::workers(&handles.js).await?;
            let mut fleet = log::fold(&handles.js, subjects::fleet_events()).await?;
            if !fleet.draining.is_empty() {
                // What a draining worker still runs is in the log (its snapshot lags a heartbeat).
                fleet = log::fold(&handles.js, subjects::all_events()).await?;
            }
            let rows = views::worker_rows(workers, &fleet);
            if json {
                super::print_sorted_json(&rows)?;
            } else {
                print!("{}", table::rows(&rows));
            }
        }
        Command::Info { id } => {
            let workers = views::workers(&handles.js).await?;
            let (w, _) = workers
                .iter()
                .find(|(w, _)| w.id == id)
                .ok_or_else(|| anyhow::anyhow!("no worker {id:?} in {}", subjects::WORKERS_BUCKET))?;
            println!("{}", serde_json::to_string_pretty(w)?);
        }
        Command::Cordon { id } | Command::Uncordon { id } | Command::Drain { id } if !ids::is_valid_worker_id(&id) => {
            anyhow::bail!("{id:?} is not a worker id");
        }
        Command::Cordon { id } => {
            super::operate(&handles.js, EventBody::WorkerCordoned(WorkerCordon { worker_id: id.clone() })).await?;
            println!("{id} cordoned: no new work will be placed on it");
        }
        Command::Uncordon { id } => {
            super::operate(&handles.js, EventBody::WorkerUncordoned(WorkerCordon { worker_id: id.clone() })).await?;
            println!("{id} uncordoned");
        }
        Command::Drain { id } => {
            super::operate(&handles.js, EventBody::WorkerDrainRequested(WorkerCordon { worker_id: id.clone() }))
                .await?;
            println!("{id} draining: no new work; running tasks finish (see flowmesh worker list); uncordon to undo");
        }
    }
    Ok(ExitCode::SUCCESS)
}
