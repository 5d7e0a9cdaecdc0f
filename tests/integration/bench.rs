//! `flowmesh bench` against a real stack: every task is timed, the raw JetStream ceiling is
//! measured on the same server, its temporary stream is gone afterwards, and a run that cannot
//! finish says so in its exit code.

use flowmesh::bench::{self, Percentiles, Report, RunEnd, TaskKind};
use flowmesh_domain::EventBody;
use flowmesh_nats::{shutdown, subjects};
use futures_util::StreamExt;
use tests::{DEADLINE, World};

fn assert_ordered(what: &str, p: Option<Percentiles>, samples: usize) -> Percentiles {
    let p = p.unwrap_or_else(|| panic!("{what}: no samples"));
    assert_eq!(p.samples, samples, "{what}: {p:?}");
    assert!(p.p50 > 0.0 && p.p50 <= p.p90 && p.p90 <= p.p99 && p.p99 <= p.max, "{what} out of order: {p:?}");
    p
}

/// The temporary raw streams still on the server.
async fn raw_streams(world: &World) -> anyhow::Result<Vec<String>> {
    let names: Vec<String> =
        world.handles.js.stream_names().collect::<Vec<_>>().await.into_iter().collect::<Result<_, _>>()?;
    Ok(names.into_iter().filter(|n| n.starts_with(subjects::BENCH_RAW_STREAM_PREFIX)).collect())
}

