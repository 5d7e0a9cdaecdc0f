//! The worker's configuration: every setting a flag and an environment variable, checked once.

use flowmesh_domain::fleet::{Hardware, SshLimits};
use flowmesh_domain::{ids, units};
use std::path::PathBuf;
use std::time::Duration;

/// Flags and environment variables (SPEC §6).
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// This worker's id: a KV key and a subject token (letters, digits, '-', '_'). Defaults to the hostname.
    #[arg(long, env = "WORKER_ID")]
    pub worker_id: Option<String>,
    /// Comma-separated tags shown in the snapshot.
    #[arg(long, env = "WORKER_TAGS", default_value = "")]
    pub worker_tags: String,
    #[arg(long, env = "HEARTBEAT_INTERVAL_SEC", default_value = "30", allow_hyphen_values = true)]
    pub heartbeat_interval_sec: String,
    /// Default: max(4 × interval, 120).
    #[arg(long, env = "WORKER_TTL_SEC", allow_hyphen_values = true)]
    pub worker_ttl_sec: Option<String>,
    #[arg(long, env = "RESULTS_DIR", default_value = "./flowmesh-results")]
    pub results_dir: PathBuf,
    #[arg(long, env = "WORKER_COST_PER_HOUR", default_value = "1.0", allow_hyphen_values = true)]
    pub worker_cost_per_hour: String,
    /// Tasks run at once. Default: 2.
    #[arg(long, env = "WORKER_BATCH_SLOTS", default_value = "2", allow_hyphen_values = true)]
    pub worker_batch_slots: String,
    /// Long-lived services (`serve`) run at once.
    #[arg(long, env = "WORKER_SERVICE_SLOTS", default_value = "1", allow_hyphen_values = true)]
    pub worker_service_slots: String,
    /// Cap on CPUs of an ssh container (> 0).
    #[arg(long, env = "SSH_MAX_CPU", allow_hyphen_values = true)]
    pub ssh_max_cpu: Option<String>,
    /// Cap on memory of an ssh container (e.g. 8Gi).
    #[arg(long, env = "SSH_MAX_MEMORY", allow_hyphen_values = true)]
    pub ssh_max_memory: Option<String>,
    /// Cap on processes in an ssh container (> 0).
    #[arg(long, env = "SSH_MAX_PIDS", allow_hyphen_values = true)]
    pub ssh_max_pids: Option<String>,
    /// The host name users connect to for interactive ssh sessions. Default: the hostname.
    #[arg(long, env = "SSH_PUBLIC_HOST")]
    pub ssh_public_host: Option<String>,
    /// The address an interactive session's port is published on.
    #[arg(long, env = "SSH_BIND_ADDRESS", default_value = "0.0.0.0")]
    pub ssh_bind_address: String,
    /// Give ssh containers only the GPUs they asked for.
    #[arg(long, env = "ENABLE_SSH_GPU_LIMIT", default_value = "false")]
    pub enable_ssh_gpu_limit: String,
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
    #[arg(long, env = "WORKER_ACK_WAIT_SEC", default_value = "60", allow_hyphen_values = true)]
    pub worker_ack_wait_sec: String,
    /// A Hugging Face hub cache whose models the snapshot advertises as warm (placement prefers
    /// a worker that has a task's model). Default: HF_HUB_CACHE, HF_HOME/hub or ~/.cache/huggingface/hub.
    #[arg(long, env = "WORKER_MODEL_CACHE")]
    pub worker_model_cache: Option<PathBuf>,
    /// Seconds in-flight tasks get to finish on SIGTERM before they are handed back.
    #[arg(long, env = "WORKER_DRAIN_GRACE_SEC", default_value = "30", allow_hyphen_values = true)]
    pub worker_drain_grace_sec: String,
    /// The object store for this worker's results, logs and artifacts. Default: its own,
    /// `flowmesh_artifacts_<WORKER_ID>` (created at start; only this worker may write it). Workers
    /// that share one NATS user (no identity of their own) set the shared `flowmesh_artifacts`.
    #[arg(long, env = "WORKER_ARTIFACTS_BUCKET")]
    pub worker_artifacts_bucket: Option<String>,
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
        }
    }
}

/// A setting that cannot be used; the message names the variable.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{variable}: {message}")]
pub struct ConfigError {
    pub variable: &'static str,
    pub message: String,
}

fn bad(variable: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError { variable, message: message.into() }
}

fn positive_int(variable: &'static str, text: &str) -> Result<u64, ConfigError> {
    match text.trim().parse::<i64>() {
        Ok(n) if n > 0 => Ok(n as u64),
        _ => Err(bad(variable, format!("expected a whole number greater than 0, found {text:?}"))),
    }
}

