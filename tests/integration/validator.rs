//! The validator: verdicts, rejections with paths, exactly one verdict per submission.

use async_nats::jetstream::consumer::PullConsumer;
use flowmesh_domain::EventBody;
use futures_util::StreamExt;
use std::time::Duration;
use tests::{World, example};

fn verdicts(events: &[flowmesh_domain::Event], workflow_id: &str) -> usize {
    events
        .iter()
        .filter(|e| match &e.body {
            EventBody::SubmissionAccepted(a) => a.workflow_id == workflow_id,
            EventBody::SubmissionRejected(r) => r.workflow_id == workflow_id,
            _ => false,
        })
        .count()
}

#[tokio::test]
async fn malformed_document_gets_one_rejection_with_paths() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.validator("validator", flowmesh_validator::Config::default()).await?;
    let doc = b"apiVersion: flowmesh/v1\nkind: Workflow\nspec:\n  taskType: echo\n  data: {type: list, items: [a]}\n  resources:\n    hardware:\n      memory: lots\n  colour: blue\n";
    world.nats_pub(doc).await?;
    let events = world.wait_for("the verdict", |events| verdicts(events, "wf-1") == 1).await?;
    let EventBody::SubmissionRejected(rejection) = &events[0].body else {
        panic!("expected a rejection, got {:?}", events[0])
    };
    let paths: Vec<&str> = rejection.errors.iter().map(|p| p.path.as_str()).collect();
    assert!(paths.contains(&"/spec/resources/hardware/memory"), "{:?}", rejection.errors);
    assert!(paths.contains(&"/spec/colour"), "{:?}", rejection.errors);
    assert!(rejection.errors.iter().all(|p| !p.message.is_empty()));

    // Hostile bodies are rejected too, and the validator keeps serving.
    world.nats_pub(b"\xff\xfe binary").await?;
    world.nats_pub(b"").await?;
    world.nats_pub(&example("valid/echo.yaml")).await?;
    let events = world
        .wait_for("three more verdicts", |events| (2..=4).all(|n| verdicts(events, &format!("wf-{n}")) == 1))
        .await?;
    let accepted =
        events.iter().any(|e| matches!(&e.body, EventBody::SubmissionAccepted(a) if a.workflow_id == "wf-4"));
    assert!(accepted, "the validator still accepts good documents after hostile ones");
    world.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_validator_crash_between_receipt_and_ack_yields_one_verdict() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    let config = flowmesh_validator::Config { ack_wait: Duration::from_secs(1), ..Default::default() };
    world.submit(&example("valid/echo.yaml"), None).await?;
    world.submit(&example("valid/echo.yaml"), None).await?;

    // The first validator receives both submissions; it stores the verdict of the first and
    // "crashes" before acking either (the messages are never acked).
    let consumer: PullConsumer = flowmesh_validator::consumer(&world.handles.js, &config).await?;
    let mut batch = consumer.fetch().max_messages(2).messages().await?;
    let first = batch.next().await.expect("first submission").map_err(|e| anyhow::anyhow!("{e}"))?;
    let _second = batch.next().await.expect("second submission").map_err(|e| anyhow::anyhow!("{e}"))?;
    flowmesh_validator::publish_verdict(&world.handles.js, &first, "crashed")
        .await
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    drop(batch);

    // A restarted validator gets both again once the ack wait passes.
    world.validator("validator", config).await?;
    world
        .wait_for("verdicts for both", |events| verdicts(events, "wf-1") >= 1 && verdicts(events, "wf-2") >= 1)
        .await?;
    let mut consumer = consumer;
    let deadline = tokio::time::Instant::now() + tests::DEADLINE;
    loop {
        let info = consumer.info().await?;
        if info.num_ack_pending == 0 && info.num_pending == 0 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "submissions never acked: {info:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Both redeliveries were handled; the stream kept one verdict each.
    let mut stream = world.handles.js.get_stream("FLOWMESH_EVENTS").await?;
    let stored = stream.info().await?.state.messages;
    assert_eq!(stored, 2, "exactly two verdicts stored");
    let events = world.events();
    assert_eq!((verdicts(&events, "wf-1"), verdicts(&events, "wf-2")), (1, 1));
    world.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_resubmission_with_the_same_msg_id_gets_one_verdict() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.validator("validator", flowmesh_validator::Config::default()).await?;
    let first = world.submit(&example("valid/echo.yaml"), Some("run-42")).await?;
    let again = world.submit(&example("valid/echo.yaml"), Some("run-42")).await?;
    assert_eq!(first, again, "the stream answers a duplicate with the original sequence");
    let other = world.submit(&example("valid/echo.yaml"), Some("run-43")).await?;
    world.wait_for("both verdicts", |events| verdicts(events, &other) == 1 && verdicts(events, &first) == 1).await?;
    let mut stream = world.handles.js.get_stream("FLOWMESH_SUBMISSIONS").await?;
    assert_eq!(stream.info().await?.state.messages, 2, "the duplicate was not stored");
    assert_eq!(verdicts(&world.events(), &first), 1);
    world.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn two_validators_share_the_load_and_each_submission_gets_one_verdict() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    let config = |name: &str| flowmesh_validator::Config { instance: name.to_owned(), batch: 2, ..Default::default() };
    world.validator("v1", config("v1")).await?;
    world.validator("v2", config("v2")).await?;
    let n = 120;
    let doc = example("valid/sft_then_inference.yaml");
    for _ in 0..n {
        world.client.publish("flowmesh.submit", doc.clone().into()).await?;
    }
    world.client.flush().await?;
    let events =
        world.wait_for("every verdict", |events| (1..=n).all(|i| verdicts(events, &format!("wf-{i}")) >= 1)).await?;
    let mut by = std::collections::BTreeMap::<String, usize>::new();
    for i in 1..=n {
        assert_eq!(verdicts(&events, &format!("wf-{i}")), 1, "wf-{i}");
    }
    for e in &events {
        if let EventBody::SubmissionAccepted(a) = &e.body {
            *by.entry(a.submission.validated_by.clone().unwrap_or_default()).or_default() += 1;
        }
    }
    assert_eq!(by.values().sum::<usize>(), n);
    assert!(by.len() == 2 && by.values().all(|&c| c > 0), "both validators took part: {by:?}");
    world.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn hostile_input_is_rejected_and_the_validator_keeps_serving() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.validator("validator", flowmesh_validator::Config::default()).await?;
    let mut bomb = String::from("apiVersion: flowmesh/v1\nkind: X\na0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..12 {
        let p = i - 1;
        bomb += &format!("a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n");
    }
    let deep = format!("spec: {}{}", "[".repeat(10_000), "]".repeat(10_000));
    let huge_name = format!(
        "apiVersion: flowmesh/v1\nkind: Echo\nmetadata:\n  name: \"{}\"\nspec:\n  taskType: echo\n  data: {{type: list, items: [a]}}\n",
        "x".repeat(1024 * 1024 - 200)
    );
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("alias bomb", bomb.into_bytes(), "invalid YAML"),
        ("10,000-deep nesting", deep.into_bytes(), "invalid YAML"),
        ("invalid UTF-8", b"spec: \xc3\x28\n".to_vec(), "UTF-8"),
        ("binary", vec![0u8, 1, 2, 3, 255, 254], "UTF-8"),
        ("empty", Vec::new(), "empty"),
        ("several documents", b"kind: A\n---\nkind: B\n".to_vec(), "invalid YAML"),
        ("duplicate keys", b"kind: A\nkind: B\nspec: {}\n".to_vec(), "invalid YAML"),
        ("a 1 MiB scalar", huge_name.into_bytes(), "event limit"),
    ];
    for (i, (what, body, needle)) in cases.iter().enumerate() {
        world.nats_pub(body).await?;
        let wf = format!("wf-{}", i + 1);
        let events = world.wait_for(&format!("the verdict on {what}"), |events| verdicts(events, &wf) == 1).await?;
        let rejection = events.iter().find_map(|e| match &e.body {
            EventBody::SubmissionRejected(r) if r.workflow_id == wf => Some(r.clone()),
            _ => None,
        });
        let rejection = rejection.unwrap_or_else(|| panic!("{what} must be rejected"));
        assert!(rejection.errors.iter().any(|p| p.message.contains(needle)), "{what}: {:?}", rejection.errors);
    }
    // A 2 MiB message never reaches the stream: the server refuses it (max_payload, max_msg_size).
    let refused = world.handles.js.publish("flowmesh.submit", vec![b'a'; 2 * 1024 * 1024].into()).await;
    let refused = match refused {
        Err(e) => Err(e.to_string()),
        Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
    };
    assert!(refused.is_err(), "a 2 MiB submission must be refused");
    world.nats_pub(&example("valid/echo.yaml")).await?;
    let n = cases.len() + 1;
    let events =
        world.wait_for("a verdict on a good document", |events| verdicts(events, &format!("wf-{n}")) == 1).await?;
    assert!(
        events
            .iter()
            .any(|e| matches!(&e.body, EventBody::SubmissionAccepted(a) if a.workflow_id == format!("wf-{n}")))
    );
    world.shutdown().await;
    Ok(())
}

