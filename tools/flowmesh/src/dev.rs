//! `flowmesh dev`: nats-server plus validator, router and workers in one process.

use crate::nats_server::NatsServer;
use flowmesh_domain::fleet::Hardware;
use flowmesh_nats::connect::{NatsOptions, connect};
use flowmesh_nats::{Handles, Topology, Trigger, shutdown};
use std::path::PathBuf;
use std::time::Duration;

/// The demo the README runs: one echo task.
pub const DEMO: &str = include_str!("../../../examples/valid/echo.yaml");

#[derive(Debug, Clone)]
pub struct StackOptions {
    /// Where the server and the workers keep data; a temporary folder when `None`.
    pub data: Option<PathBuf>,
    pub workers: usize,
    /// Batch slots of every worker; the worker's default when `None`.
    pub batch_slots: Option<u32>,
    /// The most work orders every worker queues beyond its batch slots (`WORKER_PREFETCH`); the
    /// worker's default when `None`.
    pub prefetch: Option<u32>,
    /// Simulated hardware for every worker (`--worker-hw`).
    pub worker_hw: Option<Hardware>,
    pub nats_server: Option<PathBuf>,
    pub port: Option<u16>,
    pub heartbeat: Duration,
    pub no_worker_grace: Duration,
    /// How long ended workflows' events stay in the log (`ROUTER_KEEP_ENDED_SEC`).
    pub keep_ended: Option<Duration>,
}

impl Default for StackOptions {
    fn default() -> Self {
        StackOptions {
            data: None,
            workers: 1,
            batch_slots: None,
            prefetch: None,
            worker_hw: None,
            nats_server: None,
            port: None,
            heartbeat: Duration::from_secs(2),
            no_worker_grace: Duration::from_secs(60),
            keep_ended: flowmesh_router::keep_ended(flowmesh_router::DEFAULT_KEEP_ENDED_SEC),
        }
    }
}

/// A running local stack.
pub struct Stack {
    pub server: NatsServer,
    pub data_dir: PathBuf,
    workers: usize,
    trigger: Trigger,
    services: Services,
    _temp: Option<tempfile::TempDir>,
}

async fn handles(url: &str, name: &str) -> anyhow::Result<(async_nats::Client, Handles)> {
    let client = connect(&NatsOptions { url: url.to_owned(), name: name.to_owned(), ..Default::default() }).await?;
    let handles = Handles::ensure(&client, &Topology::load(1)?).await?;
    Ok((client, handles))
}

/// The configuration of the `n`-th dev worker (1-based).
pub fn worker_config(options: &StackOptions, data_dir: &std::path::Path, n: usize) -> flowmesh_worker::Config {
    let mut config =
        flowmesh_worker::Config::local(&format!("dev-worker-{n}"), data_dir.join("results"), options.heartbeat);
    config.tags = vec!["dev".to_owned()];
    config.simulate_hw = options.worker_hw.clone();
    if let Some(slots) = options.batch_slots {
        config.batch_slots = slots;
    }
    if let Some(prefetch) = options.prefetch {
        config.prefetch = prefetch;
    }
    config
}

type Services = tokio::task::JoinSet<(String, anyhow::Result<()>)>;

/// The services `flowmesh dev` runs each on a thread of its own unless `FLOWMESH_DEV_OWN_THREADS`
/// names others (a comma-separated list; empty: all on the stack's one runtime thread).
/// ARCHITECTURE, "Decisions": "A one-machine stack gives its router a thread of its own".
const OWN_THREADS: &str = "router";

fn on_own_thread(service: &str) -> bool {
    let listed = std::env::var("FLOWMESH_DEV_OWN_THREADS").unwrap_or_else(|_| OWN_THREADS.to_owned());
    listed.split(',').any(|name| name.trim() == service)
}

/// Starts `service` (which connects on its own) as `name`: on a thread of its own, or as a task
/// of the stack's runtime.
fn start<F>(services: &mut Services, name: &str, service: F) -> anyhow::Result<()>
where
    F: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let name = name.to_owned();
    if on_own_thread(&name) {
        let done = flowmesh_nats::cli::serve_on_a_thread_of_its_own(&format!("flowmesh-{name}"), service)?;
        services.spawn(async move {
            let ended = done.await.unwrap_or_else(|_| Err(anyhow::anyhow!("its thread ended without a result")));
            (name, ended)
        });
    } else {
        services.spawn(async move { (name, service.await) });
    }
    Ok(())
}

