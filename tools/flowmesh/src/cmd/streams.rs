//! `flowmesh streams apply|status|server-config|prune-artifacts`: the streams, buckets and object
//! store defined in `streams/`, their replication health, a server config with a user per
//! worker, and the removal of purged workflows' files from every object store.

use flowmesh::{table, views};
use flowmesh_nats::cli::NatsArgs;
use flowmesh_nats::subjects;
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Subcommand)]
pub enum Command {
    Apply,
    /// Every stream's leader and replicas; exit 0 when each has a leader and current replicas.
    Status {
        /// Wait up to this many seconds for every stream to be healthy.
        #[arg(long, default_value_t = 0)]
        wait: u64,
        #[arg(long)]
        json: bool,
    },
    /// Print streams/nats-server.conf with a user of its own for each worker (`worker-ID`, its
    /// password in FLOWMESH_WORKER_ID_PASSWORD), allowed only that worker's work and keys, and
    /// for each submitter (`NAME`, its password in FLOWMESH_SUBMITTER_NAME_PASSWORD).
    ServerConfig {
        /// A worker id; repeat for each worker.
        #[arg(long = "worker")]
        workers: Vec<String>,
        /// A submitter's user name; repeat for each user.
        #[arg(long = "submitter")]
        submitters: Vec<String>,
    },
    /// Remove from every object store (the shared one and each worker's, a departed worker's
    /// too) the files of the workflows whose events retention purged from the log, and the
    /// chunks of uploads that stopped halfway (ORPHANS). Workers prune their own stores by
    /// themselves (WORKER_ARTIFACTS_PRUNE_SEC); this is the admin's way for the rest. A store
    /// that cannot be pruned is named with why, and the others are still pruned. Exit 0 when
    /// nothing failed.
    PruneArtifacts {
        /// Chunks that no stored file names are removed once their newest is this old (seconds):
        /// an upload in progress stores chunks continually.
        #[arg(long, value_name = "SECS", default_value_t = flowmesh_nats::artifacts::ORPHANS_OLDER_THAN.as_secs())]
        orphans_older_than: u64,
        #[arg(long)]
        json: bool,
    },
}

/// One store's line of `prune-artifacts`.
#[derive(serde::Serialize)]
struct PrunedStore {
    bucket: String,
    removed: u64,
    orphans: u64,
    failed: u64,
    kept: u64,
    /// Why the store could not be listed or opened (nothing of it was removed).
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

impl table::Row for PrunedStore {
    const HEADERS: &'static [&'static str] = &["BUCKET", "REMOVED", "ORPHANS", "FAILED", "KEPT", "NOTE"];
    fn cells(&self) -> Vec<String> {
        vec![
            self.bucket.clone(),
            self.removed.to_string(),
            self.orphans.to_string(),
            self.failed.to_string(),
            self.kept.to_string(),
            self.error.clone().unwrap_or_default(),
        ]
    }
}

pub async fn run(nats: &NatsArgs, command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Status { wait, json } => {
            let (_, handles) = nats.handles("flowmesh-cli").await?;
            let deadline = std::time::Instant::now() + Duration::from_secs(wait);
            loop {
                let health = views::stream_health(&handles.js).await?;
                let healthy = health.iter().all(|h| h.healthy);
                if healthy || std::time::Instant::now() >= deadline {
                    if json {
                        println!("{}", serde_json::to_string_pretty(&health)?);
                    } else {
                        print!("{}", table::rows(&health));
                    }
                    return Ok(super::exit(healthy));
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        Command::ServerConfig { workers, submitters } => {
            let config = flowmesh_nats::auth::server_config(&workers, &submitters).map_err(|e| anyhow::anyhow!(e))?;
            print!("{config}");
            Ok(ExitCode::SUCCESS)
        }
        Command::PruneArtifacts { orphans_older_than, json } => {
            let (_, handles) = nats.handles("flowmesh-cli").await?;
            // With no workflow purged yet there are still orphaned chunks to look for.
            let purged = flowmesh_nats::artifacts::purged_workflows(&handles.js).await?.map(|(_, purged)| purged);
            let purged = purged.unwrap_or_default();
            let age = Duration::from_secs(orphans_older_than);
            let mut rows = Vec::new();
            for bucket in flowmesh_nats::artifacts::stores(&handles.js).await? {
                let (pruned, error) = match flowmesh_nats::artifacts::prune(&handles.js, &bucket, &purged, age).await {
                    Ok(pruned) => (pruned, None),
                    Err(e) => (Default::default(), Some(e.to_string())),
                };
                let flowmesh_nats::artifacts::Pruned { removed, orphans, failed, kept } = pruned;
                rows.push(PrunedStore { bucket, removed, orphans, failed, kept, error });
            }
            if json {
                super::print_sorted_json(&rows)?;
            } else {
                print!("{}", table::rows(&rows));
            }
            Ok(super::exit(rows.iter().all(|r| r.failed == 0 && r.error.is_none())))
        }
        Command::Apply => {
            let (_, handles, topology) = nats.handles_with_topology("flowmesh-cli").await?;
            // Every worker's own store takes as many consumers as the shared one.
            let limit = topology.store_consumer_limit();
            for bucket in flowmesh_nats::artifacts::stores(&handles.js).await? {
                let stream = subjects::object_stream(&bucket);
                flowmesh_nats::topology::ensure_consumer_limit(&handles.js, &stream, limit).await?;
            }
            println!(
                "streams {}, {}, {}, buckets {}, {} and object store {} are in place ({} replica(s))",
                subjects::SUBMISSIONS_STREAM,
                subjects::EVENTS_STREAM,
                subjects::WORK_STREAM,
                subjects::WORKERS_BUCKET,
                subjects::CONTROL_BUCKET,
                subjects::ARTIFACTS_BUCKET,
                topology.replicas
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}