/// With the validators down and an operator's cap on the submissions stream, what the stream
/// acknowledged is kept and what it cannot keep is refused to the submitter: never a silent loss.
#[tokio::test]
async fn a_full_submissions_stream_refuses_and_loses_nothing_it_acknowledged() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    let stream = flowmesh_nats::subjects::SUBMISSIONS_STREAM;
    let mut config = world.handles.js.get_stream(stream).await?.info().await?.config.clone();
    config.max_messages = 5;
    world.handles.js.update_stream(&config).await?;

    let (mut stored, mut refused) = (Vec::new(), Vec::new());
    // What `flowmesh submit` does once connected (the CLI itself, like every client that runs
    // the start-up check, refuses to work against limits other than its definition's).
    for _ in 0..8 {
        match flowmesh::submit::submit(&world.handles.js, example("valid/echo.yaml"), None).await {
            Ok((workflow_id, _)) => stored.push(workflow_id),
            Err(e) => refused.push(e.to_string()),
        }
    }
    assert_eq!((stored.len(), refused.len()), (5, 3), "stored: {stored:?}\nrefused: {refused:?}");
    assert!(
        refused.iter().all(|e| e.contains("submission not stored") && e.contains("maximum messages")),
        "{refused:?}"
    );

    // A service will not run against limits other than its definition's.
    let err = flowmesh_nats::Handles::ensure(&world.client, &flowmesh_nats::Topology::load(1)?).await.err();
    assert!(matches!(&err, Some(flowmesh_nats::EdgeError::Conflict { field: "max_msgs", .. })), "{err:?}");

    // The operator lifts the cap; every acknowledged submission gets its verdict.
    config.max_messages = -1;
    world.handles.js.update_stream(&config).await?;
    world.validator("validator", flowmesh_validator::Config::default()).await?;
    world
        .wait_for("a verdict for each stored submission", |events| {
            (1..=5).all(|n| verdicts(events, &format!("wf-{n}")) == 1)
        })
        .await?;
    Ok(())
}

