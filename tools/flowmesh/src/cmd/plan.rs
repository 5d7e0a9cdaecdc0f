//! `flowmesh plan FILE`: where each stage would be placed now, and why not elsewhere; nothing is
//! submitted. Exits 1 when a stage would find no worker.

use flowmesh::{log, views};
use flowmesh_domain::placement::Strategy;
use flowmesh_nats::cli::NatsArgs;
use flowmesh_nats::{clock, subjects};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    file: PathBuf,
    #[arg(long, env = "ROUTER_STRATEGY", value_enum, default_value = "best_fit")]
    strategy: Strategy,
    #[arg(long)]
    json: bool,
}

pub async fn run(nats: &NatsArgs, args: Args) -> anyhow::Result<ExitCode> {
    let body = super::read_document(&args.file)?;
    let workflow = match flowmesh_domain::validate_submission(&body, "wf-plan") {
        Ok(w) => w,
        Err(problems) => {
            eprintln!("{} is not valid:\n{}", args.file.display(), flowmesh::plan::render_problems(&problems));
            return Ok(ExitCode::from(1));
        }
    };
    let (_, handles) = nats.handles("flowmesh-cli").await?;
    let live: Vec<_> =
        views::workers(&handles.js).await?.into_iter().filter(|(w, age)| *age <= w.ttl_sec).map(|(w, _)| w).collect();
    let fleet_state = log::fold(&handles.js, subjects::fleet_events()).await?;
    // Which running inference request an identical stage would share: read only when it can matter.
    let leaders = if workflow.tasks.iter().any(|t| t.task_type == "inference") {
        flowmesh_domain::schedule::merge_leaders(&log::fold(&handles.js, subjects::all_events()).await?)
    } else {
        Default::default()
    };
    let (cordoned, draining) = (&fleet_state.cordoned, &fleet_state.draining);
    let plans = flowmesh::plan::plan(&workflow, &live, cordoned, draining, &leaders, args.strategy, clock::now_ms());
    if args.json {
        println!("{}", serde_json::to_string_pretty(&plans)?);
    } else {
        print!("{}", flowmesh::plan::render(&plans));
    }
    Ok(super::exit(plans.iter().all(|p| p.chosen.is_some())))
}
