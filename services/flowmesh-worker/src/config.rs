//! The worker's configuration: every setting a flag and an environment variable, checked once.

use flowmesh_domain::fleet::{Hardware, SshLimits};
use flowmesh_domain::ids;
use std::path::PathBuf;
use std::time::Duration;

/// The most work orders a worker queues beyond its batch slots unless told otherwise
/// (`WORKER_PREFETCH`). It offers fewer while its runs are long (`queue::QueueDepth`: as many
/// as its slots are expected to start within 100 ms, none for runs of a second), so the whole
/// queue serves only quick tasks, where each hop then carries more orders at once; a queued
/// order that could run sooner elsewhere is asked back (ARCHITECTURE, "A worker may queue
/// orders beyond its slots", "A queue as deep as a short wait"). 64 and not 16: an echo
/// burst ran 6-11% faster, with 7-11% less CPU per task in the services and the server
/// together (BENCHMARKS, "Thirty-eighth round"); a queue deeper than 100 ms of runs is never
/// offered either way.
pub const DEFAULT_PREFETCH: u32 = 64;

/// Flags and environment variables (SPEC §6).
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// This worker's id: a KV key and a subject token (letters, digits, '-', '_'). Defaults to the hostname.
    #[arg(long, env = "WORKER_ID")]
    pub worker_id: Option<String>,
    /// Comma-separated tags shown in the snapshot.
    #[arg(long, env = "WORKER_TAGS", default_value = "")]
    pub worker_tags: String,
    #[arg(long, env = "HEARTBEAT_INTERVAL_SEC", default_value = "30", allow_hyphen_values = true, value_parser = parse::positive)]
    pub heartbeat_interval_sec: u64,
    /// Default: max(4 × interval, 120).
    #[arg(long, env = "WORKER_TTL_SEC", allow_hyphen_values = true, value_parser = parse::positive)]
    pub worker_ttl_sec: Option<u64>,
    #[arg(long, env = "RESULTS_DIR", default_value = "./flowmesh-results")]
    pub results_dir: PathBuf,
    #[arg(long, env = "WORKER_COST_PER_HOUR", default_value = "1.0", allow_hyphen_values = true, value_parser = parse::cost)]
    pub worker_cost_per_hour: f64,
    /// Tasks run at once. Default: 2.
    #[arg(long, env = "WORKER_BATCH_SLOTS", default_value = "2", allow_hyphen_values = true, value_parser = parse::positive_u32)]
    pub worker_batch_slots: u32,
    /// The most work orders held beyond the batch slots, each queued until a slot frees: a
    /// worker of short tasks then has its next orders at hand when one ends. It offers as many
    /// as its slots are expected to start within 100 ms (2 before its first run), none while its
    /// runs are long; the router asks for one back when it could run sooner elsewhere. Default: 16.
    #[arg(long, env = "WORKER_PREFETCH", default_value_t = DEFAULT_PREFETCH, allow_hyphen_values = true, value_parser = parse::count)]
    pub worker_prefetch: u32,
    /// Long-lived services (`serve`) run at once.
    #[arg(long, env = "WORKER_SERVICE_SLOTS", default_value = "1", allow_hyphen_values = true, value_parser = parse::count)]
    pub worker_service_slots: u32,
    /// Cap on CPUs of an ssh container (> 0).
    #[arg(long, env = "SSH_MAX_CPU", allow_hyphen_values = true, value_parser = parse::cpus)]
    pub ssh_max_cpu: Option<f64>,
    /// Cap on memory of an ssh container (e.g. 8Gi).
    #[arg(long, env = "SSH_MAX_MEMORY", allow_hyphen_values = true, value_parser = parse::memory)]
    pub ssh_max_memory: Option<u64>,
    /// Cap on processes in an ssh container (> 0).
    #[arg(long, env = "SSH_MAX_PIDS", allow_hyphen_values = true, value_parser = parse::positive)]
    pub ssh_max_pids: Option<u64>,
    /// The host name users connect to for interactive ssh sessions. Default: the hostname.
    #[arg(long, env = "SSH_PUBLIC_HOST")]
    pub ssh_public_host: Option<String>,
    /// The address an interactive session's port is published on.
    #[arg(long, env = "SSH_BIND_ADDRESS", default_value = "0.0.0.0", value_parser = parse::ip)]
    pub ssh_bind_address: std::net::IpAddr,
    /// Give ssh containers only the GPUs they asked for.
    #[arg(long, env = "ENABLE_SSH_GPU_LIMIT", default_value = "false", action = clap::ArgAction::Set, value_parser = parse::switch)]
    pub enable_ssh_gpu_limit: bool,
    /// TOML file declaring plugin executors.
    #[arg(long, env = "FLOWMESH_EXECUTORS")]
    pub flowmesh_executors: Option<PathBuf>,
    /// The ML runners (`./tools/install-deps.sh --ml`): `auto` asks `python3`, a path asks that
    /// interpreter, `off` builds none. The worker asks in the background which runners initialise
    /// here and advertises their task types once they have.
    #[arg(long, env = "FLOWMESH_RUNNERS", default_value = "auto")]
    pub flowmesh_runners: String,
    /// A folder for remembered runner probes, keyed by interpreter, package versions and GPUs
    /// (`off`: probe at every start). Default: $XDG_CACHE_HOME/flowmesh or ~/.cache/flowmesh.
    #[arg(long, env = "FLOWMESH_RUNNERS_CACHE")]
    pub flowmesh_runners_cache: Option<PathBuf>,
    /// JSON shaped like the snapshot's `hardware`; replaces detection and marks the worker simulated.
    #[arg(long, env = "FLOWMESH_SIMULATE_HW")]
    pub flowmesh_simulate_hw: Option<String>,
    /// Seconds before an unacknowledged work order is redelivered (progress acks extend it while a task runs).
    #[arg(long, env = "WORKER_ACK_WAIT_SEC", default_value = "60", allow_hyphen_values = true, value_parser = parse::positive)]
    pub worker_ack_wait_sec: u64,
    /// A Hugging Face hub cache whose models the snapshot advertises as warm (placement prefers
    /// a worker that has a task's model). Default: HF_HUB_CACHE, HF_HOME/hub or ~/.cache/huggingface/hub.
    #[arg(long, env = "WORKER_MODEL_CACHE")]
    pub worker_model_cache: Option<PathBuf>,
    /// Seconds in-flight tasks get to finish on SIGTERM before they are handed back.
    #[arg(long, env = "WORKER_DRAIN_GRACE_SEC", default_value = "30", allow_hyphen_values = true, value_parser = parse::positive)]
    pub worker_drain_grace_sec: u64,
    /// The object store for this worker's results, logs and artifacts. Default: its own,
    /// `flowmesh_artifacts_<WORKER_ID>` (created at start; only this worker may write it). Workers
    /// that share one NATS user (no identity of their own) set the shared `flowmesh_artifacts`.
    #[arg(long, env = "WORKER_ARTIFACTS_BUCKET")]
    pub worker_artifacts_bucket: Option<String>,
    /// Seconds between two prunings of its own object store: the files of workflows whose
    /// events retention removed from the log (`ROUTER_KEEP_ENDED_SEC`) are removed with them.
    /// 0: never. The shared store is pruned by the admin (`flowmesh streams prune-artifacts`).
    #[arg(long, env = "WORKER_ARTIFACTS_PRUNE_SEC", default_value = "600", allow_hyphen_values = true, value_parser = parse::count)]
    pub worker_artifacts_prune_sec: u32,
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub worker_id: String,
    pub tags: Vec<String>,
    pub heartbeat_interval: Duration,
    pub ttl: Duration,
    pub results_dir: PathBuf,
    pub cost_per_hour: f64,
    pub batch_slots: u32,
    pub service_slots: u32,
    /// The most batch work orders taken beyond `batch_slots`, waiting for a slot
    /// (`WORKER_PREFETCH`); the snapshot offers fewer while runs are long (`queue::QueueDepth`).
    pub prefetch: u32,
    pub ssh_limits: SshLimits,
    pub ssh_gpu_limit: bool,
    pub ssh_public_host: Option<String>,
    pub ssh_bind_address: String,
    pub executors_file: Option<PathBuf>,
    /// The interpreter to ask for ML runners (`FLOWMESH_RUNNERS`); `None` builds none.
    pub runners_python: Option<String>,
    /// Where probe answers are remembered (`executor::runner::probe`); `None` probes at every start.
    pub runners_cache: Option<PathBuf>,
    pub simulate_hw: Option<Hardware>,
    pub drain_grace: Duration,
    pub ack_wait: Duration,
    /// Where warm models are found (`warm::scan`); `None` advertises none.
    pub model_cache: Option<PathBuf>,
    /// The object store its tasks' files go to (`subjects::artifacts_bucket` by default).
    pub artifacts_bucket: String,
    /// How often its own store loses the files of purged workflows (`WORKER_ARTIFACTS_PRUNE_SEC`);
    /// `None`: never.
    pub artifacts_prune: Option<Duration>,
    /// How old the newest chunk of an upload no record names must be before that pruning
    /// removes it, and how often at most it looks for such chunks with no new purge record
    /// (`artifacts::ORPHANS_OLDER_THAN`; tests shorten it).
    pub artifacts_orphans_older_than: Duration,
}

