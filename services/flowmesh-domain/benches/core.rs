//! Benchmarks of the pure core, each reported with a baseline measured in the same run:
//! - validation (decode + schema + semantics) against decoding alone;
//! - placement with a `FleetIndex` against the cheapest possible scan of the same fleet;
//! - a scheduling round over a backlog on a saturated fleet, against one full walk per task.
//!
//! Run: `cargo bench -p flowmesh-domain --bench core`. Single-threaded: one core.

use flowmesh_domain::event::{Event, EventBody, SubmissionAccepted, SubmissionRef};
use flowmesh_domain::fleet::{Gpu, Hardware, SlotCount, Slots, WorkerSnapshot, WorkerStatus};
use flowmesh_domain::placement::{Candidate, FleetIndex, Placement, Strategy, request_for};
use flowmesh_domain::schedule::{self, Action};
use flowmesh_domain::state::State;
use flowmesh_domain::{decode, validate_submission};
use serde_json::json;
use std::collections::BTreeSet;
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Runs `f` repeatedly for about `budget`; returns operations per second.
fn rate(budget: Duration, mut f: impl FnMut() -> usize) -> f64 {
    let start = Instant::now();
    let mut ops = 0usize;
    while start.elapsed() < budget {
        ops += f();
    }
    ops as f64 / start.elapsed().as_secs_f64()
}

/// The rates of `f` and `g` (calls per second), run in turns of a few milliseconds each for
/// `budget` in all: on a machine whose speed drifts, both see the same moments.
fn rates_interleaved(budget: Duration, mut f: impl FnMut() -> bool, mut g: impl FnMut() -> bool) -> (f64, f64) {
    let turn = Duration::from_millis(5);
    let (mut f_calls, mut g_calls) = (0usize, 0usize);
    let (mut f_time, mut g_time) = (Duration::ZERO, Duration::ZERO);
    let start = Instant::now();
    while start.elapsed() < budget {
        for (calls, time, run) in
            [(&mut f_calls, &mut f_time, &mut f as &mut dyn FnMut() -> bool), (&mut g_calls, &mut g_time, &mut g)]
        {
            let began = Instant::now();
            while began.elapsed() < turn {
                run();
                *calls += 1;
            }
            *time += began.elapsed();
        }
    }
    (f_calls as f64 / f_time.as_secs_f64(), g_calls as f64 / g_time.as_secs_f64())
}

#[path = "../tests/common/rng.rs"]
mod rng;

use rng::Rng;

fn large_workflow(stages: usize) -> String {
    let mut doc = String::from(
        "apiVersion: flowmesh/v1\nkind: Workflow\nmetadata: {name: large}\nspec:\n  taskType: echo\n  resources: {hardware: {cpu: 1, memory: 256Mi}}\n  stages:\n",
    );
    for i in 0..stages {
        doc += &format!("    - name: s{i}\n");
        if i >= 2 {
            doc += &format!("      dependsOn: [s{}, s{}]\n", i - 1, i - 2);
        }
        doc += &format!(
            "      spec: {{data: {{type: list, items: [\"item {i}\", \"${{s{}.count}}\"]}}}}\n",
            i.saturating_sub(1).min(i)
        );
    }
    doc.replace("${s0.count}\"]}}\n    - name: s1", "x\"]}}\n    - name: s1")
}

const TYPES: [&str; 12] = [
    "echo",
    "python",
    "agent",
    "data_profiling",
    "data_retrieval",
    "embedding",
    "rag",
    "inference",
    "sft",
    "lora_sft",
    "ppo",
    "dpo",
];
const GPUS: [(&str, u64); 4] =
    [("NVIDIA H100 80GB HBM3", 80), ("NVIDIA A100-SXM4-80GB", 80), ("NVIDIA L4", 24), ("Tesla T4", 16)];

