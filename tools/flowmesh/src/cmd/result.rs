//! `flowmesh result fetch TASK [--out DIR]` and `flowmesh result download TASK --include all -o
//! bundle.tgz`: a task's stored files, digests verified, as files or as one gzip'd tarball (made
//! by the system's `tar`).

use flowmesh_nats::cli::NatsArgs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Subcommand)]
pub enum Command {
    /// Download a task's results and artifacts, verifying their digests.
    Fetch {
        task: String,
        #[arg(long, default_value = ".")]
        out: PathBuf,
    },
    /// A task's results, logs and artifacts as one .tgz bundle, digests verified.
    Download(DownloadArgs),
}

pub async fn run(nats: &NatsArgs, command: Command) -> anyhow::Result<ExitCode> {
    let (_, handles) = nats.handles("flowmesh-cli").await?;
    match command {
        Command::Download(args) => download(&handles.js, args).await,
        Command::Fetch { task, out } => {
            for f in flowmesh::views::fetch_results(&handles.js, &task, &out).await? {
                println!("{}  {} bytes  ({})", out.join(&f.name).display(), f.size, how(f.verified));
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// How a fetched file was checked.
fn how(verified: bool) -> &'static str {
    if verified { "digest verified" } else { "inline in its task.completed event" }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Include {
    /// Everything the task stored.
    All,
    /// `results.json` only.
    Results,
    /// `logs/` only.
    Logs,
    /// What the task produced: everything but `results.json` and `logs/`.
    Artifacts,
}

impl Include {
    /// Whether the stored file at `relative` (to the task) belongs in the bundle.
    fn takes(self, relative: &str) -> bool {
        let is_log = relative.starts_with("logs/");
        match self {
            Include::All => true,
            Include::Results => relative == "results.json",
            Include::Logs => is_log,
            Include::Artifacts => relative != "results.json" && !is_log,
        }
    }
}

#[derive(clap::Args)]
pub struct DownloadArgs {
    task: String,
    #[arg(long, value_enum, default_value = "all")]
    include: Include,
    /// The bundle to write (default: <task>.tgz).
    #[arg(short = 'o', long = "output")]
    output: Option<PathBuf>,
}

async fn download(js: &async_nats::jetstream::Context, args: DownloadArgs) -> anyhow::Result<ExitCode> {
    let staging = tempfile::Builder::new().prefix("flowmesh-download-").tempdir()?;
    let root = staging.path().join(&args.task);
    let fetched = flowmesh::views::fetch_results(js, &args.task, &root).await?;
    let mut kept = Vec::new();
    for f in fetched {
        if args.include.takes(&f.name) {
            kept.push(f);
        } else {
            std::fs::remove_file(root.join(&f.name))?;
        }
    }
    anyhow::ensure!(!kept.is_empty(), "{} stored nothing that --include {:?} takes", args.task, args.include);
    let output = args.output.clone().unwrap_or_else(|| PathBuf::from(format!("{}.tgz", args.task)));
    tar(staging.path(), &args.task, &output)?;
    for f in &kept {
        eprintln!("  {}/{}  {} bytes  ({})", args.task, f.name, f.size, how(f.verified));
    }
    println!("{}", output.display());
    Ok(ExitCode::SUCCESS)
}

/// `tar -czf OUTPUT -C DIR NAME`: the bundle unpacks into a folder named after the task.
fn tar(dir: &Path, name: &str, output: &Path) -> anyhow::Result<()> {
    let output = if output.is_absolute() { output.to_path_buf() } else { std::env::current_dir()?.join(output) };
    let status = std::process::Command::new("tar")
        .arg("-czf")
        .arg(&output)
        .arg("-C")
        .arg(dir)
        .arg(name)
        .status()
        .map_err(|e| anyhow::anyhow!("running tar: {e}"))?;
    anyhow::ensure!(status.success(), "tar could not write {}", output.display());
    Ok(())
}
