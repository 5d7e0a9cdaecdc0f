//! What every binary shares: NATS connection flags, tracing set-up, Ctrl-C/SIGTERM handling.

use crate::connect::{NatsOptions, connect};
use crate::retry::Backoff;
use crate::shutdown::{self, Shutdown, Trigger};
use crate::topology::{Handles, Topology};
use std::path::PathBuf;

/// Connection flags; each also reads its environment variable. Every binary and every
/// subcommand lists them under one heading, apart from its own flags.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Connection")]
pub struct NatsArgs {
    /// NATS server URL(s), comma-separated.
    #[arg(long, env = "NATS_URL", default_value = "nats://127.0.0.1:4222", global = true)]
    pub nats_url: String,
    /// Credentials file (JWT + nkey seed).
    #[arg(long, env = "NATS_CREDS", global = true)]
    pub nats_creds: Option<PathBuf>,
    #[arg(long, env = "NATS_USER", global = true)]
    pub nats_user: Option<String>,
    #[arg(long, env = "NATS_PASSWORD", global = true, hide_env_values = true)]
    pub nats_password: Option<String>,
    /// CA bundle to verify the server (turns TLS on).
    #[arg(long, env = "NATS_TLS_CA", global = true)]
    pub nats_tls_ca: Option<PathBuf>,
    #[arg(long, env = "NATS_TLS_CERT", global = true)]
    pub nats_tls_cert: Option<PathBuf>,
    #[arg(long, env = "NATS_TLS_KEY", global = true)]
    pub nats_tls_key: Option<PathBuf>,
    /// Prefix of this client's reply subjects (default `_INBOX_<NATS_USER>` with a user, which is
    /// what the shipped roles allow; `_INBOX` without).
    #[arg(long, env = "NATS_INBOX_PREFIX", global = true)]
    pub nats_inbox_prefix: Option<String>,
    /// Serve Prometheus metrics on this address (e.g. 127.0.0.1:9464, path /metrics); off when unset.
    #[arg(long, env = "METRICS_ADDR", global = true)]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Replicas for streams and buckets this process creates. Unset: 1 on a single server; on a
    /// cluster, as many as the servers it advertises, at most 3.
    #[arg(long, env = "FLOWMESH_REPLICAS", value_parser = clap::value_parser!(u8).range(1..=5), global = true)]
    pub replicas: Option<u8>,
}

/// The replicas a process asks for when none is set: 1 on a single server (`cluster` is `None`);
/// on a cluster, one per server it advertises to clients (`servers`), at most 3. A cluster that
/// advertises none (`no_advertise`) gets 1, as before there was a default: set
/// `FLOWMESH_REPLICAS` there.
pub fn default_replicas(cluster: Option<&str>, servers: usize) -> usize {
    match cluster {
        None => 1,
        Some(_) => servers.clamp(1, 3),
    }
}

impl NatsArgs {
    pub fn options(&self, name: &str) -> NatsOptions {
        NatsOptions {
            url: self.nats_url.clone(),
            creds: self.nats_creds.clone(),
            user: self.nats_user.clone(),
            password: self.nats_password.clone(),
            tls_ca: self.nats_tls_ca.clone(),
            tls_cert: self.nats_tls_cert.clone(),
            tls_key: self.nats_tls_key.clone(),
            name: name.to_owned(),
            inbox_prefix: self.nats_inbox_prefix.clone(),
        }
    }

    /// Connects and applies the topology from `streams/`.
    /// Waits up to `JETSTREAM_WAIT` for JetStream to answer (a cluster electing its leader, a
    /// server still starting); a conflicting definition fails at once.
    pub async fn handles(&self, name: &str) -> anyhow::Result<(async_nats::Client, Handles)> {
        let (client, handles, _) = self.handles_with_topology(name).await?;
        Ok((client, handles))
    }

    /// As [`NatsArgs::handles`], with the topology it applied (and so the replica count it asked
    /// for what it created).
    pub async fn handles_with_topology(&self, name: &str) -> anyhow::Result<(async_nats::Client, Handles, Topology)> {
        let client = connect(&self.options(name)).await?;
        let replicas = self.replicas(&client).await;
        let topology = Topology::load(replicas)?;
        let second = std::time::Duration::from_secs(1);
        let handles = Backoff::new(second, second, Shutdown::never())
            .within(JETSTREAM_WAIT)
            .retry(
                "waiting for JetStream",
                || Handles::ensure(&client, &topology),
                |e| matches!(e, crate::EdgeError::Transient { .. }),
            )
            .await
            .map_err(|gave_up| gave_up.last)?;
        Ok((client, handles, topology))
    }
}

