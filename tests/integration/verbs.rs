//! The verbs FlowMesh users type — `task info|watch|stop`, `workflow submit|validate|logs`,
//! `result download`, `dev --no-worker-grace-sec` — as a person runs them, against a real stack.

use flowmesh_domain::EventBody;
use tests::{World, output_text};

const SLEEPER: &str = "apiVersion: flowmesh/v1\nkind: Python\nmetadata: {name: sleeper}\nspec:\n  taskType: python\n  command: 'sleep 120'\n";

const TALKER: &str = "apiVersion: flowmesh/v1\nkind: Workflow\nmetadata: {name: talker}\nspec:\n  taskType: python\n  command: 'echo hello-from-$FLOWMESH_TASK_ID; echo oops >&2'\n  stages:\n    - {name: first}\n    - {name: second}\n";

fn json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", output_text(out)))
}

#[tokio::test]
async fn task_info_watch_and_stop_find_a_running_task_by_its_id() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.stack().await?;
    let wf = world.submit(SLEEPER.as_bytes(), None).await?;
    let task = format!("{wf}-main");
    world
        .wait_for("the task to start", |events| events.iter().any(|e| matches!(&e.body, EventBody::TaskStarted(_))))
        .await?;

    let out = world.cli(&["task", "info", &task]).await?;
    assert!(out.status.success(), "task info finds a running task: {}", output_text(&out));
    let info = json(&out);
    assert_eq!((info["status"].as_str(), info["worker_id"].as_str()), (Some("running"), Some("w1")), "{info}");

    // `task watch` follows it from the log to its end, whenever it is started.
    let watch_args = ["task", "watch", &task, "--timeout-sec", "30"];
    let watch = world.cli(&watch_args);
    let stop = async {
        let out = world.cli(&["task", "stop", &task]).await?;
        anyhow::ensure!(out.status.success(), "task stop: {}", output_text(&out));
        anyhow::ensure!(String::from_utf8_lossy(&out.stdout).contains("cancel requested"), "{}", output_text(&out));
        Ok(())
    };
    let (watched, stopped) = tokio::join!(watch, stop);
    stopped?;
    let watched = watched?;
    assert_eq!(watched.status.code(), Some(1), "a cancelled task is not a success: {}", output_text(&watched));
    assert!(
        String::from_utf8_lossy(&watched.stderr).contains(&format!("{task} cancelled")),
        "{}",
        output_text(&watched)
    );

    let events = world.wait_workflow_end(&wf).await?;
    assert!(
        events.iter().any(|e| matches!(&e.body, EventBody::TaskCancelled(c) if c.worker_id.as_deref() == Some("w1"))),
        "the worker stopped it"
    );
    let out = world.cli(&["task", "info", &task]).await?;
    assert_eq!(json(&out)["status"], "cancelled", "{}", output_text(&out));
    let out = world.cli(&["task", "cancel", &task]).await?;
    assert_eq!(out.status.code(), Some(1), "{}", output_text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("already ended (cancelled)"), "{}", output_text(&out));

    for missing in [format!("{wf}-nosuch"), "wf-99-main".to_owned()] {
        let out = world.cli(&["task", "info", &missing]).await?;
        assert_eq!(out.status.code(), Some(1), "{}", output_text(&out));
        assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("no task {missing}")), "{}", output_text(&out));
    }
    world.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn task_watch_prints_the_result_of_a_completed_task() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.stack().await?;
    let wf = world.submit(&tests::example("valid/echo.yaml"), None).await?;
    let out = world.cli(&["task", "watch", &format!("{wf}-main"), "--timeout-sec", "30"]).await?;
    assert!(out.status.success(), "{}", output_text(&out));
    assert_eq!(json(&out)["count"], 3, "{}", output_text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("{wf}-main completed")), "{}", output_text(&out));
    world.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn workflow_submit_and_validate_are_the_top_level_verbs() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.stack().await?;
    let out = world.cli(&["workflow", "validate", "examples/valid/echo.yaml"]).await?;
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("valid"), "{}", output_text(&out));
    let out = world.cli(&["workflow", "validate", "examples/invalid/several_errors.yaml"]).await?;
    assert_eq!(out.status.code(), Some(1), "{}", output_text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("5 problem(s)"), "{}", output_text(&out));

    let out = world.cli(&["workflow", "submit", "examples/valid/echo.yaml", "--watch"]).await?;
    assert!(out.status.success(), "{}", output_text(&out));
    assert_eq!(json(&out)["main"]["count"], 3, "{}", output_text(&out));
    let out = world.cli(&["workflow", "submit", "examples/invalid/several_errors.yaml"]).await?;
    assert_eq!(out.status.code(), Some(1), "a rejected submission fails: {}", output_text(&out));
    world.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn workflow_logs_shows_downloads_and_follows_every_task_s_output() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.stack().await?;
    let wf = world.submit(TALKER.as_bytes(), None).await?;
    world.wait_workflow_end(&wf).await?;

    let out = world.cli(&["workflow", "logs", &wf]).await?;
    assert!(out.status.success(), "{}", output_text(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let first = text.find(&format!("==> {wf}-first (first) <==")).expect("a header per task");
    let second = text.find(&format!("==> {wf}-second (second) <==")).expect("a header per task");
    assert!(first < second, "in the workflow's order:\n{text}");
    assert!(text.contains(&format!("hello-from-{wf}-first")) && text.contains(&format!("hello-from-{wf}-second")));
    assert!(!text.contains("oops"), "stdout only:\n{text}");
    let out = world.cli(&["workflow", "logs", &wf, "--stderr"]).await?;
    assert!(String::from_utf8_lossy(&out.stdout).contains("oops"), "{}", output_text(&out));

    let dir = world.dir.path().join("logs");
    let out = world.cli(&["workflow", "logs", &wf, "--download", dir.to_str().unwrap()]).await?;
    assert!(out.status.success(), "{}", output_text(&out));
    for stage in ["first", "second"] {
        let stdout = std::fs::read_to_string(dir.join(format!("{wf}-{stage}")).join("stdout.log"))?;
        assert!(stdout.contains(&format!("hello-from-{wf}-{stage}")), "{stdout}");
        let stderr = std::fs::read_to_string(dir.join(format!("{wf}-{stage}")).join("stderr.log"))?;
        assert!(stderr.contains("oops"), "{stderr}");
    }

    // --follow prints live lines, tagged with their stage, and returns when the workflow ends.
    let ticker = "apiVersion: flowmesh/v1\nkind: Python\nmetadata: {name: ticker}\nspec:\n  taskType: python\n  command: 'for i in $(seq 1 40); do echo tick-$i; sleep 0.2; done'\n";
    let wf = world.submit(ticker.as_bytes(), None).await?;
    world.wait_started(&wf).await?;
    let out = world.cli(&["workflow", "logs", &wf, "--follow"]).await?;
    assert!(out.status.success(), "{}", output_text(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.lines().any(|l| l.starts_with("[main] tick-")), "live lines, tagged:\n{}", output_text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("[{wf} completed]")), "{}", output_text(&out));
    world.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn result_download_bundles_a_task_s_files_as_a_tgz() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.stack().await?;
    let wf = world.submit(TALKER.as_bytes(), None).await?;
    world.wait_workflow_end(&wf).await?;
    let task = format!("{wf}-first");
    let list = |bundle: &std::path::Path| -> anyhow::Result<Vec<String>> {
        let out = std::process::Command::new("tar").arg("-tzf").arg(bundle).output()?;
        anyhow::ensure!(out.status.success(), "tar -tzf: {}", output_text(&out));
        let mut files: Vec<String> =
            String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.ends_with('/')).map(str::to_owned).collect();
        files.sort();
        Ok(files)
    };

    let bundle = world.dir.path().join("bundle.tgz");
    let out = world.cli(&["result", "download", &task, "--include", "all", "-o", bundle.to_str().unwrap()]).await?;
    assert!(out.status.success(), "{}", output_text(&out));
    let want: Vec<String> =
        ["logs/stderr.log", "logs/stdout.log", "results.json"].iter().map(|f| format!("{task}/{f}")).collect();
    assert_eq!(list(&bundle)?, want);

    let results = world.dir.path().join("results.tgz");
    let out =
        world.cli(&["result", "download", &task, "--include", "results", "-o", results.to_str().unwrap()]).await?;
    assert!(out.status.success(), "{}", output_text(&out));
    assert_eq!(list(&results)?, [format!("{task}/results.json")]);

    let out = world.cli(&["result", "download", "wf-99-main", "-o", "nothing.tgz"]).await?;
    assert_eq!(out.status.code(), Some(1), "{}", output_text(&out));
    world.shutdown().await;
    Ok(())
}