impl Config {
    /// A worker on this machine for a local stack or a test: fast heartbeats (`heartbeat`, TTL
    /// four of them), two batch slots, ssh sessions published on loopback, no caps, no plugins.
    pub fn local(worker_id: &str, results_dir: PathBuf, heartbeat: Duration) -> Config {
        Config {
            worker_id: worker_id.to_owned(),
            tags: Vec::new(),
            heartbeat_interval: heartbeat,
            ttl: heartbeat * 4,
            results_dir,
            cost_per_hour: 1.0,
            batch_slots: 2,
            service_slots: 1,
            prefetch: DEFAULT_PREFETCH,
            ssh_limits: SshLimits::default(),
            ssh_gpu_limit: false,
            ssh_public_host: Some("127.0.0.1".to_owned()),
            ssh_bind_address: "127.0.0.1".to_owned(),
            executors_file: None,
            runners_python: None,
            runners_cache: None,
            simulate_hw: None,
            drain_grace: Duration::from_secs(5),
            ack_wait: Duration::from_secs(30),
            model_cache: None,
            artifacts_bucket: flowmesh_nats::subjects::artifacts_bucket(worker_id),
            artifacts_prune: Some(Duration::from_secs(600)),
            artifacts_orphans_older_than: flowmesh_nats::artifacts::ORPHANS_OLDER_THAN,
        }
    }
}

