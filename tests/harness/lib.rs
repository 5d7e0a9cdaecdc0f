//! The integration harness: a real nats-server per test, services run in-process through their
//! `run` functions, and waiting for events with a deadline (never sleeping as synchronisation).

use flowmesh::nats_server::NatsServer;
use flowmesh_domain::event::FailureReason;
use flowmesh_domain::fleet::Hardware;
use flowmesh_domain::{Event, EventBody};
use flowmesh_nats::connect::{NatsOptions, connect};
use flowmesh_nats::{Handles, Topology, Trigger, shutdown, subjects};
use futures_util::StreamExt;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// (role, environment variable, password) for the secured server of `start_secured`.
pub const ROLE_PASSWORDS: [(&str, &str, &str); 5] = [
    ("submitter", "FLOWMESH_SUBMITTER_PASSWORD", "submit-secret"),
    ("worker", "FLOWMESH_WORKER_PASSWORD", "worker-secret"),
    ("validator", "FLOWMESH_VALIDATOR_PASSWORD", "validator-secret"),
    ("router", "FLOWMESH_ROUTER_PASSWORD", "router-secret"),
    ("admin", "FLOWMESH_ADMIN_PASSWORD", "admin-secret"),
];

/// The body of `GET path` on a loopback port, over a plain TCP connection (HTTP/1.0: the server
/// closes when done): a service's metrics, the nats-server monitoring port.
pub async fn http_get(port: u16, path: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    Ok(response.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or(response))
}

/// The test password of a role.
pub fn role_password(role: &str) -> &'static str {
    ROLE_PASSWORDS.iter().find(|(r, _, _)| *r == role).map(|(_, _, pw)| *pw).expect("a known role")
}

/// Events that did not match `schemas/event.schema.json`, from any world in this process.
static SCHEMA_VIOLATIONS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// How long any wait may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// One test's world: its server, its folder, the services it started.
pub struct World {
    pub server: NatsServer,
    pub dir: tempfile::TempDir,
    pub client: async_nats::Client,
    pub handles: Handles,
    services: BTreeMap<String, (Trigger, tokio::task::JoinHandle<anyhow::Result<()>>)>,
    processes: BTreeMap<String, tokio::process::Child>,
    log: Arc<Mutex<Vec<Event>>>,
    /// Messages of the log the reader skipped as unreadable (`flowmesh::log::Skipped`).
    skipped: Arc<Mutex<Vec<flowmesh::log::Skipped>>>,
    log_task: tokio::task::JoinHandle<()>,
}

async fn open(url: &str, name: &str) -> anyhow::Result<(async_nats::Client, Handles)> {
    let client = connect(&NatsOptions { url: url.to_owned(), name: name.to_owned(), ..Default::default() }).await?;
    let handles = Handles::ensure(&client, &Topology::load(1)?).await?;
    Ok((client, handles))
}

/// A worker for tests: fast heartbeats, a 4 s TTL (room for a loaded machine), simulated
/// hardware when given.
pub fn worker_config(world: &World, id: &str, hardware: Option<Hardware>) -> flowmesh_worker::Config {
    let mut config =
        flowmesh_worker::Config::local(id, world.dir.path().join("results").join(id), Duration::from_millis(500));
    config.ttl = Duration::from_secs(4);
    config.simulate_hw = hardware;
    config
}

pub fn router_config(instance: &str) -> flowmesh_router::Config {
    flowmesh_router::Config {
        schedule: flowmesh_domain::schedule::Config { no_worker_grace_ms: 3_000, ..Default::default() },
        lease_ttl: Duration::from_secs(3),
        instance: instance.to_owned(),
        tick: Duration::from_millis(200),
        checkpoint_dir: None,
        checkpoint_every: Duration::from_secs(10),
        keep_ended: None,
    }
}

impl World {
    /// A fresh nats-server with the topology applied and a recorder of every event.
    pub async fn start() -> anyhow::Result<World> {
        World::start_as(None).await
    }

    /// A nats-server running `streams/nats-server.conf` with the role passwords in
    /// [`ROLE_PASSWORDS`]; the world itself connects as `admin`.
    pub async fn start_secured() -> anyhow::Result<World> {
        World::start_secured_with(flowmesh_nats::auth::SERVER_CONFIG, &[]).await
    }