impl WorkerArgs {
    /// Checks every setting; the first bad one stops the worker with a message naming it.
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
        let interval = positive_int("HEARTBEAT_INTERVAL_SEC", &self.heartbeat_interval_sec)?;
        let ttl = match &self.worker_ttl_sec {
            Some(text) => positive_int("WORKER_TTL_SEC", text)?,
            None => (4 * interval).max(120),
        };
        if self.ssh_bind_address.parse::<std::net::IpAddr>().is_err() {
            return Err(bad("SSH_BIND_ADDRESS", format!("expected an IP address, found {:?}", self.ssh_bind_address)));
        }
        if ttl <= interval {
            return Err(bad("WORKER_TTL_SEC", format!("must exceed HEARTBEAT_INTERVAL_SEC ({interval}), found {ttl}")));
        }
        let cost_per_hour = match self.worker_cost_per_hour.trim().parse::<f64>() {
            Ok(c) if c.is_finite() && c >= 0.0 => c,
            _ => {
                return Err(bad(
                    "WORKER_COST_PER_HOUR",
                    format!("expected a number >= 0, found {:?}", self.worker_cost_per_hour),
                ));
            }
        };
        let batch_slots = positive_int("WORKER_BATCH_SLOTS", &self.worker_batch_slots)? as u32;
        let service_slots = match self.worker_service_slots.trim().parse::<u32>() {
            Ok(n) => n,
            Err(_) => {
                return Err(bad(
                    "WORKER_SERVICE_SLOTS",
                    format!("expected a whole number >= 0, found {:?}", self.worker_service_slots),
                ));
            }
        };
        let max_cpu = match &self.ssh_max_cpu {
            None => None,
            Some(text) => match text.trim().parse::<f64>() {
                Ok(c) if c.is_finite() && c > 0.0 => Some(c),
                _ => {
                    return Err(bad(
                        "SSH_MAX_CPU",
                        format!("expected a number of CPUs greater than 0, found {text:?}"),
                    ));
                }
            },
        };
        let max_memory_bytes = match &self.ssh_max_memory {
            None => None,
            Some(text) => match units::parse_memory(text) {
                Ok(0) => {
                    return Err(bad("SSH_MAX_MEMORY", "expected a memory size greater than 0, found \"0\""));
                }
                Ok(bytes) => Some(bytes),
                Err(message) => return Err(bad("SSH_MAX_MEMORY", message)),
            },
        };
        let max_pids = match &self.ssh_max_pids {
            None => None,
            Some(text) => Some(positive_int("SSH_MAX_PIDS", text)? as i64),
        };
        let ssh_gpu_limit = match self.enable_ssh_gpu_limit.trim().to_lowercase().as_str() {
            "true" | "1" | "yes" => true,
            "false" | "0" | "no" | "" => false,
            other => {
                return Err(bad("ENABLE_SSH_GPU_LIMIT", format!("expected true or false, found {other:?}")));
            }
        };
        let simulate_hw = match &self.flowmesh_simulate_hw {
            None => None,
            Some(text) if text.trim().is_empty() => None,
            Some(text) => Some(serde_json::from_str::<Hardware>(text).map_err(|e| {
                bad("FLOWMESH_SIMULATE_HW", format!("expected JSON shaped like the snapshot's hardware: {e}"))
            })?),
        };
        let drain_grace = positive_int("WORKER_DRAIN_GRACE_SEC", &self.worker_drain_grace_sec)?;
        let ack_wait = positive_int("WORKER_ACK_WAIT_SEC", &self.worker_ack_wait_sec)?;
        Ok(Config {
            tags: self.worker_tags.split(',').map(str::trim).filter(|t| !t.is_empty()).map(str::to_owned).collect(),
            heartbeat_interval: Duration::from_secs(interval),
            ttl: Duration::from_secs(ttl),
            results_dir: self.results_dir.clone(),
            cost_per_hour,
            batch_slots,
            service_slots,
            ssh_limits: SshLimits { max_cpu, max_memory_bytes, max_pids },
            ssh_gpu_limit,
            ssh_public_host: self.ssh_public_host.clone().filter(|h| !h.trim().is_empty()),
            ssh_bind_address: self.ssh_bind_address.clone(),
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
            drain_grace: Duration::from_secs(drain_grace),
            ack_wait: Duration::from_secs(ack_wait),
            model_cache: self
                .worker_model_cache
                .clone()
                .filter(|p| !p.as_os_str().is_empty())
                .or_else(crate::warm::default_dir),
            artifacts_bucket: match self.worker_artifacts_bucket.as_deref().map(str::trim) {
                None | Some("") => flowmesh_nats::subjects::artifacts_bucket(&worker_id),
                Some(bucket) if ids::is_valid_worker_id(bucket) => bucket.to_owned(),
                Some(bucket) => {
                    return Err(bad(
                        "WORKER_ARTIFACTS_BUCKET",
                        format!("{bucket:?} is not a bucket name (letters, digits, '-' and '_')"),
                    ));
                }
            },
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

    fn config(flags: &[&str]) -> Result<Config, ConfigError> {
        let mut argv = vec!["worker"];
        argv.extend_from_slice(flags);
        Cli::try_parse_from(argv).expect("flags parse").args.config("host-1")
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
        ];
        for (flags, variable) in cases {
            let err = config(flags).expect_err("must be refused");
            assert_eq!(err.variable, *variable, "{flags:?}: {err}");
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
    }
}
