//! The standalone binaries, run as an operator would run them.

use flowmesh_domain::EventBody;
use tests::{World, binary, kinds};

#[tokio::test]
async fn the_standalone_binaries_run_a_workflow() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    let results = world.dir.path().join("bin-worker");
    world.process_of(&binary("flowmesh-validator"), "validator", &[], &[])?;
    world.process_of(&binary("flowmesh-router"), "router", &[], &[("ROUTER_LEASE_TTL_SEC", "3")])?;
    world.process_of(
        &binary("flowmesh-worker"),
        "worker",
        &[],
        &[("WORKER_ID", "bin-worker"), ("RESULTS_DIR", results.to_str().unwrap()), ("HEARTBEAT_INTERVAL_SEC", "1")],
    )?;
    world.nats_pub(&tests::example("valid/echo.yaml")).await?;
    let events = world.wait_workflow_end("wf-1").await?;
    assert_eq!(
        events.last().unwrap().body.kind(),
        "workflow.completed",
        "{:?}\n{}",
        kinds(&events),
        world.process_log("router")
    );
    assert!(events.iter().any(|e| matches!(&e.body, EventBody::TaskCompleted(c) if c.worker_id == "bin-worker")));
    world.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn collect_hw_prints_the_probe_real_or_simulated() -> anyhow::Result<()> {
    for bin in [binary("flowmesh-worker"), tests::flowmesh_bin()] {
        let mut command = tokio::process::Command::new(&bin);
        if bin.ends_with("flowmesh") {
            command.arg("worker");
        }
        let real = command.arg("--collect-hw").env("RUST_LOG", "warn").output().await?;
        assert!(real.status.success(), "{}", tests::output_text(&real));
        let report: serde_json::Value = serde_json::from_slice(&real.stdout)?;
        assert_eq!(report["probe"]["simulated"], false);
        assert!(report["probe"]["hardware"]["cpu_cores"].as_u64().unwrap() >= 1);
        assert!(report["supported_task_types"].as_array().unwrap().iter().any(|t| t == "echo"));

        let hw = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/hardware/gpu-h100.json"))?;
        let mut command = tokio::process::Command::new(&bin);
        if bin.ends_with("flowmesh") {
            command.arg("worker");
        }
        let simulated =
            command.arg("--collect-hw").env("FLOWMESH_SIMULATE_HW", hw).env("RUST_LOG", "warn").output().await?;
        let report: serde_json::Value = serde_json::from_slice(&simulated.stdout)?;
        assert_eq!(report["probe"]["simulated"], true);
        assert_eq!(report["probe"]["hardware"]["gpus"][0]["name"], "NVIDIA H100 80GB HBM3");
    }
    Ok(())
}

#[tokio::test]
async fn a_bad_setting_stops_the_worker_with_the_variable_named() -> anyhow::Result<()> {
    for (variable, value) in [("SSH_MAX_CPU", "0"), ("SSH_MAX_MEMORY", "lots"), ("HEARTBEAT_INTERVAL_SEC", "-1")] {
        let out = tokio::process::Command::new(binary("flowmesh-worker"))
            .env(variable, value)
            .env("NATS_URL", "nats://127.0.0.1:1")
            .output()
            .await?;
        assert_eq!(out.status.code(), Some(2), "{variable}={value}: {}", tests::output_text(&out));
        assert!(String::from_utf8_lossy(&out.stderr).contains(variable), "{}", tests::output_text(&out));
    }
    Ok(())
}

#[tokio::test]
async fn nats_url_may_list_several_servers() -> anyhow::Result<()> {
    let world = World::start().await?;
    let dead = flowmesh::nats_server::free_port()?;
    let out = tokio::process::Command::new(tests::flowmesh_bin())
        .args(["worker", "list", "--json"])
        .env("NATS_URL", format!("nats://127.0.0.1:{dead},{}", world.url()))
        .output()
        .await?;
    assert!(out.status.success(), "the second server is used when the first is down: {}", tests::output_text(&out));
    world.shutdown().await;
    Ok(())
}