    /// As `start_secured`, with the server configuration `config` (text) and `env` added to the
    /// server's environment (the passwords of the users it adds).
    pub async fn start_secured_with(config: &str, env: &[(&str, &str)]) -> anyhow::Result<World> {
        World::start_as(Some((config.to_owned(), env))).await
    }

    async fn start_as(secured: Option<(String, &[(&str, &str)])>) -> anyhow::Result<World> {
        // The workspace's binaries are built (or found fresh) before anything is timed: built
        // on a test's first CLI call, stale binaries took that test's whole deadline.
        tokio::task::spawn_blocking(flowmesh_bin).await?;
        let dir = tempfile::Builder::new().prefix("flowmesh-test-").tempdir()?;
        let server = match &secured {
            None => NatsServer::start(None, &dir.path().join("nats"), None).await?,
            Some((config, extra)) => {
                let path = dir.path().join("nats-server.conf");
                std::fs::write(&path, config)?;
                let mut env: Vec<(&str, &str)> = ROLE_PASSWORDS.iter().map(|(_, var, pw)| (*var, *pw)).collect();
                env.extend_from_slice(extra);
                NatsServer::start_with(None, &dir.path().join("nats"), None, Some(&path), &env).await?
            }
        };
        let options = NatsOptions {
            url: server.url(),
            name: "test".to_owned(),
            user: secured.as_ref().map(|_| "admin".to_owned()),
            password: secured.as_ref().map(|_| role_password("admin").to_owned()),
            ..Default::default()
        };
        let client = connect(&options).await?;
        let handles = Handles::ensure(&client, &Topology::load(1)?).await?;
        let log = Arc::new(Mutex::new(Vec::new()));
        let skipped = Arc::new(Mutex::new(Vec::new()));
        let log_task = tokio::spawn(record(handles.js.clone(), log.clone(), skipped.clone()));
        Ok(World {
            server,
            dir,
            client,
            handles,
            services: BTreeMap::new(),
            processes: BTreeMap::new(),
            log,
            skipped,
            log_task,
        })
    }

    pub fn url(&self) -> String {
        self.server.url()
    }

    fn spawn(
        &mut self,
        name: &str,
        f: impl FnOnce(flowmesh_nats::Shutdown) -> tokio::task::JoinHandle<anyhow::Result<()>>,
    ) {
        let (trigger, stop) = shutdown::channel();
        let handle = f(stop);
        self.services.insert(name.to_owned(), (trigger, handle));
    }

    pub async fn validator(&mut self, name: &str, config: flowmesh_validator::Config) -> anyhow::Result<()> {
        let (_, handles) = open(&self.url(), name).await?;
        self.spawn(name, |stop| tokio::spawn(flowmesh_validator::run(config, handles, stop)));
        Ok(())
    }

    pub async fn router(&mut self, name: &str) -> anyhow::Result<()> {
        self.router_with(router_config(name)).await
    }

    /// A router with its own configuration, named after its instance.
    pub async fn router_with(&mut self, config: flowmesh_router::Config) -> anyhow::Result<()> {
        let name = config.instance.clone();
        let (client, handles) = open(&self.url(), &name).await?;
        self.spawn(&name, |stop| tokio::spawn(flowmesh_router::run(config, client, handles, stop)));
        Ok(())
    }

    pub async fn worker(&mut self, config: flowmesh_worker::Config) -> anyhow::Result<()> {
        let name = config.worker_id.clone();
        let (client, handles) = open(&self.url(), &name).await?;
        self.spawn(&name, |stop| tokio::spawn(flowmesh_worker::run(config, client, handles, stop)));
        Ok(())
    }

    /// A validator and a router, in-process: everything but workers.
    pub async fn control_plane(&mut self) -> anyhow::Result<()> {
        self.validator("validator", flowmesh_validator::Config::default()).await?;
        self.router("router").await
    }

    /// Validator, router and one echo-capable worker `w1`.
    pub async fn stack(&mut self) -> anyhow::Result<()> {
        self.control_plane().await?;
        let w = worker_config(self, "w1", None);
        self.worker(w).await
    }

    /// Stops a service gracefully and waits for it.
    pub async fn stop(&mut self, name: &str) -> anyhow::Result<()> {
        let (trigger, handle) = self.services.remove(name).ok_or_else(|| anyhow::anyhow!("no service {name}"))?;
        trigger.fire();
        tokio::time::timeout(DEADLINE, handle).await???;
        Ok(())
    }