/// A deployment made by an older version, whose events stream kept message ids for 2 h, is
/// brought to the definition's window in place at start-up, its events kept; a shorter window than
/// the definition's (nobody's older version had one) stays a conflict.
#[tokio::test]
async fn an_older_longer_duplicate_window_is_shortened_in_place() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    let stream = flowmesh_nats::subjects::EVENTS_STREAM;
    let defined = world.handles.js.get_stream(stream).await?.info().await?.config.duplicate_window;
    assert_eq!(defined, std::time::Duration::from_secs(120), "the definition's window");
    world.validator("validator", flowmesh_validator::Config::default()).await?;
    let workflow_id = world.submit(&example("valid/echo.yaml"), None).await?;
    world.wait_for("its verdict", |events| verdicts(events, &workflow_id) == 1).await?;
    let stored = world.handles.js.get_stream(stream).await?.info().await?.state.messages;

    let mut older = world.handles.js.get_stream(stream).await?.info().await?.config.clone();
    older.duplicate_window = std::time::Duration::from_secs(2 * 3600);
    world.handles.js.update_stream(&older).await?;
    flowmesh_nats::Handles::ensure(&world.client, &flowmesh_nats::Topology::load(1)?).await?;
    let now = world.handles.js.get_stream(stream).await?.info().await?.clone();
    assert_eq!((now.config.duplicate_window, now.state.messages), (defined, stored));
    assert!(stored >= 1, "the verdict is stored");

    let mut shorter = now.config.clone();
    shorter.duplicate_window = std::time::Duration::from_secs(1);
    world.handles.js.update_stream(&shorter).await?;
    let err = flowmesh_nats::Handles::ensure(&world.client, &flowmesh_nats::Topology::load(1)?).await.err();
    assert!(matches!(&err, Some(flowmesh_nats::EdgeError::Conflict { field: "duplicate_window", .. })), "{err:?}");
    Ok(())
}