fn fleet(n: usize, rng: &mut Rng) -> Vec<WorkerSnapshot> {
    (0..n)
        .map(|i| {
            let has_gpu = i % 2 == 0;
            let types: Vec<String> = TYPES
                .iter()
                .enumerate()
                .filter(|(t, _)| if *t >= 7 { has_gpu && rng.below(3) > 0 } else { rng.below(2) == 0 })
                .map(|(_, t)| (*t).to_owned())
                .collect();
            let (name, gib) = GPUS[rng.below(GPUS.len())];
            let gpus = if has_gpu {
                (0..[1, 2, 4, 8][rng.below(4)])
                    .map(|g| Gpu {
                        index: g,
                        uuid: format!("GPU-{i}-{g}"),
                        name: name.to_owned(),
                        memory_bytes: gib << 30,
                    })
                    .collect()
            } else {
                Vec::new()
            };
            WorkerSnapshot {
                id: format!("worker-{i:05}"),
                hostname: format!("host-{i}"),
                version: "bench".into(),
                started_at: "t0".into(),
                status: WorkerStatus::Idle,
                hardware: Hardware {
                    cpu_cores: [8, 16, 32, 64][rng.below(4)],
                    memory_bytes: ([32u64, 64, 256, 512][rng.below(4)]) << 30,
                    gpus,
                    ..Default::default()
                },
                supported_task_types: types,
                executors: Vec::new(),
                slots: Slots { batch: SlotCount { total: 4, in_use: 0 }, service: SlotCount { total: 1, in_use: 0 } },
                prefetch: 0,
                queued: 0,
                ssh_limits: None,
                tags: Vec::new(),
                cost_per_hour: 1.0 + rng.below(30) as f64,
                load: 0.0,
                active_tasks: Vec::new(),
                warm_models: Vec::new(),
                simulated: true,
                heartbeat_interval_sec: 30,
                ttl_sec: 120,
                idle_since_ms: Some(rng.below(1_000_000) as u64),
            }
        })
        .collect()
}

const STRATEGY: Strategy = Strategy::BestFit;

/// The one-task echo workflow `flowmesh bench` submits, spelled here because the CLI's
/// `TaskKind::document` is a floor above this crate.
fn bench_echo_document() -> String {
    "apiVersion: flowmesh/v1\nmetadata:\n  name: bench-echo-7\n  owner: flowmesh-bench\nkind: EchoTask\nspec:\n  taskType: echo\n  resources:\n    hardware:\n      cpu: 1\n      memory: 64Mi\n  maxAttempts: 1\n  data:\n    type: list\n    items:\n      - bench\n".to_owned()
}