impl NatsArgs {
    /// The replicas this process creates streams and buckets with: `FLOWMESH_REPLICAS`, or
    /// [`default_replicas`] for the server `client` is connected to. Without it, a command run
    /// against a cluster still forming (a CLI polling `worker list`) created single-replica
    /// streams before the services' three-replica ones could be placed, and the other nodes
    /// hosted nothing.
    async fn replicas(&self, client: &async_nats::Client) -> usize {
        if let Some(n) = self.replicas {
            return usize::from(n);
        }
        // `connect` returns before the connection is up (it keeps trying in the background), and
        // the server's INFO comes with the connection: a flush completes once it is up.
        let _ = tokio::time::timeout(JETSTREAM_WAIT, client.flush()).await;
        match client.try_server_info() {
            Some(info) => default_replicas(info.cluster.as_deref(), info.connect_urls.len()),
            None => {
                tracing::warn!("no answer from the server yet; creating with 1 replica (set FLOWMESH_REPLICAS)");
                1
            }
        }
    }

    /// Starts the Prometheus endpoint when `METRICS_ADDR` is set. Once per process: every service
    /// in it (all of them under `flowmesh dev`) reports to the same registry.
    pub fn install_metrics(&self) -> anyhow::Result<()> {
        if let Some(addr) = self.metrics_addr {
            metrics_exporter_prometheus::PrometheusBuilder::new()
                .with_http_listener(addr)
                .install()
                .map_err(|e| anyhow::anyhow!("METRICS_ADDR: cannot serve metrics on {addr}: {e}"))?;
            tracing::info!(%addr, "serving Prometheus metrics on /metrics");
        }
        Ok(())
    }
}

/// How long a process waits for JetStream at start-up before it gives up.
pub const JETSTREAM_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Runs a service (or a CLI command) until it returns: on a multi-threaded runtime, as a task of
/// that runtime rather than on the thread that blocks on it. The tasks a service spawns and the
/// messages it waits for then stay on the runtime's worker threads; run on the blocking thread,
/// every message and every spawned task was a hand-off to or from it (a wake-up and a context
/// switch each). Measured with the services as processes: 12-13% more workflows per second, 13%
/// less CPU per workflow in all processes (BENCHMARKS "Eighth round").
pub fn serve<F, T>(service: F) -> anyhow::Result<T>
where
    F: std::future::Future<Output = anyhow::Result<T>> + Send + 'static,
    T: Send + 'static,
{
    serve_on(runtime(), service)
}

/// `serve` for a process that runs its own nats-server beside it (`flowmesh dev`, `bench --dev`):
/// one runtime thread fewer than the machine has cores, so that the server has a core the
/// services' threads do not contend for (ARCHITECTURE, "Decisions": "A one-machine stack leaves
/// its server a core"). `TOKIO_WORKER_THREADS`, where set, decides as it does for every runtime.
pub fn serve_beside_its_server<F, T>(service: F) -> anyhow::Result<T>
where
    F: std::future::Future<Output = anyhow::Result<T>> + Send + 'static,
    T: Send + 'static,
{
    let mut runtime = runtime();
    if std::env::var_os("TOKIO_WORKER_THREADS").is_none() {
        runtime.worker_threads(threads_beside_a_server(std::thread::available_parallelism().map_or(1, usize::from)));
    }
    serve_on(runtime, service)
}

/// Runs `service` on a thread of its own, as a task of a runtime of one thread like `serve`'s,
/// and returns at once; its result arrives on the receiver (which reports an error if the
/// thread ended without one). What the service connects to and spawns stays on that thread: a
/// one-process stack gives a service the thread its own process would have.
pub fn serve_on_a_thread_of_its_own<F, T>(
    name: &str,
    service: F,
) -> std::io::Result<tokio::sync::oneshot::Receiver<anyhow::Result<T>>>
where
    F: std::future::Future<Output = anyhow::Result<T>> + Send + 'static,
    T: Send + 'static,
{
    let (done, result) = tokio::sync::oneshot::channel();
    std::thread::Builder::new().name(name.to_owned()).spawn(move || {
        let mut runtime = runtime();
        runtime.worker_threads(1);
        let _ = done.send(serve_on(runtime, service));
    })?;
    Ok(result)
}

/// Runs `service` as a task of the runtime `runtime` builds, blocking until it returns.
fn serve_on<F, T>(mut runtime: tokio::runtime::Builder, service: F) -> anyhow::Result<T>
where
    F: std::future::Future<Output = anyhow::Result<T>> + Send + 'static,
    T: Send + 'static,
{
    runtime.build()?.block_on(async { tokio::spawn(service).await? })
}