/// A document that yields a problem per key gets one rejection, bounded in size, listing the
/// first problems and counting the rest; later submissions are not held up behind it.
#[tokio::test]
async fn a_rejection_with_countless_problems_is_capped_and_stored() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.validator("validator", flowmesh_validator::Config::default()).await?;
    let mut doc = String::from(
        "apiVersion: flowmesh/v1\nkind: Workflow\nspec:\n  taskType: echo\n  data: {type: list, items: [a]}\n",
    );
    for n in 0..20_000 {
        doc.push_str(&format!("  unknown_key_number_{n}: {n}\n"));
    }
    assert!(doc.len() > 500_000 && doc.len() < 1 << 20);
    world.nats_pub(doc.as_bytes()).await?;
    world.nats_pub(&example("valid/echo.yaml")).await?;
    let events = world
        .wait_for("both verdicts", |events| verdicts(events, "wf-1") == 1 && verdicts(events, "wf-2") == 1)
        .await?;
    let rejection = events
        .iter()
        .find_map(|e| match &e.body {
            EventBody::SubmissionRejected(r) if r.workflow_id == "wf-1" => Some(r),
            _ => None,
        })
        .expect("wf-1 is rejected");
    assert_eq!(rejection.errors.len(), flowmesh_domain::problem::MAX_LISTED + 1);
    let last = rejection.errors.last().unwrap();
    assert!(last.message.starts_with("and ") && last.message.contains("more problems not listed"), "{last:?}");
    assert!(serde_json::to_vec(rejection)?.len() < 256 * 1024);
    Ok(())
}

/// With the server's whole store full (an operator's other stream took it), a submission that
/// cannot be stored is refused to its submitter, and one acknowledged earlier is not lost: its
/// verdict cannot be stored either, so the validator keeps it unacknowledged and tries again,
/// and once space is freed it gets exactly one verdict.
#[tokio::test]
async fn a_full_server_store_refuses_submissions_and_loses_no_acknowledged_one() -> anyhow::Result<()> {
    use async_nats::jetstream::stream;
    let config = flowmesh_nats::auth::SERVER_CONFIG.replace("jetstream {\n", "jetstream {\n  max_file_store: 4MB\n");
    anyhow::ensure!(config.contains("max_file_store"), "streams/nats-server.conf has no jetstream block");
    let mut world = World::start_secured_with(&config, &[]).await?;
    let js = world.handles.js.clone();
    let mut acknowledged = Vec::new();
    for _ in 0..3 {
        acknowledged.push(flowmesh::submit::submit(&js, example("valid/echo.yaml"), None).await?.0);
    }

    // Another stream fills the store, 128 KiB at a time, until the server refuses.
    js.create_stream(stream::Config {
        name: "OPERATOR_FILLER".into(),
        subjects: vec!["operator.filler".into()],
        ..Default::default()
    })
    .await?;
    let chunk = vec![b'x'; 128 * 1024];
    let mut refusal = None;
    for _ in 0..64 {
        if let Err(e) = js.publish("operator.filler", chunk.clone().into()).await?.await {
            refusal = Some(e);
            break;
        }
    }
    let refusal = refusal.ok_or_else(|| anyhow::anyhow!("8 MiB were stored in a 4 MB store"))?;

    // Refused, and told so.
    for _ in 0..2 {
        let error = flowmesh::submit::submit(&js, example("valid/echo.yaml"), None).await.err();
        let error = error.ok_or_else(|| anyhow::anyhow!("a full store acknowledged a submission ({refusal})"))?;
        assert!(error.to_string().contains("submission not stored"), "{error:#}");
    }

    // The validator takes the acknowledged ones and cannot store a verdict: each is handed back
    // (redelivered), never acknowledged without its verdict.
    world.process("validator", &["validator"], &crate::forgery::as_role("validator"))?;
    let consumer = flowmesh_nats::subjects::VALIDATORS_CONSUMER;
    let deadline = tokio::time::Instant::now() + tests::DEADLINE;
    loop {
        let stream = js.get_stream(flowmesh_nats::subjects::SUBMISSIONS_STREAM).await?;
        let info = stream.consumer_info(consumer).await.ok();
        if info.as_ref().is_some_and(|i| i.num_redelivered > 0) {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the validator never retried a verdict it could not store: {info:?}\n{}",
            world.process_log("validator")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let is_verdict = |e: &&flowmesh_domain::Event| {
        matches!(e.body, EventBody::SubmissionAccepted(_) | EventBody::SubmissionRejected(_))
    };
    assert_eq!(world.events().iter().filter(is_verdict).count(), 0, "a verdict was stored in a full store");

    // Space comes back: every acknowledged submission gets one verdict, and nothing else does.
    js.delete_stream("OPERATOR_FILLER").await?;
    let events = world
        .wait_for("a verdict for each acknowledged submission", |events| {
            acknowledged.iter().all(|id| verdicts(events, id) == 1)
        })
        .await?;
    assert_eq!(
        events.iter().filter(is_verdict).count(),
        acknowledged.len(),
        "a verdict for something not acknowledged"
    );
    Ok(())
}