    /// Kills a service at once, as a crash would: its task is aborted mid-flight.
    pub fn kill(&mut self, name: &str) {
        if let Some((_, handle)) = self.services.remove(name) {
            handle.abort();
        }
    }

    /// Runs `flowmesh <args>` as a separate process (so it can be killed with SIGKILL), with
    /// `NATS_URL` set and its log in `<dir>/<name>.log`.
    pub fn process(&mut self, name: &str, args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<()> {
        self.process_of(&flowmesh_bin(), name, args, env)
    }

    /// As [`World::process`], for any binary (the standalone `flowmesh-router`, …).
    pub fn process_of(
        &mut self,
        bin: &std::path::Path,
        name: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<()> {
        let log = std::fs::File::create(self.dir.path().join(format!("{name}.log")))?;
        let child = tokio::process::Command::new(bin)
            .args(args)
            .env("NATS_URL", self.url())
            .env("RUST_LOG", "info,async_nats=warn")
            // A worker asks for ML runners by default; a scenario that wants them says so.
            .env("FLOWMESH_RUNNERS", "off")
            .envs(env.iter().copied())
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()?;
        self.processes.insert(name.to_owned(), child);
        Ok(())
    }

    /// `flowmesh worker` as a process named after its id, with a results folder of its own in
    /// this world and a 1 s heartbeat; `extra` adds or overrides settings.
    pub fn worker_process(&mut self, id: &str, extra: &[(&str, &str)]) -> anyhow::Result<()> {
        let results = self.dir.path().join("results").join(id).display().to_string();
        let mut env = vec![("WORKER_ID", id), ("RESULTS_DIR", results.as_str()), ("HEARTBEAT_INTERVAL_SEC", "1")];
        env.extend_from_slice(extra);
        self.process(id, &["worker"], &env)
    }

    /// SIGKILL: no cleanup, no last words.
    pub async fn kill9(&mut self, name: &str) -> anyhow::Result<()> {
        let mut child = self.processes.remove(name).ok_or_else(|| anyhow::anyhow!("no process {name}"))?;
        child.kill().await?;
        Ok(())
    }

    /// Waits for a process to exit by itself; returns its exit status.
    pub async fn wait_exit(&mut self, name: &str) -> anyhow::Result<std::process::ExitStatus> {
        let mut child = self.processes.remove(name).ok_or_else(|| anyhow::anyhow!("no process {name}"))?;
        Ok(tokio::time::timeout(DEADLINE, child.wait()).await??)
    }

    /// Sends SIGTERM (a polite stop) to a process.
    pub fn terminate(&self, name: &str) -> anyhow::Result<()> {
        let pid = self.processes.get(name).and_then(|c| c.id()).ok_or_else(|| anyhow::anyhow!("no process {name}"))?;
        let status = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status()?;
        anyhow::ensure!(status.success(), "kill -TERM {pid} failed");
        Ok(())
    }

    /// The log a process wrote so far.
    pub fn process_log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{name}.log"))).unwrap_or_default()
    }

    /// Runs `flowmesh <args>` to its end against this world (from the repository root, so the
    /// examples' relative paths work) and returns what it printed.
    pub async fn cli(&self, args: &[&str]) -> anyhow::Result<std::process::Output> {
        self.cli_with(args, &[]).await
    }

    /// [`World::cli`] with more environment: a user's credentials on a secured world.
    pub async fn cli_with(&self, args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<std::process::Output> {
        // The first call runs `cargo build` (seconds on a busy machine): off the runtime's
        // thread, so the in-process services keep their heartbeats meanwhile.
        let bin = tokio::task::spawn_blocking(flowmesh_bin).await?;
        Ok(tokio::process::Command::new(bin)
            .args(args)
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
            .env("NATS_URL", self.url())
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied())
            .output()
            .await?)
    }

    /// Everything recorded so far.
    pub fn events(&self) -> Vec<Event> {
        self.log.lock().expect("log lock").clone()
    }

    /// The messages of the log skipped as unreadable so far.
    pub fn skipped(&self) -> Vec<flowmesh::log::Skipped> {
        self.skipped.lock().expect("skipped lock").clone()
    }

    /// A service's status (`flowmesh.<scope>.status`) once `done` holds for it, or the last one
    /// after `DEADLINE` (for the caller's assertions to show). Services refresh it on a timer.
    pub async fn status_when(
        &self,
        scope: &str,
        done: impl Fn(&serde_json::Value) -> bool,
    ) -> anyhow::Result<serde_json::Value> {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let reply = match self.client.request(subjects::status(scope), "".into()).await {
                Ok(reply) => reply,
                // A service just started may not serve its status yet.
                Err(e)
                    if e.kind() == async_nats::RequestErrorKind::NoResponders
                        && tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let status: serde_json::Value = serde_json::from_slice(&reply.payload)?;
            if done(&status) || tokio::time::Instant::now() > deadline {
                return Ok(status);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until `done` holds for the recorded events, or fails after `DEADLINE`.
    pub async fn wait_for(&self, what: &str, done: impl Fn(&[Event]) -> bool) -> anyhow::Result<Vec<Event>> {
        self.wait_for_within(what, DEADLINE, done).await
    }

    /// Waits until `count` of the recorded events reaches `target`, failing only when the count
    /// has not grown for `stall`: a scenario whose size sets its length (and a loaded machine
    /// its pace) still fails fast when it is stuck.
    pub async fn wait_for_count(
        &self,
        what: &str,
        target: usize,
        stall: Duration,
        count: impl Fn(&[Event]) -> usize,
    ) -> anyhow::Result<Vec<Event>> {
        let mut best = 0;
        loop {
            let reached = self
                .wait_for_within(what, stall, |events| {
                    let n = count(events);
                    n >= target || n > best
                })
                .await?;
            best = count(&reached);
            if best >= target {
                return Ok(reached);
            }
        }
    }

    /// As `wait_for`, failing after `within` (a scenario whose size sets its length).
    pub async fn wait_for_within(
        &self,
        what: &str,
        within: Duration,
        done: impl Fn(&[Event]) -> bool,
    ) -> anyhow::Result<Vec<Event>> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let violations = SCHEMA_VIOLATIONS.lock().expect("violations lock").clone();
            anyhow::ensure!(
                violations.is_empty(),
                "events that do not match the event schema:\n  {}",
                violations.join("\n  ")
            );
            let events = self.events();
            if done(&events) {
                return Ok(events);
            }
            if tokio::time::Instant::now() > deadline {
                let kinds: Vec<String> = events.iter().map(|e| format!("{} {}", e.body.kind(), e.id)).collect();
                anyhow::bail!("timed out waiting for {what}; events so far:\n  {}", kinds.join("\n  "));
            }
            // Polling the in-memory recorder, which the event stream feeds; not a sleep standing in for an event.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until a task of the workflow has reported `task.started`.
    pub async fn wait_started(&self, workflow_id: &str) -> anyhow::Result<Vec<Event>> {
        self.wait_for(&format!("a task of {workflow_id} to start"), |events| {
            events.iter().any(|e| matches!(&e.body, EventBody::TaskStarted(s) if s.task.workflow_id == workflow_id))
        })
        .await
    }

    /// Waits for the workflow to end and returns its events.
    pub async fn wait_workflow_end(&self, workflow_id: &str) -> anyhow::Result<Vec<Event>> {
        let events = self
            .wait_for(&format!("{workflow_id} to end"), |events| {
                events.iter().any(|e| workflow_ended(e, workflow_id) || rejected(e, workflow_id))
            })
            .await?;
        Ok(events.into_iter().filter(|e| e.body.scope().0 == workflow_id).collect())
    }

    /// Publishes a document exactly as `nats pub flowmesh.submit` does (core NATS, no JetStream API).
    pub async fn nats_pub(&self, body: &[u8]) -> anyhow::Result<()> {
        self.client.publish(subjects::SUBMIT, body.to_vec().into()).await?;
        self.client.flush().await?;
        Ok(())
    }

    /// Submits through JetStream (as `flowmesh submit`), returning the workflow id.
    pub async fn submit(&self, body: &[u8], msg_id: Option<&str>) -> anyhow::Result<String> {
        Ok(flowmesh::submit::submit(&self.handles.js, body.to_vec(), msg_id).await?.0)
    }

    pub async fn shutdown(mut self) {
        let names: Vec<String> = self.services.keys().cloned().collect();
        for name in names {
            let _ = self.stop(&name).await;
        }
        for (_, mut child) in std::mem::take(&mut self.processes) {
            let _ = child.kill().await;
        }
        self.log_task.abort();
        self.server.stop().await;
    }
}

async fn record(
    js: async_nats::jetstream::Context,
    log: Arc<Mutex<Vec<Event>>>,
    skipped_log: Arc<Mutex<Vec<flowmesh::log::Skipped>>>,
) {
    let Ok(stream) = flowmesh::log::entries(&js, subjects::all_events(), true).await else {
        return;
    };
    futures_util::pin_mut!(stream);
    while let Some(read) = stream.next().await {
        match read {
            Ok(flowmesh::log::Read::Skipped(skipped)) => skipped_log.lock().expect("skipped lock").push(skipped),
            Ok(flowmesh::log::Read::Event(event)) => {
                // Every event any scenario produces must match schemas/event.schema.json: the
                // Rust types and the published schema cannot drift apart unnoticed.
                let value = serde_json::to_value(&event).expect("events serialize");
                let problems = flowmesh_domain::schema::check_event(&value);
                if !problems.is_empty() {
                    SCHEMA_VIOLATIONS.lock().expect("violations lock").push(format!("{}: {problems:?}", event.id));
                }
                log.lock().expect("log lock").push(*event)
            }
            Err(e) => panic!("the event log holds something that is not an event: {e}"),
        }
    }
}

pub fn workflow_ended(e: &Event, workflow_id: &str) -> bool {
    e.body.ended_workflow() == Some(workflow_id)
}

/// Whether some task failed for `reason`.
pub fn failed_for(events: &[Event], reason: FailureReason) -> bool {
    events.iter().any(|e| matches!(&e.body, EventBody::TaskFailed(f) if f.reason == reason))
}

pub fn rejected(e: &Event, workflow_id: &str) -> bool {
    matches!(&e.body, EventBody::SubmissionRejected(r) if r.workflow_id == workflow_id)
}

/// The kinds of the events, in order.
pub fn kinds(events: &[Event]) -> Vec<&'static str> {
    events.iter().map(|e| e.body.kind()).collect()
}

/// A command's output for an assertion message.
pub fn output_text(out: &std::process::Output) -> String {
    format!("stdout:\n{}\nstderr:\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// Stops a `flowmesh dev` process as Ctrl-C does and waits for it: it stops its nats-server on
/// the way out. (The SIGKILL of `kill_on_drop` would leave that server running, orphaned.)
pub async fn interrupt(child: &mut tokio::process::Child) -> anyhow::Result<std::process::ExitStatus> {
    let pid = child.id().ok_or_else(|| anyhow::anyhow!("the process already ended"))?;
    std::process::Command::new("kill").args(["-INT", &pid.to_string()]).status()?;
    Ok(tokio::time::timeout(DEADLINE, child.wait()).await??)
}

/// The `flowmesh` binary cargo built next to this test binary (`target/<profile>/flowmesh`).
pub fn flowmesh_bin() -> PathBuf {
    binary("flowmesh")
}

/// A binary of the workspace, next to this test binary (`target/<profile>/<name>`).
///
/// `cargo test` builds only the binaries of packages that have integration tests of their own, so
/// the first call builds every binary of the workspace with the same cargo, profile and target
/// folder (a no-op when they are fresh): the suite never depends on an earlier manual build, and
/// never runs a stale service binary.
pub fn binary(name: &str) -> PathBuf {
    static BUILT: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe.parent().and_then(|deps| deps.parent()).expect("target dir");
    if let Err(e) = BUILT.get_or_init(|| build_workspace_binaries(dir)) {
        panic!("building the workspace's binaries for the tests failed: {e}");
    }
    let bin = dir.join(name);
    assert!(bin.exists(), "{} is missing after building the workspace's binaries", bin.display());
    bin
}

/// `cargo build --workspace --bins` into `profile_dir` (`<target>/<profile>`).
fn build_workspace_binaries(profile_dir: &std::path::Path) -> Result<(), String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into());
    let target = profile_dir.parent().ok_or("the profile folder has no parent")?;
    let profile = profile_dir.file_name().and_then(|n| n.to_str()).ok_or("unnamed profile folder")?;
    let profile = if profile == "debug" { "dev" } else { profile };
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
    let out = std::process::Command::new(cargo)
        .args(["build", "--quiet", "--workspace", "--bins", "--locked", "--profile", profile])
        .arg("--manifest-path")
        .arg(manifest)
        .arg("--target-dir")
        .arg(target)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cargo could not start: {e}"))?;
    if out.status.success() { Ok(()) } else { Err(output_text(&out)) }
}

/// An example document from `examples/`.
pub fn example(path: &str) -> Vec<u8> {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples").join(path);
    std::fs::read(&file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()))
}
