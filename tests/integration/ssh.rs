//! `ssh` tasks through the whole stack, against the real Docker engine of this machine.

use flowmesh_domain::EventBody;
use flowmesh_domain::event::FailureReason;
use flowmesh_domain::fleet::WorkerSnapshot;
use tests::{World, kinds};

const IMAGE: &str = "flowmesh-test-busybox:latest";
const SSHD_IMAGE: &str = "flowmesh-test-sshd:latest";

/// `true` when a Docker engine answers; builds both test images when either is missing. Once
/// per test binary: the first test to ask builds them while the others wait, since the script
/// builds the busybox image first and a test that saw only it went on without the sshd image.
fn docker_ready() -> bool {
    static READY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *READY.get_or_init(|| {
        let ok =
            |args: &[&str]| std::process::Command::new("docker").args(args).output().is_ok_and(|o| o.status.success());
        if !ok(&["info"]) {
            eprintln!("skipping: no Docker engine answers `docker info`");
            return false;
        }
        let present = || [IMAGE, SSHD_IMAGE].iter().all(|image| ok(&["image", "inspect", image]));
        if !present() {
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tools/docker-test-image.sh");
            let built = std::process::Command::new("bash").arg(script).status().is_ok_and(|s| s.success());
            assert!(built && present(), "Docker answers but {IMAGE} or {SSHD_IMAGE} could not be built with {script}");
        }
        true
    })
}

#[tokio::test]
async fn an_ssh_stage_reads_upstream_results_and_returns_its_output() -> anyhow::Result<()> {
    if !docker_ready() {
        return Ok(());
    }
    let mut world = World::start().await?;
    world.stack().await?;
    let doc = format!(
        r#"apiVersion: flowmesh/v1
kind: Workflow
metadata: {{name: into-container}}
spec:
  stages:
    - name: collect
      spec:
        taskType: echo
        data: {{type: list, items: [first record, second record]}}
    - name: transform
      spec:
        taskType: ssh
        image: {IMAGE}
        command: "cat /mnt/in/results.json > /mnt/out/copy.json && echo copied"
        resources: {{hardware: {{cpu: 1, memory: 256Mi}}}}
        inputs: [{{stage: collect, mountPath: /mnt/in}}]
        sshOutput: {{mountPath: /mnt/out, maxBytes: 65536}}
        output: {{artifacts: [results.json, copy.json]}}
"#
    );
    let wf = world.submit(doc.as_bytes(), None).await?;
    let events = world.wait_workflow_end(&wf).await?;
    assert_eq!(events.last().unwrap().body.kind(), "workflow.completed", "{:?}\n{events:#?}", kinds(&events));
    let done = events.iter().find_map(|e| match &e.body {
        EventBody::TaskCompleted(c) if c.task.stage == "transform" => Some(c.clone()),
        _ => None,
    });
    let done = done.expect("the ssh stage completed");
    assert_eq!(done.result.as_ref().unwrap()["exit_code"], 0);
    let copy = done.artifacts.iter().find(|a| a.name == "copy.json").expect("copy.json is an artifact");
    let out = world.dir.path().join("fetched");
    flowmesh::views::fetch_results(&world.handles.js, &done.task.task_id, &out).await?;
    let copied: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("copy.json"))?)?;
    assert_eq!(copied["items"][1]["output"], "second record", "the container read the upstream result");
    assert_eq!(copy.size, std::fs::metadata(out.join("copy.json"))?.len());
    world.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_worker_without_docker_does_not_advertise_ssh_and_gets_no_ssh_work() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.control_plane().await?;
    world.worker_process("nodocker", &[("DOCKER_HOST", "unix:///nonexistent/docker.sock")])?;
    world
        .wait_for("the worker to join", |events| {
            events.iter().any(|e| matches!(&e.body, EventBody::WorkerJoined(j) if j.worker_id == "nodocker"))
        })
        .await?;
    let snapshot: WorkerSnapshot =
        serde_json::from_slice(&world.handles.workers.get("nodocker").await?.expect("snapshot"))?;
    assert!(!snapshot.supported_task_types.contains(&"ssh".to_owned()), "{:?}", snapshot.supported_task_types);
    assert!(snapshot.supported_task_types.contains(&"echo".to_owned()));
    let wf = world.submit(format!("apiVersion: flowmesh/v1\nkind: SSH\nmetadata: {{name: s}}\nspec: {{taskType: ssh, image: {IMAGE}, command: 'true'}}\n").as_bytes(), None).await?;
    let events = world.wait_workflow_end(&wf).await?;
    assert!(!kinds(&events).contains(&"task.dispatched"));
    assert!(events.iter().any(
        |e| matches!(&e.body, EventBody::TaskFailed(f) if f.reason == FailureReason::NoEligibleWorker && f.message.contains("do"))
    ));
    assert!(world.process_log("nodocker").contains("ssh"), "the worker says why ssh is missing");
    world.shutdown().await;
    Ok(())
}