fn main() {
    let budget = Duration::from_millis(1500);
    println!("## validation (decode + schema + semantics), one core");
    println!("| document | bytes | validations/s | decode-only/s (baseline) | ratio |");
    println!("|---|---|---|---|---|");
    let typical =
        std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/valid/sft_then_inference.yaml")).unwrap();
    let large = large_workflow(200).into_bytes();
    let single = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/valid/echo.yaml")).unwrap();
    assert!(validate_submission(&single, "wf-1").is_ok());
    assert!(validate_submission(&typical, "wf-1").is_ok());
    assert!(validate_submission(&large, "wf-1").is_ok(), "{:?}", validate_submission(&large, "wf-1").err());
    for (name, doc) in [
        ("single task (echo.yaml)", &single),
        ("typical (sft_then_inference.yaml)", &typical),
        ("large (200 stages)", &large),
    ] {
        let full = rate(budget, || {
            black_box(validate_submission(black_box(doc), "wf-1").is_ok());
            1
        });
        let base = rate(budget, || {
            black_box(decode::decode(black_box(doc)).is_ok());
            1
        });
        println!("| {name} | {} | {full:.0} | {base:.0} | {:.2}x decode time |", doc.len(), base / full);
    }

    println!("\n## decoding YAML: the block shape read directly against the parser alone, one core");
    println!("| document | bytes | decodings/s | serde-saphyr/s (baseline) | ratio |");
    println!("|---|---|---|---|---|");
    let bench_echo = bench_echo_document().into_bytes();
    for (name, doc) in [
        ("the bench's echo workflow", &bench_echo),
        ("single task (echo.yaml)", &single),
        ("typical (sft_then_inference.yaml)", &typical),
        ("large (200 stages)", &large),
    ] {
        let text = std::str::from_utf8(doc).unwrap();
        let parsed: serde_json::Value = serde_saphyr::from_str_with_options(text, decode::yaml_options()).unwrap();
        assert_eq!(decode::decode(doc).unwrap(), parsed);
        let direct = rate(budget, || {
            black_box(decode::decode(black_box(doc)).is_ok());
            1
        });
        let base = rate(budget, || {
            let value: Result<serde_json::Value, _> =
                serde_saphyr::from_str_with_options(black_box(text), decode::yaml_options());
            black_box(value.is_ok());
            1
        });
        println!("| {name} | {} | {direct:.0} | {base:.0} | {:.1}x faster |", doc.len(), direct / base);
    }

    println!("\n## placement, one core (realistic mix: half the workers with 1-8 GPUs, 12 task types)");
    println!(
        "| workers | index build | a join, kept index | placements/s, idle fleet | placements/s, 90% busy | placements/s into a queue | full walk with explanation/s | naive type scan/s (baseline) |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut rng = Rng(7);
    let requests: Vec<_> = (0..64)
        .map(|i| {
            let t = TYPES[i % TYPES.len()];
            let kind = ["H100", "A100", "any", "L4"][i % 4];
            let hw = if i % 3 == 0 {
                json!({"cpu": 4, "memory": "16Gi", "gpu": {"count": 1 + i % 4, "type": kind, "memory": "20GB"}})
            } else {
                json!({"cpu": 2, "memory": "8Gi"})
            };
            request_for(t, &json!({"resources": {"hardware": hw}}), None).unwrap()
        })
        .collect();
    let avoid = BTreeSet::new();
    for n in [100, 1_000, 10_000] {
        let workers = fleet(n, &mut rng);
        let idle: Vec<Candidate<'_>> = workers
            .iter()
            .map(|w| Candidate { snapshot: w, batch_in_use: 0, service_in_use: 0, cordoned: false, draining: false })
            .collect();
        // 90% of the workers have every slot taken: the walk has to go further to find a free one.
        let busy: Vec<Candidate<'_>> = workers
            .iter()
            .enumerate()
            .map(|(i, w)| Candidate {
                snapshot: w,
                batch_in_use: if i % 10 == 0 { 0 } else { 4 },
                service_in_use: 0,
                cordoned: false,
                draining: false,
            })
            .collect();
        // Every slot taken, every worker with a queue place free (`prefetch`): each placement
        // goes into a queue.
        let queueing: Vec<WorkerSnapshot> =
            workers.iter().map(|w| WorkerSnapshot { prefetch: 1, ..w.clone() }).collect();
        let queued: Vec<Candidate<'_>> = queueing
            .iter()
            .map(|w| Candidate { snapshot: w, batch_in_use: 4, service_in_use: 0, cordoned: false, draining: false })
            .collect();
        let started = Instant::now();
        let index = FleetIndex::new(&idle);
        let build = started.elapsed();
        // A worker joins a kept index (or leaves, or changes what it serves): the grouping and
        // the counts are rebuilt once, with no copy of the other snapshots.
        let mut kept = FleetIndex::new(&idle);
        let mut joined = workers[0].clone();
        let mut joins = 0u32;
        let join_rate = rate(budget, || {
            joins += 1;
            joined.id = format!("joined-{joins}");
            kept.put(&joined);
            assert!(kept.prepare());
            kept.remove(&joined.id);
            1
        });
        let busy_index = FleetIndex::new(&busy);
        let measure = |index: &FleetIndex, explained: bool| {
            let mut k = 0;
            let mut chosen = 0usize;
            let r = rate(budget, || {
                let req = &requests[k % requests.len()];
                k += 1;
                let placed = if explained {
                    index.place_explained(req, "s", "wf-1-s", STRATEGY, &avoid, 2_000_000)
                } else {
                    index.place(req, "s", "wf-1-s", STRATEGY, &avoid, 2_000_000)
                };
                if let Placement::Chosen { .. } = placed {
                    chosen += 1;
                }
                1
            });
            assert!(chosen > 0, "some requests must be placeable");
            r
        };
        let fast_idle = measure(&index, false);
        let fast_busy = measure(&busy_index, false);
        let fast_queued = measure(&FleetIndex::new(&queued), false);
        let full = measure(&index, true);
        let mut j = 0;
        let scan = rate(budget, || {
            let t = requests[j % requests.len()].task_type.as_str();
            j += 1;
            black_box(workers.iter().filter(|w| w.supported_task_types.iter().any(|s| s == t)).count());
            1
        });
        println!(
            "| {n} | {:.2} ms | {:.2} ms | {fast_idle:.0} | {fast_busy:.0} | {fast_queued:.0} | {full:.0} | {scan:.0} |",
            build.as_secs_f64() * 1e3,
            1e3 / join_rate
        );
    }

    println!("\n## a scheduling round with a backlog, one core (every worker's slots taken)");
    println!(
        "| workers | waiting tasks | whole rounds/s | µs per waiting task | full walk per task, µs (baseline) | ratio | rounds/s after one event | rounds/s after one heartbeat |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    // Single-stage documents of several types and sizes: alike requests, as in a real backlog.
    let kinds: Vec<Vec<u8>> = ["echo", "python", "ppo", "dpo", "lora_sft", "rag", "inference_vllm_a100"]
        .iter()
        .map(|name| std::fs::read(format!("{}/../../examples/valid/{name}.yaml", env!("CARGO_MANIFEST_DIR"))).unwrap())
        .collect();
    for (n, waiting) in [(1_000, 1_000), (10_000, 1_000)] {
        let mut workers = fleet(n, &mut rng);
        for w in &mut workers {
            w.slots = Slots { batch: SlotCount { total: 0, in_use: 0 }, service: SlotCount { total: 0, in_use: 0 } };
            w.supported_task_types.extend(["echo", "python"].map(String::from));
        }
        let mut state = State::default();
        for i in 0..waiting {
            let workflow_id = format!("wf-{}", i + 1);
            let workflow = validate_submission(&kinds[i % kinds.len()], &workflow_id).unwrap();
            let body = EventBody::SubmissionAccepted(SubmissionAccepted {
                workflow_id,
                submission: SubmissionRef { stream: "S".into(), seq: i as u64 + 1, msg_id: None, validated_by: None },
                task_ids: workflow.tasks.iter().map(|t| t.task_id.clone()).collect(),
                workflow,
            });
            state.apply(&Event::new(body, "t".into(), i as u64));
        }
        let config = schedule::Config { no_worker_grace_ms: u64::MAX, strategy: STRATEGY, ..Default::default() };
        // The first round explains every task (a busy hint, or a stored `task.pending` for one no
        // worker can run); folded in, later rounds are the steady state of a backlog: nothing to
        // publish.
        // What the router keeps between rounds: the waiting tasks' requests.
        let mut requests = schedule::Requests::default();
        let mut live = FleetIndex::of(&workers);
        let first = schedule::decide_with(&state, &mut live, 2_000_000, &config, &mut requests);
        assert_eq!(first.len(), waiting, "every task waits");
        for (k, action) in first.into_iter().enumerate() {
            match action {
                Action::Publish(body) => {
                    state.apply(&Event::new(body, "t".into(), (waiting + k) as u64));
                }
                // Busy: explained on a core subject, nothing stored.
                Action::Hint(_) => {}
                Action::Dispatch { .. } => panic!("nothing can be dispatched"),
            }
        }
        let round_budget = Duration::from_secs(3);
        // A whole round (the router's tick): every running workflow looked at.
        let rounds = rate(round_budget, || {
            requests.touch_all();
            assert!(schedule::decide_with(black_box(&state), &mut live, 2_000_000, &config, &mut requests).is_empty());
            1
        });
        // A round after one event: only its workflow is looked at while no slot is free.
        let touched = EventBody::TaskCancelRequested(flowmesh_domain::event::TaskCancelRequested {
            workflow_id: "wf-1".into(),
            task_id: None,
            reason: "bench".into(),
        });
        let partial = rate(round_budget, || {
            requests.touch(&touched);
            assert!(schedule::decide_with(black_box(&state), &mut live, 2_000_000, &config, &mut requests).is_empty());
            1
        });
        // A round after one worker's heartbeat (its snapshot put into the index, as the router
        // does with each one it receives): nothing else changed.
        let mut beat = 0;
        let heartbeat = rate(round_budget, || {
            let mut snapshot = workers[beat % workers.len()].clone();
            beat += 1;
            snapshot.idle_since_ms = Some(beat as u64);
            live.put(&snapshot);
            assert!(schedule::decide_with(black_box(&state), &mut live, 2_000_000, &config, &mut requests).is_empty());
            1
        });
        let candidates: Vec<Candidate<'_>> = workers
            .iter()
            .map(|w| Candidate { snapshot: w, batch_in_use: 0, service_in_use: 0, cordoned: false, draining: false })
            .collect();
        let index = FleetIndex::new(&candidates);
        let busy_requests: Vec<_> = state
            .running_workflows()
            .flat_map(|wf| wf.tasks.iter())
            .map(|t| request_for(&t.def.task_type, &t.def.spec, None).unwrap())
            .collect();
        let mut k = 0;
        let walks = rate(budget, || {
            let req = &busy_requests[k % busy_requests.len()];
            k += 1;
            black_box(index.place_explained(req, "s", "wf-1-s", STRATEGY, &avoid, 2_000_000));
            1
        });
        let per_task = 1e6 / rounds / waiting as f64;
        let walk = 1e6 / walks;
        println!(
            "| {n} | {waiting} | {rounds:.1} | {per_task:.2} | {walk:.2} | {:.3}x | {partial:.0} | {heartbeat:.0} |",
            per_task / walk
        );
    }

    println!("\n## reading events, one core: `Event::read`'s decoding against serde's derived one");
    println!("| event | bytes | from_json/s | derived/s (baseline) | ratio |");
    println!("|---|---|---|---|---|");
    for (name, event) in hot_events(&typical) {
        let json = serde_json::to_vec(&event).unwrap();
        assert_eq!(Event::from_json(&json).as_ref(), Ok(&event));
        let fast = rate(budget, || {
            black_box(Event::from_json(black_box(&json)).is_ok());
            1
        });
        let derived = rate(budget, || {
            black_box(serde_json::from_slice::<Event>(black_box(&json)).is_ok());
            1
        });
        println!("| {name} | {} | {fast:.0} | {derived:.0} | {:.2}x the time |", json.len(), derived / fast);
        // The same event with its type last, where the reading needs two passes: the envelope's
        // and the body's.
        let type_last = type_last(&json);
        assert_eq!(Event::from_json(&type_last).as_ref(), Ok(&event));
        let (one_pass, two_passes) = rates_interleaved(
            budget,
            || black_box(Event::from_json(black_box(&json)).is_ok()),
            || black_box(Event::from_json(black_box(&type_last)).is_ok()),
        );
        println!(
            "| {name}, in one pass (the writers' order; baseline: its type last, two passes; interleaved) | {} | {one_pass:.0} | {two_passes:.0} | {:.2}x the time |",
            json.len(),
            two_passes / one_pass
        );
        if let EventBody::TaskDispatched(_) = &event.body {
            // The router's fold reads its dispatches back without their orders.
            let suffix = event.subject_suffix(flowmesh_domain::event::Author::Service);
            assert!(Event::read_skipping_orders(&suffix, &json).is_ok());
            let skipping = rate(budget, || {
                black_box(Event::read_skipping_orders(&suffix, black_box(&json)).is_ok());
                1
            });
            let whole = rate(budget, || {
                black_box(Event::read(&suffix, black_box(&json)).is_ok());
                1
            });
            println!(
                "| {name}, read skipping the order (the fold's `read_skipping_orders`; baseline `read`) | {} | {skipping:.0} | {whole:.0} | {:.2}x the time |",
                json.len(),
                whole / skipping
            );
        }
    }
}

/// `json`, an event as a writer writes it (`id`, `time`, `type`, then the body), with its `type`
/// moved to the end.
fn type_last(json: &[u8]) -> Vec<u8> {
    let text = std::str::from_utf8(json).unwrap();
    let start = text.find(r#","type":"#).unwrap();
    let end = start + 1 + text[start + 1..].find(',').unwrap();
    let (kind, body) = (&text[start + 1..end], &text[end + 1..text.len() - 1]);
    format!("{},{body},{kind}}}", &text[..start]).into_bytes()
}

/// The events every echo task puts on the log, as the router and the workers read them: the
/// verdict (carrying `document`'s workflow), the dispatch with its work order, the completion.
fn hot_events(document: &[u8]) -> Vec<(&'static str, Event)> {
    let workflow = validate_submission(document, "wf-1").unwrap();
    let accepted = EventBody::SubmissionAccepted(SubmissionAccepted {
        workflow_id: "wf-1".into(),
        submission: SubmissionRef { stream: "S".into(), seq: 1, msg_id: None, validated_by: Some("v-1".into()) },
        task_ids: workflow.tasks.iter().map(|t| t.task_id.clone()).collect(),
        workflow,
    });
    let mut state = State::default();
    let accepted = Event::new(accepted, "2026-11-25T00:00:00Z".into(), 0);
    state.apply(&accepted);
    let mut worker = fleet(1, &mut Rng(3)).remove(0);
    worker.supported_task_types = TYPES.iter().map(|t| (*t).to_owned()).collect();
    worker.hardware.gpus = (0..8)
        .map(|g| Gpu { index: g, uuid: format!("GPU-{g}"), name: "H100".into(), memory_bytes: 80 << 30 })
        .collect();
    worker.slots.batch.total = 8;
    let config = schedule::Config { no_worker_grace_ms: u64::MAX, strategy: STRATEGY, ..Default::default() };
    let mut live = FleetIndex::of(&[worker]);
    let actions = schedule::decide_with(&state, &mut live, 1, &config, &mut schedule::Requests::default());
    let Some(Action::Dispatch { mut event, order }) =
        actions.into_iter().find(|a| matches!(a, Action::Dispatch { .. }))
    else {
        panic!("the first stage is dispatched");
    };
    let completed = EventBody::TaskCompleted(flowmesh_domain::event::TaskCompleted {
        task: event.task.clone(),
        worker_id: event.worker_id.clone(),
        result: Some(json!({"echo": "hello", "stage": event.task.stage})),
        result_object: None,
        artifacts: Vec::new(),
        upload_ms: None,
        started_at: Some("2026-11-25T00:00:00.001Z".into()),
    });
    event.order = Some(Box::new(order));
    vec![
        ("submission.accepted", accepted),
        (
            "task.dispatched with its order",
            Event::new(EventBody::TaskDispatched(event), "2026-11-25T00:00:00Z".into(), 0),
        ),
        ("task.completed, result inline", Event::new(completed, "2026-11-25T00:00:00Z".into(), 0)),
    ]
}