/// Runtime threads for a process sharing `cores` with its nats-server: all but one, at least one.
fn threads_beside_a_server(cores: usize) -> usize {
    cores.saturating_sub(1).max(1)
}

/// `serve`'s runtime: tokio's multi-threaded one without its LIFO slot, so that a task woken or
/// spawned by another one waits behind the tasks already queued instead of running next. A NATS
/// connection's writer is such a task, woken by every message sent; run next, it wrote each
/// message in a system call of its own (ARCHITECTURE, "Decisions"). Turning the slot off is an
/// unstable tokio API, compiled in by `--cfg tokio_unstable` from `.cargo/config.toml`; a
/// `RUSTFLAGS` in the environment replaces that file's flags, and then the slot stays
/// (`a_woken_task_waits_behind_those_already_queued` fails).
fn runtime() -> tokio::runtime::Builder {
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    #[cfg(tokio_unstable)]
    runtime.disable_lifo_slot();
    runtime
}

/// Sets up `tracing`: `RUST_LOG` filters (default `info`), `FLOWMESH_LOG_JSON=1` for JSON lines.
pub fn init_tracing() {
    init_tracing_with("info,async_nats=warn");
}

/// As `init_tracing`, with another default filter (`flowmesh dev` keeps the terminal quiet).
pub fn init_tracing_with(default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| default_filter.into());
    let json = std::env::var("FLOWMESH_LOG_JSON").is_ok_and(|v| v == "1" || v == "true");
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// A shutdown that fires on Ctrl-C or SIGTERM.
pub fn shutdown_on_signals() -> (std::sync::Arc<Trigger>, Shutdown) {
    let (trigger, shutdown) = shutdown::channel();
    let trigger = std::sync::Arc::new(trigger);
    let t = trigger.clone();
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(s) => { s.recv().await; } None => std::future::pending().await } } => {}
        }
        tracing::info!("shutting down");
        t.fire();
    });
    (trigger, shutdown)
}

#[cfg(test)]
mod tests {
    use super::default_replicas;

    #[test]
    fn replicas_follow_the_servers_a_cluster_advertises() {
        for (cluster, servers, want) in [
            (None, 0, 1),
            (None, 3, 1),
            (Some("flowmesh"), 0, 1),
            (Some("flowmesh"), 1, 1),
            (Some("flowmesh"), 2, 2),
            (Some("flowmesh"), 3, 3),
            (Some("flowmesh"), 5, 3),
        ] {
            assert_eq!(default_replicas(cluster, servers), want, "{cluster:?} with {servers} server(s)");
        }
    }

    #[test]
    fn a_process_beside_its_server_leaves_it_a_core() {
        for (cores, want) in [(1, 1), (2, 1), (3, 2), (16, 15)] {
            assert_eq!(super::threads_beside_a_server(cores), want, "{cores} core(s)");
        }
    }

    #[test]
    fn a_woken_task_waits_behind_those_already_queued() {
        // One runtime thread, so nothing is stolen: the order the tasks run in is the queue's.
        let runtime = super::runtime().worker_threads(1).build().unwrap();
        let order = runtime.block_on(async {
            tokio::spawn(async {
                let (tx, rx) = std::sync::mpsc::channel();
                let first = tokio::spawn({
                    let tx = tx.clone();
                    async move { tx.send("first").unwrap() }
                });
                let second = tokio::spawn(async move { tx.send("second").unwrap() });
                first.await.unwrap();
                second.await.unwrap();
                rx.try_iter().collect::<Vec<_>>()
            })
            .await
            .unwrap()
        });
        assert_eq!(
            order,
            ["first", "second"],
            "the task spawned last ran first: the runtime kept tokio's LIFO slot (is the build without \
             .cargo/config.toml's --cfg tokio_unstable, a RUSTFLAGS in the environment replacing it?)"
        );
    }

    #[test]
    fn a_service_on_a_thread_of_its_own_runs_and_spawns_there_and_reports_how_it_ended() {
        let caller = std::thread::current().id();
        let done = super::serve_on_a_thread_of_its_own("flowmesh-test", async move {
            let own = std::thread::current().id();
            // What the service spawns runs on its runtime's one thread, not the caller's.
            let spawned = tokio::spawn(async { std::thread::current().id() }).await?;
            Ok((own, spawned))
        })
        .unwrap();
        let (own, spawned) = done.blocking_recv().expect("the thread sends its result").unwrap();
        assert_ne!(own, caller);
        assert_eq!(spawned, own);

        let failed =
            super::serve_on_a_thread_of_its_own::<_, ()>("flowmesh-test", async { anyhow::bail!("no server") })
                .unwrap();
        assert_eq!(failed.blocking_recv().unwrap().unwrap_err().to_string(), "no server");
    }
}