fn ssh_command(key: &std::path::Path, port: u64, command: &str) -> std::process::Output {
    std::process::Command::new("ssh")
        .args(["-i", key.to_str().unwrap(), "-p", &port.to_string()])
        .args(["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes"])
        .args(["-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR", "root@127.0.0.1", command])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("the ssh client runs")
}

/// Whether a session can be reached here: the Docker engine and an ssh client.
fn sessions_ready() -> bool {
    if !docker_ready() {
        return false;
    }
    if std::process::Command::new("ssh").arg("-V").output().is_err() {
        eprintln!("skipping: no ssh client");
        return false;
    }
    true
}

/// A key pair for the session's owner and one for a stranger, in `world`'s folder: (owner's
/// private key, stranger's private key, owner's public key).
fn owner_and_stranger(world: &World, owner: &str) -> (std::path::PathBuf, std::path::PathBuf, String) {
    let key = world.dir.path().join(owner);
    let stranger = world.dir.path().join("id_stranger");
    let public = keygen(&key);
    keygen(&stranger);
    (key, stranger, public)
}

fn keygen(path: &std::path::Path) -> String {
    let status = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f", path.to_str().unwrap()])
        .status();
    assert!(status.is_ok_and(|s| s.success()), "ssh-keygen failed");
    std::fs::read_to_string(path.with_extension("pub")).unwrap().trim().to_owned()
}