/// A setting that cannot be used; the message names the variable. (Settings with a type of their
/// own are refused by `parse` while the flags are read; clap's message names the variable too.)
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{variable}: {message}")]
pub struct ConfigError {
    pub variable: &'static str,
    pub message: String,
}

fn bad(variable: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError { variable, message: message.into() }
}

/// The typed settings' parsers: each says what it expected and what it found.
mod parse {
    use flowmesh_domain::units;

    pub fn positive(text: &str) -> Result<u64, String> {
        match text.trim().parse::<u64>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("expected a whole number greater than 0, found {text:?}")),
        }
    }

    pub fn positive_u32(text: &str) -> Result<u32, String> {
        positive(text).and_then(|n| u32::try_from(n).map_err(|_| format!("expected at most {}, found {n}", u32::MAX)))
    }

    pub fn count(text: &str) -> Result<u32, String> {
        text.trim().parse().map_err(|_| format!("expected a whole number >= 0, found {text:?}"))
    }

    pub fn cost(text: &str) -> Result<f64, String> {
        match text.trim().parse::<f64>() {
            Ok(c) if c.is_finite() && c >= 0.0 => Ok(c),
            _ => Err(format!("expected a number >= 0, found {text:?}")),
        }
    }

    pub fn cpus(text: &str) -> Result<f64, String> {
        match text.trim().parse::<f64>() {
            Ok(c) if c.is_finite() && c > 0.0 => Ok(c),
            _ => Err(format!("expected a number of CPUs greater than 0, found {text:?}")),
        }
    }

    pub fn memory(text: &str) -> Result<u64, String> {
        match units::parse_memory(text)? {
            0 => Err("expected a memory size greater than 0, found \"0\"".to_owned()),
            bytes => Ok(bytes),
        }
    }

    pub fn ip(text: &str) -> Result<std::net::IpAddr, String> {
        text.trim().parse().map_err(|_| format!("expected an IP address, found {text:?}"))
    }

    pub fn switch(text: &str) -> Result<bool, String> {
        match text.trim().to_lowercase().as_str() {
            "true" | "1" | "yes" => Ok(true),
            "false" | "0" | "no" | "" => Ok(false),
            other => Err(format!("expected true or false, found {other:?}")),
        }
    }
}

