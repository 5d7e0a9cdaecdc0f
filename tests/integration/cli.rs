//! The `flowmesh` CLI as a person or a script uses it, against a real stack.

use flowmesh_domain::EventBody;
use tests::{World, flowmesh_bin};

#[tokio::test]
async fn submit_watch_list_plan_and_fetch() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.stack().await?;

    let out = world.cli(&["submit", "examples/valid/echo.yaml", "--watch"]).await?;
    assert!(out.status.success(), "{}", tests::output_text(&out));
    let results: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(results["main"]["count"], 3, "{}", tests::output_text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("workflow wf-1 completed"));

    let out = world.cli(&["submit", "examples/invalid/several_errors.yaml"]).await?;
    assert_eq!(out.status.code(), Some(1), "{}", tests::output_text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("rejected with 5 problem(s)") && err.contains("/spec/stages/2/name"),
        "{}",
        tests::output_text(&out)
    );

    let out = world.cli(&["worker", "list", "--json"]).await?;
    assert!(out.status.success(), "{}", tests::output_text(&out));
    let workers: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let types = &workers[0]["snapshot"]["supported_task_types"];
    assert_eq!(workers[0]["snapshot"]["id"], "w1");
    assert!(types.as_array().unwrap().iter().any(|t| t == "echo"), "{types}");

    let out = world.cli(&["workflow", "list"]).await?;
    let list = String::from_utf8_lossy(&out.stdout);
    assert!(list.lines().any(|l| l.starts_with("wf-1 ") && l.contains("completed")), "{list}");
    assert!(list.lines().any(|l| l.starts_with("wf-2 ") && l.contains("rejected")), "{list}");

    let out = world.cli(&["plan", "examples/valid/ppo.yaml"]).await?;
    let plan = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "no worker can run ppo here: {}", tests::output_text(&out));
    assert!(plan.contains("w1") && plan.contains("does not serve task type \"ppo\""), "{}", tests::output_text(&out));
    let out = world.cli(&["plan", "examples/valid/echo.yaml"]).await?;
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("* w1"),
        "{}",
        tests::output_text(&out)
    );

    let dir = world.dir.path().join("fetched");
    let out = world.cli(&["result", "fetch", "wf-1-main", "--out", dir.to_str().unwrap()]).await?;
    assert!(out.status.success(), "{}", tests::output_text(&out));
    // An echo stores no files: its result comes from its completion event.
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("inline in its task.completed event"),
        "{}",
        tests::output_text(&out)
    );
    let fetched: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("results.json"))?)?;
    assert_eq!(fetched, results["main"]);

    let out = world.cli(&["events", "--workflow", "wf-1", "--json"]).await?;
    let kinds: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["type"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(kinds.first().map(String::as_str), Some("submission.accepted"));
    assert_eq!(kinds.last().map(String::as_str), Some("workflow.completed"));
    world.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_submission_that_cannot_be_followed_is_said_to_be_stored_and_runs_once_a_validator_comes()
-> anyhow::Result<()> {
    // No services yet: the submission is stored, and nobody decides on it within the watch.
    let mut world = World::start().await?;
    let out = world.cli(&["submit", "examples/valid/echo.yaml", "--watch", "--timeout-sec", "1"]).await?;
    let text = tests::output_text(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("wf-1 is stored") && text.contains("flowmesh workflow watch wf-1"), "{text}");
    // It was not lost: the stack that comes later runs it, once.
    world.stack().await?;
    let events = world.wait_workflow_end("wf-1").await?;
    assert!(events.iter().any(|e| matches!(&e.body, EventBody::TaskCompleted(_))), "{:?}", tests::kinds(&events));
    world.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn workflow_cancel_ends_a_running_workflow_as_cancelled() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.stack().await?;
    let doc = "apiVersion: flowmesh/v1\nkind: Python\nmetadata: {name: long}\nspec:\n  taskType: python\n  command: 'sleep 120'\n  stages:\n    - {name: first}\n    - {name: second}\n";
    let wf = world.submit(doc.as_bytes(), None).await?;
    world
        .wait_for("the first stage to start", |events| {
            events.iter().any(|e| matches!(&e.body, EventBody::TaskStarted(s) if s.task.stage == "first"))
        })
        .await?;
    let out = world.cli(&["workflow", "cancel", &wf]).await?;
    assert!(out.status.success(), "{}", tests::output_text(&out));
    let events = world.wait_workflow_end(&wf).await?;
    assert_eq!(events.last().unwrap().body.kind(), "workflow.cancelled");
    let cancelled: Vec<_> = events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::TaskCancelled(c) => Some((c.task.stage.clone(), c.worker_id.clone())),
            _ => None,
        })
        .collect();
    assert!(
        cancelled.contains(&("first".to_owned(), Some("w1".to_owned()))),
        "the running task was stopped by its worker: {cancelled:?}"
    );
    assert!(
        cancelled.iter().any(|(stage, worker)| stage == "second" && worker.is_none()),
        "the queued one never dispatched: {cancelled:?}"
    );
    world.shutdown().await;
    Ok(())
}

