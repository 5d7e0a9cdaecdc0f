//! A client run against a NATS cluster with no `FLOWMESH_REPLICAS` creates replicated streams.

use flowmesh::nats_server::{NatsServer, free_port};
use std::time::{Duration, Instant};

/// Three JetStream servers on loopback, routed to each other.
async fn cluster(dir: &std::path::Path) -> anyhow::Result<Vec<NatsServer>> {
    let routes: Vec<u16> = (0..3).map(|_| free_port()).collect::<Result<_, _>>()?;
    let mut servers = Vec::new();
    for (i, route) in routes.iter().enumerate() {
        let others: Vec<String> =
            routes.iter().filter(|r| *r != route).map(|r| format!("\"nats-route://127.0.0.1:{r}\"")).collect();
        let config = dir.join(format!("n{i}.conf"));
        std::fs::write(
            &config,
            format!(
                "server_name: n{i}\ncluster {{ name: flowmesh-test, listen: \"127.0.0.1:{route}\", routes: [{}] }}\n",
                others.join(", ")
            ),
        )?;
        servers.push(NatsServer::start_with(None, &dir.join(format!("n{i}")), None, Some(&config), &[]).await?);
    }
    Ok(servers)
}

#[tokio::test]
async fn streams_created_on_a_cluster_without_flowmesh_replicas_are_replicated_on_three_nodes() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut servers = cluster(dir.path()).await?;
    // Formed once the first node tells its clients of all three (a deadline, not a sleep).
    let client = async_nats::connect(servers[0].url()).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while client.server_info().connect_urls.len() < 3 {
        anyhow::ensure!(Instant::now() < deadline, "the cluster did not form: {:?}", client.server_info());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let out = tokio::process::Command::new(tests::flowmesh_bin())
        .args(["streams", "apply"])
        .env("NATS_URL", servers[0].url())
        .env_remove("FLOWMESH_REPLICAS")
        .env("RUST_LOG", "warn")
        .output()
        .await?;
    assert!(out.status.success(), "{}", tests::output_text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("(3 replica(s))"), "{}", tests::output_text(&out));
    let js = async_nats::jetstream::new(client);
    for name in ["FLOWMESH_SUBMISSIONS", "FLOWMESH_EVENTS", "FLOWMESH_WORK", "KV_flowmesh_workers"] {
        let info = js.get_stream(name).await?.info().await?.clone();
        assert_eq!(info.config.num_replicas, 3, "{name}");
    }
    for server in &mut servers {
        server.stop().await;
    }
    Ok(())
}
