//! `flowmesh trace WF`: where a finished workflow's time went, from the event log alone.

use tests::{World, output_text};

const FAN_IN: &str = "apiVersion: flowmesh/v1\nkind: Workflow\nmetadata: {name: fan-in}\nspec:\n  taskType: python\n  command: 'sleep 0.2'\n  graph:\n    nodes:\n      - {name: quick}\n      - {name: slow, spec: {command: 'sleep 1.5'}}\n      - {name: join, dependsOn: [quick, slow]}\n";

#[tokio::test]
async fn trace_times_each_phase_finds_the_critical_path_and_draws_it() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.stack().await?;
    let wf = world.submit(FAN_IN.as_bytes(), None).await?;
    world.wait_workflow_end(&wf).await?;

    let svg = world.dir.path().join("trace.svg");
    let out = world.cli(&["trace", &wf, "--json", "--svg", svg.to_str().unwrap()]).await?;
    assert!(out.status.success(), "{}", output_text(&out));
    let trace: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(trace["critical_path"], serde_json::json!(["slow", "join"]), "{trace:#}");
    assert_eq!(trace["outcome"], "completed");
    let task = |stage: &str| trace["tasks"].as_array().unwrap().iter().find(|t| t["stage"] == stage).unwrap().clone();
    let time_in = |stage: &str, phase: &str| -> u64 {
        task(stage)["spans"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["phase"] == phase)
            .map(|s| s["end_ms"].as_u64().unwrap() - s["start_ms"].as_u64().unwrap())
            .sum()
    };
    assert!(time_in("slow", "run") >= 1400, "slow ran ~1.5 s: {trace:#}");
    assert!(time_in("quick", "run") < time_in("slow", "run"));
    assert!(time_in("join", "waiting") >= 1400, "join waited for slow: {trace:#}");
    assert_eq!(time_in("quick", "waiting"), 0, "roots wait for nothing");
    let total = trace["total_ms"].as_u64().unwrap();
    assert!(total >= time_in("slow", "run") + time_in("join", "run"), "{trace:#}");

    let picture = std::fs::read_to_string(&svg)?;
    assert!(picture.starts_with("<svg") && picture.trim_end().ends_with("</svg>"));
    assert_eq!(picture.matches(r#"<g class="task""#).count(), 3, "one bar per task");
    assert!(picture.contains(r#"class="run""#) && picture.contains(r#"class="queued""#));

    let out = world.cli(&["trace", &wf]).await?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("critical path: slow -> join") && text.contains("* join"), "{}", output_text(&out));
    let out = world.cli(&["trace", "wf-99"]).await?;
    assert_eq!(out.status.code(), Some(1), "{}", output_text(&out));
    world.shutdown().await;
    Ok(())
}
