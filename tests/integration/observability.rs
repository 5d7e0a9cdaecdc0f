//! Every service answers the NATS micro-service protocol and its own status endpoint.

use std::collections::BTreeSet;
use tests::World;

#[tokio::test]
async fn services_answer_srv_ping_and_report_their_status() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.stack().await?;
    world.wait_for("the worker to join", |events| events.iter().any(|e| e.body.kind() == "worker.joined")).await?;

    // $SRV.PING gathers one answer per instance: collect them until all three names are seen.
    let inbox = world.client.new_inbox();
    let mut answers = world.client.subscribe(inbox.clone()).await?;
    let deadline = tokio::time::Instant::now() + tests::DEADLINE;
    let mut names = BTreeSet::new();
    while names.len() < 3 {
        world.client.publish_with_reply("$SRV.PING", inbox.clone(), "".into()).await?;
        while let Ok(Some(message)) =
            tokio::time::timeout(std::time::Duration::from_millis(300), futures_util::StreamExt::next(&mut answers))
                .await
        {
            let ping: serde_json::Value = serde_json::from_slice(&message.payload)?;
            names.insert(ping["name"].as_str().unwrap_or_default().to_owned());
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "only {names:?} answered $SRV.PING");
    }
    assert_eq!(
        names,
        BTreeSet::from(["flowmesh-router".to_owned(), "flowmesh-validator".to_owned(), "flowmesh-worker".to_owned()])
    );

    let ask = |subject: &'static str| {
        let client = world.client.clone();
        async move {
            let reply = client.request(subject, "".into()).await?;
            anyhow::Ok(serde_json::from_slice::<serde_json::Value>(&reply.payload)?)
        }
    };
    // The router refreshes its status on its tick: wait for the one that has seen the worker.
    let router = world.status_when("router", |s| s["live_workers"] == 1).await?;
    assert_eq!(router["leader"], true, "{router}");
    assert_eq!(router["live_workers"], 1, "{router}");
    let worker = ask("flowmesh.worker.w1.status").await?;
    assert_eq!(worker["id"], "w1");
    assert!(worker["supported_task_types"].as_array().unwrap().iter().any(|t| t == "echo"));
    world.nats_pub(&tests::example("valid/echo.yaml")).await?;
    world.wait_workflow_end("wf-1").await?;
    // Counted once the verdict's submission is acked, just after the verdict is stored.
    let validator = world.status_when("validator", |s| s["verdicts"] == 1).await?;
    assert_eq!(validator["verdicts"], 1, "{validator}");

    let stats = world.client.request("$SRV.STATS.flowmesh-validator", "".into()).await?;
    let stats: serde_json::Value = serde_json::from_slice(&stats.payload)?;
    assert_eq!(stats["endpoints"][0]["subject"], "flowmesh.validator.status");
    assert!(stats["endpoints"][0]["num_requests"].as_u64().unwrap() >= 1, "{stats}");
    world.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn metrics_count_verdicts_dispatches_and_tasks() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    let ports = flowmesh::nats_server::free_ports(3)?;
    let addr = |i: usize| format!("127.0.0.1:{}", ports[i]);
    let (v, r, w) = (addr(0), addr(1), addr(2));
    world.process_of(&tests::binary("flowmesh-validator"), "validator", &[], &[("METRICS_ADDR", v.as_str())])?;
    world.process_of(&tests::binary("flowmesh-router"), "router", &[], &[("METRICS_ADDR", r.as_str())])?;
    world.worker_process("mw", &[("METRICS_ADDR", w.as_str())])?;
    world.nats_pub(&tests::example("valid/echo.yaml")).await?;
    world.nats_pub(b"not: [a flowmesh document").await?;
    world.wait_workflow_end("wf-1").await?;
    world
        .wait_for("the second verdict", |events| events.iter().any(|e| e.body.kind() == "submission.rejected"))
        .await?;
    // Counters are updated right after the events they count; poll the endpoint briefly.
    let deadline = tokio::time::Instant::now() + tests::DEADLINE;
    loop {
        let scrape = |port| tests::http_get(port, "/metrics");
        let (validator, router, worker) = (scrape(ports[0]).await?, scrape(ports[1]).await?, scrape(ports[2]).await?);
        let ok = validator.contains("flowmesh_verdicts_total{verdict=\"accepted\"} 1")
            && validator.contains("flowmesh_verdicts_total{verdict=\"rejected\"} 1")
            && router.contains("flowmesh_dispatches_total 1")
            && router.contains("flowmesh_router_leader 1")
            && router.contains("flowmesh_known_workers 1")
            && worker.contains("flowmesh_tasks_total{task_type=\"echo\",outcome=\"completed\"} 1");
        if ok {
            assert!(validator.contains("flowmesh_validation_seconds"), "{validator}");
            assert!(router.contains("flowmesh_router_tick_seconds"), "{router}");
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "metrics never showed the run:\n{validator}\n{router}\n{worker}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    world.shutdown().await;
    Ok(())
}