/// An optional setting given as an empty string reads as absent.
fn given(text: &Option<String>) -> Option<&str> {
    text.as_deref().map(str::trim).filter(|t| !t.is_empty())
}

impl WorkerArgs {
    /// Checks what the flags' types cannot: the worker id, settings that depend on each other,
    /// JSON; the first bad one stops the worker with a message naming it.
    pub fn config(&self, hostname: &str) -> Result<Config, ConfigError> {
        let worker_id = self
            .worker_id
            .clone()
            .unwrap_or_else(|| hostname.replace(|c: char| !c.is_ascii_alphanumeric() && c != '-' && c != '_', "-"));
        if !ids::is_valid_worker_id(&worker_id) {
            return Err(bad(
                "WORKER_ID",
                format!("expected letters, digits, '-' or '_' (at most 128), found {worker_id:?}"),
            ));
        }
        let interval = self.heartbeat_interval_sec;
        let ttl = self.worker_ttl_sec.unwrap_or((4 * interval).max(120));
        if ttl <= interval {
            return Err(bad("WORKER_TTL_SEC", format!("must exceed HEARTBEAT_INTERVAL_SEC ({interval}), found {ttl}")));
        }
        let simulate_hw = match given(&self.flowmesh_simulate_hw) {
            None => None,
            Some(text) => Some(serde_json::from_str::<Hardware>(text).map_err(|e| {
                bad("FLOWMESH_SIMULATE_HW", format!("expected JSON shaped like the snapshot's hardware: {e}"))
            })?),
        };
        let artifacts_bucket = match given(&self.worker_artifacts_bucket) {
            None => flowmesh_nats::subjects::artifacts_bucket(&worker_id),
            Some(bucket) if ids::is_valid_worker_id(bucket) => bucket.to_owned(),
            Some(bucket) => {
                return Err(bad(
                    "WORKER_ARTIFACTS_BUCKET",
                    format!("{bucket:?} is not a bucket name (letters, digits, '-' and '_')"),
                ));
            }
        };
        Ok(Config {
            tags: self.worker_tags.split(',').map(str::trim).filter(|t| !t.is_empty()).map(str::to_owned).collect(),
            heartbeat_interval: Duration::from_secs(interval),
            ttl: Duration::from_secs(ttl),
            results_dir: self.results_dir.clone(),
            cost_per_hour: self.worker_cost_per_hour,
            batch_slots: self.worker_batch_slots,
            service_slots: self.worker_service_slots,
            prefetch: self.worker_prefetch,
            ssh_limits: SshLimits {
                max_cpu: self.ssh_max_cpu,
                max_memory_bytes: self.ssh_max_memory,
                max_pids: self.ssh_max_pids.map(|n| n as i64),
            },
            ssh_gpu_limit: self.enable_ssh_gpu_limit,
            ssh_public_host: given(&self.ssh_public_host).map(str::to_owned),
            ssh_bind_address: self.ssh_bind_address.to_string(),
            executors_file: self.flowmesh_executors.clone(),
            runners_python: match self.flowmesh_runners.trim() {
                "" | "off" | "none" | "false" | "0" => None,
                "auto" => Some("python3".to_owned()),
                python => Some(python.to_owned()),
            },
            runners_cache: match &self.flowmesh_runners_cache {
                Some(dir) if dir.as_os_str() == "off" => None,
                Some(dir) if !dir.as_os_str().is_empty() => Some(dir.clone()),
                _ => std::env::var_os("XDG_CACHE_HOME")
                    .filter(|d| !d.is_empty())
                    .map(PathBuf::from)
                    .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
                    .map(|d| d.join("flowmesh")),
            },
            simulate_hw,
            drain_grace: Duration::from_secs(self.worker_drain_grace_sec),
            ack_wait: Duration::from_secs(self.worker_ack_wait_sec),
            model_cache: self
                .worker_model_cache
                .clone()
                .filter(|p| !p.as_os_str().is_empty())
                .or_else(crate::warm::default_dir),
            artifacts_bucket,
            artifacts_prune: (self.worker_artifacts_prune_sec > 0)
                .then(|| Duration::from_secs(self.worker_artifacts_prune_sec.into())),
            artifacts_orphans_older_than: flowmesh_nats::artifacts::ORPHANS_OLDER_THAN,
            worker_id,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: WorkerArgs,
    }

    fn config(flags: &[&str]) -> Result<Config, String> {
        let mut argv = vec!["worker"];
        argv.extend_from_slice(flags);
        let args = Cli::try_parse_from(argv).map_err(|e| e.to_string())?.args;
        args.config("host-1").map_err(|e| e.to_string())
    }

    #[test]
    fn bad_settings_name_their_variable() {
        let cases: &[(&[&str], &str)] = &[
            (&["--ssh-max-cpu", "0"], "SSH_MAX_CPU"),
            (&["--ssh-max-cpu", "-2"], "SSH_MAX_CPU"),
            (&["--ssh-max-memory", "lots"], "SSH_MAX_MEMORY"),
            (&["--ssh-max-pids", "0"], "SSH_MAX_PIDS"),
            (&["--heartbeat-interval-sec", "-1"], "HEARTBEAT_INTERVAL_SEC"),
            (&["--worker-ttl-sec", "5", "--heartbeat-interval-sec", "10"], "WORKER_TTL_SEC"),
            (&["--worker-id", "a.b"], "WORKER_ID"),
            (&["--worker-batch-slots", "0"], "WORKER_BATCH_SLOTS"),
            (&["--flowmesh-simulate-hw", "{\"cpu_cores\": 4}"], "FLOWMESH_SIMULATE_HW"),
            (&["--enable-ssh-gpu-limit", "maybe"], "ENABLE_SSH_GPU_LIMIT"),
            (&["--worker-cost-per-hour", "-1"], "WORKER_COST_PER_HOUR"),
            (&["--worker-service-slots", "x"], "WORKER_SERVICE_SLOTS"),
            (&["--ssh-bind-address", "everywhere"], "SSH_BIND_ADDRESS"),
            (&["--worker-artifacts-bucket", "a.b"], "WORKER_ARTIFACTS_BUCKET"),
            (&["--worker-artifacts-prune-sec", "-1"], "WORKER_ARTIFACTS_PRUNE_SEC"),
        ];
        for (flags, variable) in cases {
            let err = config(flags).expect_err("must be refused");
            assert!(err.contains(variable), "{flags:?}: {err}");
        }
    }

    #[test]
    fn defaults() {
        let c = config(&[]).unwrap();
        assert_eq!(c.worker_id, "host-1");
        assert_eq!(c.heartbeat_interval, Duration::from_secs(30));
        assert_eq!(c.ttl, Duration::from_secs(120));
        assert_eq!(config(&["--heartbeat-interval-sec", "60"]).unwrap().ttl, Duration::from_secs(240));
        assert_eq!(c.ssh_limits, SshLimits::default());
        let sim = config(&[
            "--flowmesh-simulate-hw",
            r#"{"cpu_cores":4,"memory_bytes":1024,"gpus":[{"index":0,"name":"NVIDIA H100","memory_bytes":80}]}"#,
        ])
        .unwrap();
        assert_eq!(sim.simulate_hw.unwrap().gpus.len(), 1);
        let runners = |value: &str| config(&["--flowmesh-runners", value]).unwrap().runners_python;
        assert_eq!(runners("auto"), Some("python3".to_owned()));
        assert_eq!(runners("/opt/ml/bin/python"), Some("/opt/ml/bin/python".to_owned()));
        assert_eq!(runners("off"), None);
        assert_eq!(config(&["--flowmesh-runners-cache", "off"]).unwrap().runners_cache, None);
        // Empty strings (an exported but unset variable) read as absent or false.
        let empty =
            config(&["--flowmesh-simulate-hw", "", "--enable-ssh-gpu-limit", "", "--ssh-public-host", ""]).unwrap();
        assert_eq!((empty.simulate_hw, empty.ssh_gpu_limit, empty.ssh_public_host), (None, false, None));
        let typed =
            config(&["--ssh-max-memory", "8Gi", "--ssh-max-cpu", "1.5", "--worker-service-slots", "0"]).unwrap();
        assert_eq!(typed.ssh_limits.max_memory_bytes, Some(8 << 30));
        assert_eq!((typed.ssh_limits.max_cpu, typed.service_slots), (Some(1.5), 0));
        assert_eq!(c.artifacts_prune, Some(Duration::from_secs(600)));
        assert_eq!(config(&["--worker-artifacts-prune-sec", "0"]).unwrap().artifacts_prune, None);
    }
}