/// `flowmesh dev --no-worker-grace-sec 2`: a stage no worker can run fails after 2 s, not 60.
#[tokio::test]
async fn dev_passes_no_worker_grace_sec_on_to_its_router() -> anyhow::Result<()> {
    let port = flowmesh::nats_server::free_port()?;
    let data = tempfile::tempdir()?;
    let mut dev = tokio::process::Command::new(tests::flowmesh_bin())
        .args(["dev", "--port", &port.to_string(), "--data", data.path().to_str().unwrap()])
        .args(["--no-worker-grace-sec", "2"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let url = format!("nats://127.0.0.1:{port}");
    let deadline = tokio::time::Instant::now() + tests::DEADLINE;
    let js = loop {
        if let Ok(client) = async_nats::connect(&url).await {
            let js = async_nats::jetstream::new(client);
            if let Ok(kv) = js.get_key_value("flowmesh_workers").await
                && kv.get("dev-worker-1").await.ok().flatten().is_some()
            {
                break js;
            }
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "flowmesh dev never came up");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let submitted = tokio::time::Instant::now();
    let (wf, _) = flowmesh::submit::submit(&js, tests::example("valid/ppo.yaml"), None).await?;
    let (end, state) = flowmesh::submit::follow(&js, &wf, tests::DEADLINE, |_, _| {}).await?;
    assert_eq!(end, flowmesh::submit::End::Failed);
    let task = &state.workflows[&wf].tasks[0];
    assert_eq!(task.reason.as_deref(), Some("no_eligible_worker"), "{task:?}");
    assert!(submitted.elapsed() < std::time::Duration::from_secs(20), "failed after the 2 s grace, not 60 s");
    tests::interrupt(&mut dev).await?;
    Ok(())
}