/// How long a new stack's router may take to lead and to see every worker live.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// Waits until the router's status says that it leads and sees `workers` live workers: a
/// workflow submitted then is placed at once, not told that no worker can run it yet (the
/// router, on a thread of its own, can read a submission before the first snapshot). The status
/// is refreshed on the router's tick. A restarted stack may still be reading its log then; what
/// it places waits until it has.
async fn router_sees_its_fleet(url: &str, workers: usize) -> anyhow::Result<()> {
    let client = async_nats::connect(url).await?;
    let deadline = tokio::time::Instant::now() + READY_WITHIN;
    let ready =
        |s: &serde_json::Value| s["leader"] == true && s["live_workers"].as_u64().is_some_and(|n| n >= workers as u64);
    let mut last = serde_json::Value::Null;
    while tokio::time::Instant::now() < deadline {
        // No responders yet: the router has not registered its status endpoint.
        if let Ok(reply) = client.request(flowmesh_nats::subjects::status("router"), "".into()).await {
            last = serde_json::from_slice(&reply.payload).unwrap_or_default();
            if ready(&last) {
                return Ok(());
            }
        }
        // Polling a status that changes on the router's tick; a CLI's wait, not a test's.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    anyhow::bail!(
        "the router did not lead and see {workers} live worker(s) within {}s; its last status: {last}",
        READY_WITHIN.as_secs()
    )
}

impl Stack {
    /// Starts the server and the services, and returns once the stack is `ready` (or stopped
    /// again, with the reason it did not get there).
    pub async fn start(options: StackOptions) -> anyhow::Result<Stack> {
        let mut stack = Stack::launch(options).await?;
        if let Err(e) = stack.ready().await {
            stack.stop().await;
            return Err(e);
        }
        Ok(stack)
    }

    /// Starts the server and the services without waiting for them to be `ready`.
    pub async fn launch(options: StackOptions) -> anyhow::Result<Stack> {
        let (temp, data_dir) = match &options.data {
            Some(dir) => (None, dir.clone()),
            None => {
                let temp = tempfile::Builder::new().prefix("flowmesh-dev-").tempdir()?;
                let path = temp.path().to_path_buf();
                (Some(temp), path)
            }
        };
        std::fs::create_dir_all(&data_dir)?;
        let server = NatsServer::start(options.nats_server.as_deref(), &data_dir.join("nats"), options.port).await?;
        let url = server.url();
        let (trigger, _) = shutdown::channel();
        let mut services = tokio::task::JoinSet::new();

        let stop = trigger.subscribe();
        let validator_url = url.clone();
        start(&mut services, "validator", async move {
            let (_, h) = handles(&validator_url, "flowmesh-validator").await?;
            flowmesh_validator::run(flowmesh_validator::Config::default(), h, stop).await
        })?;

        let stop = trigger.subscribe();
        let router = flowmesh_router::Config {
            schedule: flowmesh_domain::schedule::Config {
                no_worker_grace_ms: options.no_worker_grace.as_millis() as u64,
                ..Default::default()
            },
            lease_ttl: Duration::from_secs(6),
            instance: "dev-router".to_owned(),
            tick: Duration::from_millis(500),
            // With --data, a restarted dev stack resumes the router's fold from here.
            checkpoint_dir: Some(data_dir.join("router-checkpoint")),
            checkpoint_every: Duration::from_secs(10),
            keep_ended: options.keep_ended,
        };
        let router_url = url.clone();
        start(&mut services, "router", async move {
            let (client, h) = handles(&router_url, "flowmesh-router").await?;
            flowmesh_router::run(router, client, h, stop).await
        })?;

        for n in 1..=options.workers {
            let config = worker_config(&options, &data_dir, n);
            let name = config.worker_id.clone();
            let (client, h) = handles(&url, &name).await?;
            let stop = trigger.subscribe();
            services.spawn(async move { (name, flowmesh_worker::run(config, client, h, stop).await) });
        }
        Ok(Stack { server, data_dir, workers: options.workers, trigger, services, _temp: temp })
    }

    /// Waits until the router leads and sees every worker live, or fails with why not (a
    /// service stopped, or the router did not get there in time).
    pub async fn ready(&mut self) -> anyhow::Result<()> {
        let url = self.url();
        tokio::select! {
            ready = router_sees_its_fleet(&url, self.workers) => ready,
            (name, result) = self.failed() => Err(anyhow::anyhow!("{name} stopped while the stack started: {result:?}")),
        }
    }

    pub fn url(&self) -> String {
        self.server.url()
    }

    /// Waits until a service stops on its own (an error) — the stack is then incomplete.
    pub async fn failed(&mut self) -> (String, anyhow::Result<()>) {
        match self.services.join_next().await {
            Some(Ok(done)) => done,
            Some(Err(e)) => ("a service".to_owned(), Err(anyhow::anyhow!("panicked: {e}"))),
            None => std::future::pending().await,
        }
    }

    /// Stops every service, then the server.
    pub async fn stop(mut self) {
        self.trigger.fire();
        let _ =
            tokio::time::timeout(Duration::from_secs(15), async { while self.services.join_next().await.is_some() {} })
                .await;
        self.services.abort_all();
        self.server.stop().await;
    }
}
