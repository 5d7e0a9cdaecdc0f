//! The `ssh` executor against the real Docker engine: limits as the engine applied them, output and
//! logs, cancellation, deadlines and exit codes. Skips (with the reason) only when Docker is unreachable.

use bollard::Docker;
use bollard::models::HostConfig;
use bollard::query_parameters::ListContainersOptions;
use flowmesh_domain::fleet::{Hardware, SshLimits};
use flowmesh_domain::work::WorkOrder;
use flowmesh_nats::{Trigger, shutdown};
use flowmesh_worker::executor::ssh::plan::{LABEL_TASK_ID, input_mounts};
use flowmesh_worker::executor::ssh::{SshExecutor, SshSettings};
use flowmesh_worker::executor::{ExecError, TaskContext};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

const IMAGE: &str = "flowmesh-test-busybox:latest";
const MIB: u64 = 1 << 20;
/// Bounds every wait on the engine: a test that hangs past it fails.
const DEADLINE: Duration = Duration::from_secs(60);

/// Waits until the output folder holds `go`: the test holds the container running until it has
/// inspected it, with no timing guess.
const GATE: &str = "while [ ! -e /flowmesh/output/go ]; do sleep 0.1; done; rm /flowmesh/output/go";

/// The engine, or `None` (and the reason on stderr) when it cannot be reached.
async fn docker() -> Option<Docker> {
    let docker = match Docker::connect_with_local_defaults() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("skipping: no Docker endpoint ({e:?})");
            return None;
        }
    };
    if let Err(e) = docker.ping().await {
        eprintln!("skipping: the Docker engine does not answer ({e:?})");
        return None;
    }
    let docker = docker.negotiate_version().await.expect("the engine answered a ping but not /version");
    ensure_image(&docker).await;
    Some(docker)
}