#[tokio::test]
async fn bench_times_every_task_and_measures_the_raw_ceiling_on_the_same_server() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.stack().await?;
    let options = bench::Options {
        tasks: 20,
        concurrency: 4,
        mix: "echo=3,python=1".parse()?,
        raw: Some(flowmesh_nats::connect::NatsOptions {
            url: world.url(),
            name: "bench test raw".to_owned(),
            ..Default::default()
        }),
        raw_messages: 500,
        timeout: DEADLINE,
        fleet_wait: DEADLINE,
        replicas: 1,
        min_workers: 1,
        rate: None,
        cpu_of: std::iter::once(flowmesh::cpu::this("bench test"))
            .chain(world.server.pid().map(|pid| flowmesh::cpu::Process { name: "nats-server".into(), pid }))
            .collect(),
    };
    let (_trigger, stop) = shutdown::channel();
    let report = bench::run(&world.handles.js, &options, stop).await?;

    assert_eq!((report.submitted, report.completed, report.failed, report.unfinished), (20, 20, 0, 0), "{report:#?}");
    assert_eq!(report.end, RunEnd::Finished);
    assert!(report.success());
    assert_eq!(report.per_type.get(&TaskKind::Echo), Some(&15));
    assert_eq!(report.per_type.get(&TaskKind::Python), Some(&5));
    assert_eq!(report.workers, 1);
    // The stack's one worker, as its snapshot says: two batch slots, and a queue within the
    // default (its offer follows its runs).
    assert_eq!(report.batch_slots, 2, "{report:#?}");
    assert!(report.queue_places <= flowmesh_worker::config::DEFAULT_PREFETCH, "{report:#?}");
    let start = assert_ordered("submit → start", report.submit_to_start_ms, 20);
    let done = assert_ordered("submit → done", report.submit_to_done_ms, 20);
    // Each workflow starts before it ends, so every order statistic of the starts is at most the
    // same statistic of the ends.
    assert!(
        start.p50 <= done.p50 && start.p90 <= done.p90 && start.max <= done.max,
        "start {start:?} vs done {done:?}"
    );
    assert!(report.tasks_per_sec > 0.0 && report.wall_ms >= done.max * 0.99, "{report:#?}");
    // Where its slowest starts were: at least the slowest one, in as many stalls as there are
    // of them at most, and none submitted after the run's last end.
    let slow = report.slow_starts.expect("a run that timed starts says when its slowest were submitted");
    assert!((1..=20).contains(&slow.samples) && (1..=slow.samples).contains(&slow.stalls), "{slow:?}");
    assert!(slow.largest_share > 0.0 && slow.largest_share <= 1.0, "{slow:?}");
    assert!(slow.largest_at_ms + slow.largest_span_ms <= report.wall_ms, "{slow:?}");

    let raw = report.raw.clone().expect("--raw was asked for");
    assert_eq!(raw.messages, 500);
    assert!(raw.msgs_per_sec > 0.0 && raw.message_bytes > 100, "{raw:?}");
    assert_ordered("raw publish → consume", raw.publish_to_consume_ms, 500);
    // Measured again after the pipeline, on a stream of its own, and the ratio is to the mean of
    // the two ceilings.
    let after = report.raw_after.clone().expect("--raw measures after the pipeline too");
    assert_eq!(after.messages, 500);
    assert!(after.msgs_per_sec > 0.0 && after.stream != raw.stream, "{after:?}");
    assert_ordered("raw publish → consume, after", after.publish_to_consume_ms, 500);
    let ratio = report.ratio_to_raw.expect("a ratio with --raw");
    let ceiling = (raw.msgs_per_sec + after.msgs_per_sec) / 2.0;
    assert!((ratio - report.tasks_per_sec / ceiling).abs() < 1e-9, "{report:#?}");
    assert!(raw.stream.starts_with(subjects::BENCH_RAW_STREAM_PREFIX), "{}", raw.stream);
    // Stored messages are counted from the streams, not assumed: every workflow stored at least
    // its submission, its verdict, its dispatch (the work order inside: echo holds no secret,
    // so nothing goes to the work stream) and its task's end.
    assert_eq!(report.stored.get(subjects::SUBMISSIONS_STREAM), Some(&20), "{report:#?}");
    assert_eq!(report.stored.get(subjects::WORK_STREAM).copied().unwrap_or(0), 0, "{report:#?}");
    assert!(report.stored.get(subjects::EVENTS_STREAM).is_some_and(|n| *n >= 60), "{report:#?}");
    let per_task = report.stored_per_task.expect("stored messages per task");
    assert!((per_task - report.stored.values().sum::<u64>() as f64 / 20.0).abs() < 1e-9);
    let efficiency = report.efficiency.expect("an efficiency with --raw");
    assert!((efficiency - ratio * per_task).abs() < 1e-9, "{report:#?}");
    for stream in [&raw.stream, &after.stream] {
        assert!(world.handles.js.get_stream(stream).await.is_err(), "{stream} was not deleted");
    }
    assert_eq!(raw_streams(&world).await?, Vec::<String>::new());

    // The log agrees: twenty workflows completed, five of them dispatched as python tasks.
    let events = world
        .wait_for("20 workflows to complete", |events| {
            events.iter().filter(|e| matches!(e.body, EventBody::WorkflowCompleted(_))).count() == 20
        })
        .await?;
    let python_dispatched =
        events.iter().filter(|e| matches!(&e.body, EventBody::TaskDispatched(d) if d.task_type == "python")).count();
    assert_eq!(python_dispatched, 5);

    // CPU per task, of this process (the stack runs in it) and of the server, read from /proc.
    let cpu: Vec<&str> = report.cpu_ms_per_task.keys().map(String::as_str).collect();
    assert_eq!(cpu, ["bench test", "nats-server"], "{report:#?}");
    assert!(report.cpu_ms_per_task.values().all(|ms| ms.is_finite() && *ms >= 0.0), "{report:#?}");
    assert!(report.cpu_ms_per_task["bench test"] > 0.0, "twenty workflows took no CPU here: {report:#?}");
    // And how often each left its core: every workflow's messages wait for the server at least once.
    let switched: Vec<&str> = report.switches_per_task.keys().map(String::as_str).collect();
    assert_eq!(switched, ["bench test", "nats-server"], "{report:#?}");
    assert!(report.switches_per_task.values().all(|n| *n >= 1.0), "{report:#?}");
    let memory: Vec<&str> = report.peak_rss_mib.keys().map(String::as_str).collect();
    assert_eq!(memory, ["bench test", "nats-server"], "{report:#?}");
    assert!(report.peak_rss_mib.values().all(|mib| *mib > 1.0), "{report:#?}");
    // And how the machine's cores spent the run: three shares of all their time, together one.
    let machine = report.machine.unwrap_or_else(|| panic!("no machine share read from /proc/stat: {report:#?}"));
    assert!(machine.cores >= 1, "{machine:?}");
    assert!([machine.busy, machine.idle, machine.stolen].iter().all(|s| (0.0..=1.0).contains(s)), "{machine:?}");
    assert!((machine.busy + machine.idle + machine.stolen - 1.0).abs() < 1e-9, "{machine:?}");
    assert!(machine.busy > 0.0, "twenty workflows ran and no core was busy: {machine:?}");
    for raw in [&report.raw, &report.raw_after] {
        let raw_machine = raw.as_ref().and_then(|r| r.machine);
        assert!(raw_machine.is_some_and(|m| m.busy > 0.0 && m.cores == machine.cores), "{report:#?}");
    }

    // Every workflow's timeline, for `--samples`: it starts before it ends; not part of the JSON.
    assert_eq!(report.samples.len(), 20, "{report:#?}");
    for s in &report.samples {
        let (to_start, to_done) = s.to_start_ms.zip(s.to_done_ms).unwrap_or_else(|| panic!("{s:?}"));
        assert!(s.submitted_ms >= 0.0 && to_start <= to_done, "{s:?}");
    }
    let json = serde_json::to_string(&report)?;
    assert_eq!(serde_json::from_str::<Report>(&json)?, Report { samples: Vec::new(), ..report.clone() });

    // The binary, as a script uses it: JSON on stdout, success in the exit code; the timelines
    // in the file `--samples` names, one line per workflow after the header.
    let samples = tempfile::NamedTempFile::new()?;
    let out = world
        .cli(&[
            "bench",
            "--tasks",
            "6",
            "--concurrency",
            "3",
            "--mix",
            "echo=1",
            "--raw",
            "--raw-messages",
            "300",
            "--json",
            "--samples",
            &samples.path().to_string_lossy(),
        ])
        .await?;
    assert!(out.status.success(), "{}", tests::output_text(&out));
    let report: Report =
        serde_json::from_slice(&out.stdout).map_err(|e| anyhow::anyhow!("{e}: {}", tests::output_text(&out)))?;
    assert_eq!((report.completed, report.per_type.get(&TaskKind::Echo)), (6, Some(&6)), "{report:#?}");
    assert!(report.raw.is_some_and(|r| r.msgs_per_sec > 0.0));
    let csv = std::fs::read_to_string(samples.path())?;
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.first(), Some(&"submitted_ms,to_start_ms,to_done_ms"), "{csv}");
    assert_eq!(lines.len(), 7, "{csv}");
    assert!(lines[1..].iter().all(|l| l.split(',').all(|cell| cell.parse::<f64>().is_ok())), "{csv}");
    assert_eq!(raw_streams(&world).await?, Vec::<String>::new());

    // A sweep: the burst, then the same number at 25, 50 and 90% of its rate, each paced.
    let out = world.cli(&["bench", "--tasks", "8", "--mix", "echo=1", "--sweep", "--json"]).await?;
    assert!(out.status.success(), "{}", tests::output_text(&out));
    let sweep: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| anyhow::anyhow!("{e}: {}", tests::output_text(&out)))?;
    let burst: Report = serde_json::from_value(sweep["burst"].clone())?;
    assert_eq!((burst.completed, burst.rate), (8, None), "{burst:#?}");
    let points = sweep["sweep"].as_array().expect("sweep points");
    let percents: Vec<u64> = points.iter().filter_map(|p| p["percent"].as_u64()).collect();
    assert_eq!(percents, [25, 50, 90]);
    for point in points {
        let report: Report = serde_json::from_value(point["report"].clone())?;
        let asked = burst.tasks_per_sec * point["percent"].as_f64().unwrap_or_default() / 100.0;
        assert!(report.rate.is_some_and(|r| (r - asked).abs() < 1e-6), "{point}");
        assert_eq!(report.completed, 8, "{point}");
        assert_ordered("paced submit → start", report.submit_to_start_ms, 8);
    }

    let out = world.cli(&["bench", "--mix", "echo=0"]).await?;
    assert_eq!(out.status.code(), Some(2), "{}", tests::output_text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("the weight of echo is \"0\""),
        "{}",
        tests::output_text(&out)
    );
    world.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn bench_that_cannot_finish_reports_unfinished_tasks_and_fails() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.stack().await?;
    // A cordoned worker is live and serves echo, so the bench starts, but nothing is placed.
    let out = world.cli(&["worker", "cordon", "w1"]).await?;
    assert!(out.status.success(), "{}", tests::output_text(&out));
    let out = world.cli(&["bench", "--tasks", "3", "--mix", "echo=1", "--timeout-sec", "2", "--json"]).await?;
    assert_eq!(out.status.code(), Some(1), "{}", tests::output_text(&out));
    let report: Report =
        serde_json::from_slice(&out.stdout).map_err(|e| anyhow::anyhow!("{e}: {}", tests::output_text(&out)))?;
    assert_eq!((report.submitted, report.completed, report.unfinished), (3, 0, 3), "{report:#?}");
    assert_eq!(report.end, RunEnd::TimedOut);
    assert!(!report.success());
    world.shutdown().await;
    Ok(())
}