#[tokio::test]
#[ignore = "long suite: ./tools/test.sh --long"]
async fn an_interactive_session_says_where_to_connect_admits_its_key_and_ends_when_idle() -> anyhow::Result<()> {
    if !sessions_ready() {
        return Ok(());
    }
    let mut world = World::start().await?;
    world.stack().await?;
    let (key, stranger, public) = owner_and_stranger(&world, "id_session");
    let doc = format!(
        "apiVersion: flowmesh/v1\nkind: SSH\nmetadata: {{name: session}}\nspec:\n  taskType: ssh\n  image: {SSHD_IMAGE}\n  authorizedKeys: [\"{public}\"]\n  ttlSeconds: 120\n  idleTimeoutSeconds: 6\n"
    );
    let wf = world.submit(doc.as_bytes(), None).await?;
    let events = world
        .wait_for("the session to be ready", |events| {
            events.iter().any(|e| matches!(&e.body, EventBody::TaskUpdated(u) if u.task.workflow_id == wf))
        })
        .await?;
    let data = events
        .iter()
        .find_map(|e| match &e.body {
            EventBody::TaskUpdated(u) if u.task.workflow_id == wf => u.data.clone(),
            _ => None,
        })
        .expect("connection details");
    let port = data["port"].as_u64().expect("a port");
    assert_eq!(data["user"], "root");
    assert!(data["command"].as_str().unwrap().starts_with(&format!("ssh -p {port} root@")));

    // The server may need a moment after the container starts; retry within the deadline.
    let deadline = tokio::time::Instant::now() + tests::DEADLINE;
    let out = loop {
        let out = tokio::task::spawn_blocking({
            let key = key.clone();
            move || ssh_command(&key, port, "echo hello-from-session")
        })
        .await?;
        if out.status.success() || tokio::time::Instant::now() > deadline {
            break out;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert!(String::from_utf8_lossy(&out.stdout).contains("hello-from-session"), "{out:?}");
    let refused = tokio::task::spawn_blocking(move || ssh_command(&stranger, port, "true")).await?;
    assert!(!refused.status.success(), "a key that is not authorized is refused");

    let events = world.wait_workflow_end(&wf).await?;
    assert_eq!(events.last().unwrap().body.kind(), "workflow.completed", "{:?}", kinds(&events));
    let result = events.iter().find_map(|e| match &e.body {
        EventBody::TaskCompleted(c) => c.result.clone(),
        _ => None,
    });
    let result = result.unwrap();
    assert_eq!(result["ended"], "idle", "{result}");
    let task_id = format!("{wf}-main");
    let left = std::process::Command::new("docker")
        .args(["ps", "-aq", "--filter", &format!("label=flowmesh.task_id={task_id}")])
        .output()?;
    assert!(left.stdout.is_empty(), "the session's container is removed");
    world.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn ssh_run_and_connect_reach_a_running_session_with_the_owner_s_key_only() -> anyhow::Result<()> {
    if !sessions_ready() {
        return Ok(());
    }
    let mut world = World::start().await?;
    world.stack().await?;
    let (key, stranger, public) = owner_and_stranger(&world, "id_owner");
    // First a workflow that is not a session. (It also makes the session wf-2: containers are
    // named after the task id, and another test's world runs a wf-1-main session on this engine.)
    let echo = world.submit(&tests::example("valid/echo.yaml"), None).await?;
    world.wait_workflow_end(&echo).await?;
    let out = world.cli(&["ssh", "connect", &format!("{echo}-main")]).await?;
    assert!(String::from_utf8_lossy(&out.stderr).contains("not an ssh session"), "{}", tests::output_text(&out));

    let doc = format!(
        "apiVersion: flowmesh/v1\nkind: SSH\nmetadata: {{name: session, owner: ada}}\nspec:\n  taskType: ssh\n  image: {SSHD_IMAGE}\n  authorizedKeys: [\"{public}\"]\n  ttlSeconds: 120\n"
    );
    let wf = world.submit(doc.as_bytes(), None).await?;
    let task = format!("{wf}-main");
    let events = world
        .wait_for("the session to be ready", |events| {
            events.iter().any(|e| {
                matches!(&e.body, EventBody::TaskUpdated(u) if u.task.workflow_id == wf)
                    || matches!(&e.body, EventBody::TaskFailed(f) if f.task.workflow_id == wf)
            })
        })
        .await?;
    let failed = events.iter().find_map(|e| match &e.body {
        EventBody::TaskFailed(f) if f.task.workflow_id == wf => Some(format!("{}: {}", f.reason, f.message)),
        _ => None,
    });
    assert!(failed.is_none(), "the session failed to start: {failed:?}");
    let (key_arg, stranger_arg) = (key.to_str().unwrap(), stranger.to_str().unwrap());

    let out = world.cli(&["ssh", "connect", &task, "-i", key_arg, "--print"]).await?;
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && printed.contains(" root@") && printed.contains(" -t "),
        "{}",
        tests::output_text(&out)
    );

    // The server may need a moment after the container starts; retry within the deadline.
    let deadline = tokio::time::Instant::now() + tests::DEADLINE;
    let out = loop {
        let out = world.cli(&["ssh", "run", &task, "-i", key_arg, "--", "echo", "hello-via-flowmesh"]).await?;
        if out.status.success() || tokio::time::Instant::now() > deadline {
            break out;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "hello-via-flowmesh", "{}", tests::output_text(&out));
    let out = world.cli(&["ssh", "run", &task, "-i", key_arg, "--", "exit", "3"]).await?;
    assert_eq!(out.status.code(), Some(3), "the remote exit code passes through: {}", tests::output_text(&out));
    let out = world.cli(&["ssh", "run", &task, "-i", stranger_arg, "--", "true"]).await?;
    assert!(!out.status.success(), "a key the task does not list is refused: {}", tests::output_text(&out));

    let out = world.cli(&["workflow", "cancel", &wf]).await?;
    assert!(out.status.success(), "{}", tests::output_text(&out));
    world.wait_workflow_end(&wf).await?;
    let out = world.cli(&["ssh", "run", &task, "-i", key_arg, "--", "true"]).await?;
    assert_eq!(out.status.code(), Some(1), "{}", tests::output_text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not running"), "{}", tests::output_text(&out));

    world.shutdown().await;
    Ok(())
}