/// Builds the test image with `tools/docker-test-image.sh` when it is missing (once per process).
async fn ensure_image(docker: &Docker) {
    static BUILD: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _one_builder = BUILD.lock().await;
    if docker.inspect_image(IMAGE).await.is_ok() {
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/docker-test-image.sh");
    let status = tokio::process::Command::new("bash").arg(&script).status().await;
    match status {
        Ok(s) if s.success() => {}
        other => panic!(
            "Docker is reachable but {IMAGE} is missing, and {} could not build it ({other:?}); run it by hand to see why",
            script.display()
        ),
    }
    docker.inspect_image(IMAGE).await.unwrap_or_else(|e| panic!("{IMAGE} is still missing after the build: {e}"));
}

async fn executor(name: &str, limits: SshLimits) -> SshExecutor {
    let settings = SshSettings {
        // One worker id per test: connect() sweeps that worker's leftovers, never another test's.
        worker_id: format!("ssh-test-{}-{name}", std::process::id()),
        limits,
        gpu_limit: true,
        hardware: Hardware { cpu_cores: 2, memory_bytes: 4096 * MIB, ..Hardware::default() },
        simulated: false,
        public_host: "127.0.0.1".into(),
        bind_address: "127.0.0.1".into(),
        home: format!("/tmp/ssh-test-{}-{name}", std::process::id()),
    };
    SshExecutor::connect(settings).await.expect("the engine answered the test, so the executor connects")
}

/// A task context over a fresh work folder. Keep the trigger: dropping it counts as a cancel.
fn task(name: &str, spec: Value) -> (Trigger, TaskContext, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let output_dir = dir.path().join("output");
    std::fs::create_dir_all(&output_dir).unwrap();
    let (trigger, cancel) = shutdown::channel();
    let task_id = format!("wf-{}-{name}", std::process::id());
    let order = WorkOrder {
        workflow_id: format!("wf-{}", std::process::id()),
        task_id,
        stage: name.to_owned(),
        attempt: 1,
        task_type: "ssh".to_owned(),
        spec: spec.into(),
        upstream: BTreeMap::new(),
        upstream_artifacts: BTreeMap::new(),
        upstream_results: BTreeMap::new(),
    };
    let ctx = TaskContext {
        order: std::sync::Arc::new(order),
        work_dir: dir.path().to_path_buf(),
        output_dir,
        gpus: Vec::new(),
        cancel,
        max_runtime: None,
        updates: None,
    };
    (trigger, ctx, dir)
}

fn batch(command: &str, hardware: Value) -> Value {
    json!({"taskType": "ssh", "interactive": false, "image": IMAGE, "command": command, "resources": {"hardware": hardware}})
}

/// Ids of the containers (running or not) labelled with this task.
async fn containers_of(docker: &Docker, task_id: &str) -> Vec<String> {
    let options = ListContainersOptions {
        all: true,
        filters: Some(HashMap::from([("label".to_owned(), vec![format!("{LABEL_TASK_ID}={task_id}")])])),
        ..Default::default()
    };
    docker.list_containers(Some(options)).await.expect("list containers").into_iter().filter_map(|c| c.id).collect()
}

/// Polls until the task's container runs, and returns its inspected host config.
async fn running_container(docker: &Docker, task_id: &str) -> HostConfig {
    let start = Instant::now();
    loop {
        for id in containers_of(docker, task_id).await {
            // The engine lists a container a moment before inspect can find it (404 while it is
            // being created): poll again rather than fail. A run that ends early is caught by the caller.
            if let Ok(inspected) = docker.inspect_container(&id, None).await
                && inspected.state.as_ref().and_then(|s| s.running) == Some(true)
            {
                return inspected.host_config.expect("a host config");
            }
        }
        assert!(start.elapsed() < DEADLINE, "no running container for {task_id} within {DEADLINE:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs a gated task, inspects its container while it runs, then opens the gate.
async fn run_inspected(
    docker: &Docker,
    exec: &SshExecutor,
    ctx: &TaskContext,
) -> (HostConfig, Result<Value, ExecError>) {
    let run = exec.run(ctx);
    tokio::pin!(run);
    let host = tokio::select! {
        host = running_container(docker, &ctx.order.task_id) => host,
        early = &mut run => panic!("the task ended before its container could be inspected: {early:?}"),
    };
    std::fs::write(ctx.output_dir.join("go"), b"").unwrap();
    let result = tokio::time::timeout(DEADLINE, run).await.expect("the task ends within the deadline");
    (host, result)
}

fn clamped_fields(result: &Value) -> Vec<String> {
    result["clamped"]
        .as_array()
        .expect("clamped is a list")
        .iter()
        .map(|c| c["field"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn under_the_caps_the_container_gets_the_spec_and_returns_its_output() {
    let Some(docker) = docker().await else { return };
    let caps = SshLimits { max_cpu: Some(1.0), max_memory_bytes: Some(256 * MIB), max_pids: Some(64) };
    let exec = executor("under", caps).await;
    let command = format!("{GATE}; echo hi > /flowmesh/output/hello.txt; echo done; echo oops >&2");
    let (_trigger, ctx, _dir) = task("under", batch(&command, json!({"cpu": 0.5, "memory": "64Mi"})));

    let (host, result) = run_inspected(&docker, &exec, &ctx).await;

    assert_eq!(host.nano_cpus, Some(500_000_000), "NanoCpus = spec");
    assert_eq!(host.memory, Some(64 * MIB as i64), "Memory = spec");
    assert_eq!(host.pids_limit, Some(64), "PidsLimit = cap (the spec has none)");
    let result = result.expect("the task succeeds");
    assert_eq!(result["exit_code"], 0);
    assert!(clamped_fields(&result).is_empty(), "nothing clamped: {result}");
    assert_eq!(std::fs::read_to_string(ctx.output_dir.join("hello.txt")).unwrap(), "hi\n", "the output file is back");
    assert!(!ctx.output_dir.join("go").exists());
    assert!(result["stdout"].as_str().unwrap().contains("done"), "stdout tail in the result: {result}");
    assert_eq!(std::fs::read_to_string(ctx.work_dir.join("stdout.log")).unwrap(), "done\n");
    assert_eq!(std::fs::read_to_string(ctx.work_dir.join("stderr.log")).unwrap(), "oops\n");
    assert!(containers_of(&docker, &ctx.order.task_id).await.is_empty(), "the container is removed");
}

#[tokio::test]
async fn over_the_caps_the_container_gets_the_caps_and_the_clamp_is_reported() {
    let Some(docker) = docker().await else { return };
    let caps = SshLimits { max_cpu: Some(0.5), max_memory_bytes: Some(64 * MIB), max_pids: Some(32) };
    let exec = executor("over", caps).await;
    let (_trigger, ctx, _dir) = task("over", batch(GATE, json!({"cpu": 4, "memory": "1Gi"})));

    let (host, result) = run_inspected(&docker, &exec, &ctx).await;

    assert_eq!(host.nano_cpus, Some(500_000_000), "NanoCpus = cap");
    assert_eq!(host.memory, Some(64 * MIB as i64), "Memory = cap");
    assert_eq!(host.pids_limit, Some(32), "PidsLimit = cap");
    assert_eq!(clamped_fields(&result.expect("the task succeeds")), ["cpu", "memory"]);
}

#[tokio::test]
async fn with_neither_spec_nor_caps_no_limit_is_set() {
    let Some(docker) = docker().await else { return };
    let exec = executor("unset", SshLimits::default()).await;
    let (_trigger, ctx, _dir) = task("unset", batch(GATE, json!({})));

    let (host, result) = run_inspected(&docker, &exec, &ctx).await;

    assert_eq!(host.nano_cpus.unwrap_or(0), 0, "no NanoCpus");
    assert_eq!(host.memory.unwrap_or(0), 0, "no Memory");
    assert!(matches!(host.pids_limit, None | Some(0)), "no PidsLimit, found {:?}", host.pids_limit);
    result.expect("the task succeeds");
}

#[tokio::test]
async fn inputs_are_mounted_read_only_and_output_over_max_bytes_fails() {
    let Some(docker) = docker().await else { return };
    let exec = executor("inputs", SshLimits::default()).await;
    let command = "cat /mnt/in/results.json > /mnt/out/copy.json; if touch /mnt/in/x 2>/dev/null; then exit 4; fi";
    let mut spec = batch(command, json!({}));
    spec["inputs"] = json!([{"stage": "collect", "mountPath": "/mnt/in"}]);
    spec["sshOutput"] = json!({"mountPath": "/mnt/out", "maxBytes": 1024});
    let (_trigger, ctx, _dir) = task("inputs", spec.clone());
    // The caller fills the input folders before the run (here with a stand-in upstream result).
    let mounts = input_mounts(&ctx.order.spec, &ctx.work_dir);
    std::fs::create_dir_all(&mounts[0].0).unwrap();
    std::fs::write(mounts[0].0.join("results.json"), br#"{"items":[1,2]}"#).unwrap();

    let result = exec.run(&ctx).await.expect("the task succeeds");
    assert_eq!(std::fs::read_to_string(ctx.output_dir.join("copy.json")).unwrap(), r#"{"items":[1,2]}"#);
    assert_eq!(result["output_bytes"], 15);

    spec["command"] = json!("head -c 2048 /dev/zero > /mnt/out/big");
    let (_trigger, ctx, _dir) = task("too-big", spec);
    match exec.run(&ctx).await {
        Err(ExecError::Permanent(m)) => assert!(m.contains("maxBytes"), "{m}"),
        other => panic!("expected a permanent failure over maxBytes, got {other:?}"),
    }
    assert!(containers_of(&docker, &ctx.order.task_id).await.is_empty(), "the container is removed");
}

#[tokio::test]
async fn cancellation_kills_and_removes_the_container() {
    let Some(docker) = docker().await else { return };
    let exec = executor("cancel", SshLimits::default()).await;
    let (trigger, ctx, _dir) = task("cancel", batch("sleep 300", json!({})));

    let run = exec.run(&ctx);
    tokio::pin!(run);
    tokio::select! {
        _ = running_container(&docker, &ctx.order.task_id) => trigger.fire(),
        early = &mut run => panic!("the task ended before it could be cancelled: {early:?}"),
    }
    let result = tokio::time::timeout(DEADLINE, run).await.expect("a cancelled task ends well before its sleep");

    assert_eq!(result, Err(ExecError::Cancelled));
    assert!(containers_of(&docker, &ctx.order.task_id).await.is_empty(), "the container is removed");
}

#[tokio::test]
async fn ttl_seconds_is_a_deadline() {
    let Some(docker) = docker().await else { return };
    let exec = executor("ttl", SshLimits::default()).await;
    let mut spec = batch("sleep 300", json!({}));
    spec["ttlSeconds"] = json!(1);
    let (_trigger, ctx, _dir) = task("ttl", spec);

    let result = tokio::time::timeout(DEADLINE, exec.run(&ctx)).await.expect("the ttl ends the task");

    assert_eq!(result, Err(ExecError::TimedOut(Duration::from_secs(1))));
    assert!(containers_of(&docker, &ctx.order.task_id).await.is_empty(), "the container is removed");
}

#[tokio::test]
async fn exit_codes_decide_retry() {
    let Some(docker) = docker().await else { return };
    let exec = executor("exit", SshLimits::default()).await;

    let (_trigger, ctx, _dir) = task("exit75", batch("exit 75", json!({})));
    assert!(matches!(exec.run(&ctx).await, Err(ExecError::Retryable(_))), "75 asks for a retry");
    assert!(containers_of(&docker, &ctx.order.task_id).await.is_empty(), "the container is removed");

    let (_trigger, ctx, _dir) = task("exit3", batch("echo broken >&2; exit 3", json!({})));
    match exec.run(&ctx).await {
        Err(ExecError::Permanent(m)) => {
            assert!(m.contains("status 3") && m.contains("broken"), "status and stderr in the message: {m}")
        }
        other => panic!("exit 3 must be permanent, got {other:?}"),
    }
    assert!(containers_of(&docker, &ctx.order.task_id).await.is_empty(), "the container is removed");
}