/// Kills the tmux session when the test ends, however it ends.
struct TmuxSession(String);
impl Drop for TmuxSession {
    fn drop(&mut self) {
        let _ = std::process::Command::new("tmux").args(["kill-session", "-t", &self.0]).status();
    }
}

#[tokio::test]
async fn the_live_view_renders_in_a_terminal_and_exits() -> anyhow::Result<()> {
    if std::process::Command::new("tmux").arg("-V").output().is_err() {
        eprintln!("skipping: tmux is not installed");
        return Ok(());
    }
    let mut world = World::start().await?;
    world.stack().await?;
    let name = format!("flowmesh-live-{}-{}", std::process::id(), world.server.port);
    let script = format!(
        "{} submit examples/valid/conditional_echo_graph.yaml --watch > {}; echo EXIT=$?; sleep 120",
        flowmesh_bin().display(),
        world.dir.path().join("results.json").display()
    );
    let started = std::process::Command::new("tmux")
        .args(["new-session", "-d", "-s", &name, "-x", "160", "-y", "40"])
        .args(["-e", &format!("NATS_URL={}", world.url()), "-e", "RUST_LOG=warn"])
        .args(["-c", concat!(env!("CARGO_MANIFEST_DIR"), "/..")])
        .arg(&script)
        .status()?;
    anyhow::ensure!(started.success(), "tmux could not start a session");
    let _session = TmuxSession(name.clone());
    let deadline = tokio::time::Instant::now() + tests::DEADLINE;
    let screen = loop {
        let out = std::process::Command::new("tmux").args(["capture-pane", "-p", "-t", &name]).output()?;
        let screen = String::from_utf8_lossy(&out.stdout).into_owned();
        if screen.contains("EXIT=") {
            break screen;
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "the live view never finished:\n{screen}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert!(screen.contains("EXIT=0"), "{screen}");
    assert!(screen.contains("STAGE") && screen.contains("ELAPSED"), "the table header is drawn:\n{screen}");
    assert_eq!(screen.matches("STAGE").count(), 1, "redrawn in place, not appended:\n{screen}");
    for (stage, status) in [("judge", "completed"), ("publish", "skipped"), ("report", "completed")] {
        assert!(screen.lines().any(|l| l.starts_with(stage) && l.contains(status)), "{stage} {status}:\n{screen}");
    }
    assert!(screen.contains("completed") && !screen.contains("\u{1b}["), "escape codes are interpreted, not printed");
    world.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn task_logs_follow_streams_and_ends_with_the_task() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.stack().await?;
    let doc = "apiVersion: flowmesh/v1\nkind: Python\nmetadata: {name: talk}\nspec:\n  taskType: python\n  command: 'sleep 1; echo line-one; sleep 1; echo line-two'\n";
    let wf = world.submit(doc.as_bytes(), None).await?;
    let task = format!("{wf}-main");
    // Started while the task runs (or is about to): it must print the output and exit by itself.
    let out = tokio::time::timeout(tests::DEADLINE, world.cli(&["task", "logs", &task, "--follow"])).await??;
    assert!(out.status.success(), "{}", tests::output_text(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("line-two"), "{}", tests::output_text(&out));
    // And on a task that already ended, it prints the stored output and returns at once.
    let again = tokio::time::timeout(tests::DEADLINE, world.cli(&["task", "logs", &task, "--follow"])).await??;
    assert!(again.status.success(), "{}", tests::output_text(&again));
    assert!(String::from_utf8_lossy(&again.stdout).contains("line-one\nline-two"), "{}", tests::output_text(&again));
    world.shutdown().await;
    Ok(())
}
