//! A client run against a NATS cluster with no `FLOWMESH_REPLICAS` creates replicated streams.

use flowmesh::nats_server::{NatsServer, free_ports};
use std::time::{Duration, Instant};

/// Three JetStream servers on loopback, routed to each other, and a client of the first once it
/// tells its clients of all three (a deadline, not a sleep). A port free a moment ago can be taken
/// before its server binds it, and a server whose route port is taken exits, possibly after it
/// accepted clients: the cluster is then started again on other ports.
async fn cluster(dir: &std::path::Path) -> anyhow::Result<(Vec<NatsServer>, async_nats::Client)> {
    const ATTEMPTS: usize = 3;
    let mut why = String::new();
    for attempt in 1..=ATTEMPTS {
        let ports = free_ports(6)?;
        let (clients, routes) = ports.split_at(3);
        let mut servers = Vec::new();
        for (i, route) in routes.iter().enumerate() {
            let others: Vec<String> =
                routes.iter().filter(|r| *r != route).map(|r| format!("\"nats-route://127.0.0.1:{r}\"")).collect();
            let config = dir.join(format!("a{attempt}-n{i}.conf"));
            std::fs::write(
                &config,
                format!(
                    "server_name: n{i}\ncluster {{ name: flowmesh-test, listen: \"127.0.0.1:{route}\", routes: [{}] }}\n",
                    others.join(", ")
                ),
            )?;
            let store = dir.join(format!("a{attempt}-n{i}"));
            match NatsServer::start_with(None, &store, Some(clients[i]), Some(&config), &[]).await {
                Ok(server) => servers.push(server),
                Err(e) => {
                    why = format!("n{i} did not start: {e:#}");
                    break;
                }
            }
        }
        if servers.len() == 3 {
            let client = async_nats::connect(servers[0].url()).await?;
            let deadline = Instant::now() + Duration::from_secs(20);
            while client.server_info().connect_urls.len() < 3 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if client.server_info().connect_urls.len() == 3 {
                return Ok((servers, client));
            }
            why = format!("the cluster did not form: {:?}", client.server_info());
        }
        eprintln!("cluster, attempt {attempt} of {ATTEMPTS}: {why}");
        for server in &mut servers {
            server.stop().await;
        }
    }
    anyhow::bail!("{why}")
}

#[tokio::test]
async fn streams_created_on_a_cluster_without_flowmesh_replicas_are_replicated_on_three_nodes() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (mut servers, client) = cluster(dir.path()).await?;

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
