//! Placement as tables: which workers fit, why the others do not, and who wins.

use flowmesh_domain::fleet::{ExecutorInfo, SshLimits, WorkerSnapshot};
use flowmesh_domain::placement::{Candidate, Exclusion, Placement, Strategy, explain, place, request_for};
use serde_json::{Value, json};
use std::collections::BTreeSet;

mod common;

use common::{GIB, worker};

fn gb10(id: &str, shared_gib: u64) -> WorkerSnapshot {
    let mut w = worker(id, &["inference"], 20, shared_gib, &[("NVIDIA GB10", 0)]);
    w.hardware.unified_memory = true;
    w.hardware.shared_memory_bytes = shared_gib * GIB;
    w
}

fn candidate(w: &WorkerSnapshot) -> Candidate<'_> {
    Candidate { snapshot: w, batch_in_use: 0, service_in_use: 0, cordoned: false, draining: false }
}

fn spec(hardware: Value) -> Value {
    json!({ "resources": { "hardware": hardware } })
}

/// One row: a task type and hardware request against one worker, and whether it fits.
fn check(task_type: &str, hardware: Value, w: &WorkerSnapshot, fits: bool) {
    let request = request_for(task_type, &spec(hardware.clone()), None).expect("request parses");
    let exclusions = explain(&request, &candidate(w));
    assert_eq!(exclusions.is_empty(), fits, "{task_type} {hardware} on {}: {exclusions:?}", w.id);
}

#[test]
fn gpu_hardware_table() {
    let four_a100 = worker("a100x4", &["sft"], 64, 512, &[("NVIDIA A100-SXM4-80GB", 80); 4]);
    let one_a100 = worker("a100x1", &["sft"], 64, 512, &[("NVIDIA A100-SXM4-80GB", 80)]);
    let t4 = worker("t4", &["sft"], 16, 64, &[("Tesla T4", 16)]);
    check("sft", json!({"gpu": {"count": 2}}), &four_a100, true);
    check("sft", json!({"gpu": {"count": 4}}), &one_a100, false);
    check("sft", json!({"gpu": {"count": 1, "memory": "40GB"}}), &one_a100, true);
    check("sft", json!({"gpu": {"count": 1, "memory": "40GB"}}), &t4, false);
    check("sft", json!({"gpu": {"count": 1, "type": "A100"}}), &one_a100, true);
    check("sft", json!({"gpu": {"count": 1, "type": "a100"}}), &one_a100, true);
    check("sft", json!({"gpu": {"count": 1, "type": "T4"}}), &one_a100, false);
    check("sft", json!({"gpu": {"count": 1, "type": "T4"}}), &t4, true);
    for wildcard in ["any", "auto", "*", ""] {
        check("sft", json!({"gpu": {"count": 1, "type": wildcard}}), &t4, true);
    }
    check("sft", json!({"gpu": {"count": 1}}), &worker("cpu", &["sft"], 64, 512, &[]), false);
    check("sft", json!({"gpu": {"count": 0}}), &worker("cpu", &["sft"], 64, 512, &[]), true);
}

#[test]
fn unified_memory_uses_the_shared_pool() {
    check("inference", json!({"gpu": {"count": 1, "memory": "64Gi"}}), &gb10("gb10-128", 128), true);
    check("inference", json!({"gpu": {"count": 1, "memory": "64Gi"}}), &gb10("gb10-32", 32), false);
}

#[test]
fn cpu_memory_and_ssh_caps() {
    let mut capped = worker("capped", &["ssh", "python"], 16, 64, &[]);
    capped.ssh_limits = Some(SshLimits { max_cpu: Some(4.0), max_memory_bytes: Some(8 * GIB), max_pids: None });
    check("ssh", json!({"cpu": 8}), &capped, false);
    check("python", json!({"cpu": 8}), &capped, true);
    check("ssh", json!({"cpu": "4"}), &capped, true);
    check("ssh", json!({"memory": "16Gi"}), &capped, false);
    check("python", json!({"memory": "16Gi"}), &capped, true);
    check("python", json!({"cpu": 32}), &capped, false);
    check("python", json!({"memory": "128Gi"}), &capped, false);
}

#[test]
fn a_worker_that_serves_nothing_is_never_chosen() {
    let empty = worker("empty", &[], 128, 1024, &[("NVIDIA H100", 80); 8]);
    check("echo", json!({}), &empty, false);
    let request = request_for("echo", &json!({}), None).unwrap();
    let placed = place(&request, "s", "t", &[candidate(&empty)], Strategy::BestFit, &BTreeSet::new(), 0);
    assert!(matches!(placed, Placement::Pending(ref e) if e.capable == 0), "{placed:?}");
}

#[test]
fn slots_cordons_and_drains_are_transient() {
    let w = worker("w", &["echo"], 4, 8, &[]);
    let request = request_for("echo", &json!({}), None).unwrap();
    let busy = Candidate { batch_in_use: 2, ..candidate(&w) };
    assert_eq!(explain(&request, &busy), vec![Exclusion::NoFreeSlot { service: false }]);
    let cordoned = Candidate { cordoned: true, ..candidate(&w) };
    assert_eq!(explain(&request, &cordoned), vec![Exclusion::Cordoned]);
    let placed = place(&request, "s", "t", &[busy], Strategy::BestFit, &BTreeSet::new(), 0);
    match placed {
        Placement::Pending(e) => assert_eq!(
            (e.capable, e.message.as_str()),
            (1, "0/1 workers can run stage \"s\": 1 has no free batch slot")
        ),
        other => panic!("{other:?}"),
    }
}

/// A worker that queues (`prefetch`) takes a task into its queue only when no eligible worker has
/// a free slot, under every strategy; services never queue; a full queue waits like a full slot.
#[test]
fn a_queue_takes_work_only_when_no_slot_is_free() {
    use flowmesh_domain::placement::FleetIndex;
    let mut queues = worker("a-queues", &["echo", "serve"], 64, 512, &[("NVIDIA H100", 80)]);
    queues.slots.batch.total = 1;
    queues.prefetch = 1;
    let mut plain = worker("b-plain", &["echo", "serve"], 4, 8, &[]);
    plain.slots.batch.total = 1;
    let echo = request_for("echo", &json!({}), None).unwrap();
    let serve = request_for("serve", &json!({}), None).unwrap();
    let none = BTreeSet::new();
    let at = |q: u32, p: u32, services: u32| {
        [
            Candidate { batch_in_use: q, service_in_use: services, ..candidate(&queues) },
            Candidate { batch_in_use: p, service_in_use: services, ..candidate(&plain) },
        ]
    };
    let pick = |fleet: &[Candidate<'_>], request, strategy| match place(request, "s", "t", fleet, strategy, &none, 0) {
        Placement::Chosen { worker_id, explanation, .. } => Ok((worker_id, explanation.map(|e| e.message))),
        Placement::Pending(e) => Err(e.message),
    };
    for strategy in [Strategy::BestFit, Strategy::FirstFit, Strategy::MinSatisfying] {
        // The queueing worker ranks first by id and by throughput; its slot busy, the free one wins.
        let (id, _) = pick(&at(1, 0, 0), &echo, strategy).unwrap();
        assert_eq!(id, "b-plain", "{strategy:?}: a free slot beats a queue");
        let (id, message) = pick(&at(1, 1, 0), &echo, strategy).unwrap();
        assert_eq!(id, "a-queues", "{strategy:?}: every slot busy, the queue takes it");
        assert_eq!(
            message.as_deref(),
            Some(
                "0/2 workers can run stage \"s\": 2 have no free batch slot; queued on a-queues until one of its slots frees"
            ),
        );
        assert_eq!(
            pick(&at(2, 1, 0), &echo, strategy),
            Err("0/2 workers can run stage \"s\": 2 have no free batch slot".to_owned()),
            "{strategy:?}: a full queue waits"
        );
        assert_eq!(
            pick(&at(0, 0, 1), &serve, strategy),
            Err("0/2 workers can run stage \"s\": 2 have no free service slot".to_owned()),
            "{strategy:?}: a service never queues"
        );
    }
    // The index's lookups count a free queue place as room.
    let index = FleetIndex::new(&at(1, 1, 0));
    assert!(!index.full("echo") && !index.saturated(true, false));
    let index = FleetIndex::new(&at(2, 1, 1));
    assert!(index.full("echo") && index.full("serve") && index.saturated(true, true));
}

#[test]
fn explanation_counts_per_reason() {
    let cpu1 = worker("cpu-1", &["echo", "python"], 8, 32, &[]);
    let cpu2 = worker("cpu-2", &["echo"], 8, 32, &[]);
    let t4 = worker("t4", &["ppo"], 8, 32, &[("Tesla T4", 16)]);
    let request =
        request_for("ppo", &spec(json!({"gpu": {"count": 1, "type": "H100", "memory": "40GB"}})), None).unwrap();
    let fleet = [candidate(&cpu1), candidate(&cpu2), candidate(&t4)];
    match place(&request, "train", "wf-1-train", &fleet, Strategy::BestFit, &BTreeSet::new(), 0) {
        Placement::Pending(e) => {
            assert_eq!(
                e.message,
                "0/3 workers can run stage \"train\": 2 do not serve task type \"ppo\", 1 has 0 of 1 GPUs matching H100 >= 40 GiB"
            );
            assert_eq!(e.capable, 0);
            assert_eq!(
                e.reasons.iter().map(|r| (r.code.as_str(), r.count)).collect::<Vec<_>>(),
                [("task_type", 2), ("gpu", 1)]
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn selected_worker_restricts_the_choice() {
    let a = worker("a", &["echo"], 8, 32, &[]);
    let b = worker("b", &["echo"], 64, 256, &[]);
    let request = request_for("echo", &json!({}), Some(vec!["a".to_owned()])).unwrap();
    match place(&request, "s", "t", &[candidate(&a), candidate(&b)], Strategy::BestFit, &BTreeSet::new(), 0) {
        Placement::Chosen { worker_id, .. } => assert_eq!(worker_id, "a"),
        other => panic!("{other:?}"),
    }
}

fn chosen(strategy: Strategy, fleet: &[WorkerSnapshot], task_type: &str, task_id: &str) -> String {
    let request = request_for(task_type, &json!({}), None).unwrap();
    let candidates: Vec<Candidate<'_>> = fleet.iter().map(candidate).collect();
    match place(&request, "s", task_id, &candidates, strategy, &BTreeSet::new(), 10_000_000) {
        Placement::Chosen { worker_id, .. } => worker_id,
        other => panic!("{other:?}"),
    }
}

#[test]
fn strategies_pick_as_documented() {
    let small = worker("small", &["sft", "echo"], 8, 32, &[]);
    let mut big = worker("big", &["sft", "echo"], 64, 512, &[("NVIDIA H100", 80); 8]);
    big.cost_per_hour = 30.0;
    let mut mid = worker("mid", &["sft", "echo"], 32, 128, &[("NVIDIA L4", 24)]);
    mid.cost_per_hour = 3.0;
    let fleet = [small.clone(), big.clone(), mid.clone()];
    // first_fit: the first eligible by id.
    assert_eq!(chosen(Strategy::FirstFit, &fleet, "sft", "t"), "big");
    // min_satisfying: the smallest worker that fits.
    assert_eq!(chosen(Strategy::MinSatisfying, &fleet, "sft", "t"), "small");
    // best_fit, training (λ = 0.8): throughput dominates cost → the big GPU box.
    assert_eq!(chosen(Strategy::BestFit, &fleet, "sft", "t"), "big");
    // best_fit, other types (λ = 0.5), score = λ·T̂ − (1−λ)·Ĉ with min-max normalised throughput T
    // (small 20, mid 204, big 1728) and cost C (1, 3, 30): small 0, big 0, mid 0.054 − 0.034 > 0.
    assert_eq!(chosen(Strategy::BestFit, &fleet, "echo", "t"), "mid", "best value wins when throughput counts half");
}

#[test]
fn ties_break_deterministically() {
    let fleet: Vec<WorkerSnapshot> = ["w-a", "w-b", "w-c"].iter().map(|id| worker(id, &["echo"], 8, 32, &[])).collect();
    let mut reversed = fleet.clone();
    reversed.reverse();
    for task in ["t1", "t2", "t3", "t4"] {
        let a = chosen(Strategy::BestFit, &fleet, "echo", task);
        assert_eq!(a, chosen(Strategy::BestFit, &fleet, "echo", task), "same inputs, same choice");
        assert_eq!(a, chosen(Strategy::BestFit, &reversed, "echo", task), "fleet order does not matter");
    }
    assert_eq!(chosen(Strategy::FirstFit, &reversed, "echo", "t"), "w-a");
    // Longest idle wins among otherwise equal workers under min_satisfying.
    let mut idle = fleet.clone();
    idle[2].idle_since_ms = Some(0);
    assert_eq!(chosen(Strategy::MinSatisfying, &idle, "echo", "t"), "w-c");
}

#[test]
fn failed_workers_are_avoided_while_others_exist() {
    let a = worker("a", &["echo"], 8, 32, &[]);
    let b = worker("b", &["echo"], 8, 32, &[]);
    let request = request_for("echo", &json!({}), None).unwrap();
    let avoid: BTreeSet<String> = ["a".to_owned()].into();
    for task in ["t1", "t2", "t3"] {
        match place(&request, "s", task, &[candidate(&a), candidate(&b)], Strategy::BestFit, &avoid, 0) {
            Placement::Chosen { worker_id, .. } => assert_eq!(worker_id, "b"),
            other => panic!("{other:?}"),
        }
    }
    match place(&request, "s", "t", &[candidate(&a)], Strategy::BestFit, &avoid, 0) {
        Placement::Chosen { worker_id, .. } => assert_eq!(worker_id, "a", "a failed worker is still better than none"),
        other => panic!("{other:?}"),
    }
}

/// A small random fleet for the property tests below.
fn random_fleet(next: &mut impl FnMut(u64) -> u64, types: &[&str]) -> Vec<WorkerSnapshot> {
    (0..(1 + next(40)))
        .map(|i| {
            let serves: Vec<&str> = types.iter().copied().filter(|_| next(3) > 0).collect();
            let gpus: Vec<(&str, u64)> = (0..next(3))
                .map(|_| (["NVIDIA H100", "NVIDIA A100", "Tesla T4"][next(3) as usize], [16, 40, 80][next(3) as usize]))
                .collect();
            let mut w = worker(
                &format!("w{i:02}"),
                &serves,
                [4, 8, 32][next(3) as usize] as u32,
                [8, 64, 256][next(3) as usize],
                &gpus,
            );
            w.cost_per_hour = 1.0 + next(5) as f64;
            w.idle_since_ms = (next(2) == 0).then(|| next(7_200_000));
            w.tags = ["pool-a", "spot"].iter().filter(|_| next(2) == 0).map(|t| t.to_string()).collect();
            w.prefetch = [0, 0, 1, 2][next(4) as usize];
            if serves.contains(&"inference") {
                let backends: &[&[&str]] = &[&[], &["transformers"], &["vllm"], &["transformers", "vllm"]];
                w.executors = vec![inference_executor("runner", backends[next(4) as usize])];
            }
            w
        })
        .collect()
}

/// One of a few request shapes, so that alike requests come up often.
fn random_request(next: &mut impl FnMut(u64) -> u64, task_type: &str) -> flowmesh_domain::placement::Request {
    let hw = match next(3) {
        0 => json!({}),
        1 => json!({"cpu": 8, "memory": "32Gi"}),
        _ => json!({"gpu": {"count": 1 + next(2), "memory": "20GB"}}),
    };
    let mut spec = spec(hw);
    spec["workerTags"] = [json!([]), json!(["pool-a"]), json!(["!spot"])][next(3) as usize].clone();
    match next(3) {
        0 => {}
        1 => spec["enforce_cpu"] = json!(true),
        _ => spec["model"] = json!({"vllm": {}}),
    }
    request_for(task_type, &spec, None).unwrap()
}

/// The fleet with random slot use (below `in_use_below`) and one worker in ten cordoned.
fn random_candidates<'a>(
    fleet: &'a [WorkerSnapshot],
    next: &mut impl FnMut(u64) -> u64,
    in_use_below: u64,
) -> Vec<Candidate<'a>> {
    fleet
        .iter()
        .map(|w| Candidate {
            snapshot: w,
            batch_in_use: next(in_use_below) as u32,
            service_in_use: 0,
            cordoned: next(10) == 0,
            draining: next(20) == 0,
        })
        .collect()
}

fn xorshift(mut seed: u64) -> impl FnMut(u64) -> u64 {
    move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    }
}

/// The fast walk (best static score first, stopping early) and the full walk always agree.
#[test]
fn the_fast_placement_picks_what_the_full_one_picks() {
    use flowmesh_domain::placement::FleetIndex;
    let mut next = xorshift(0x2545F4914F6CDD1D);
    let types = ["echo", "sft", "inference", "ssh"];
    let mut queued_picks = 0;
    for round in 0..200 {
        let fleet = random_fleet(&mut next, &types);
        let mut candidates = random_candidates(&fleet, &mut next, 3);
        if round % 3 == 0 {
            // A fleet with every batch slot busy, some queues with room: where queues are chosen.
            for c in &mut candidates {
                c.batch_in_use = c.snapshot.slots.batch.total + next(2) as u32;
            }
        }
        let index = FleetIndex::new(&candidates);
        let avoid: BTreeSet<String> = fleet.iter().filter(|_| next(8) == 0).map(|w| w.id.clone()).collect();
        for strategy in [Strategy::BestFit, Strategy::FirstFit, Strategy::MinSatisfying] {
            for t in types {
                let request = random_request(&mut next, t);
                let task = format!("wf-{round}-{t}");
                let fast = index.place(&request, "s", &task, strategy, &avoid, 7_200_000);
                let full = index.place_explained(&request, "s", &task, strategy, &avoid, 7_200_000);
                let pick = |p: &Placement| match p {
                    Placement::Chosen { worker_id, queued, .. } => Some((worker_id.clone(), *queued)),
                    Placement::Pending(_) => None,
                };
                assert_eq!(pick(&fast), pick(&full), "round {round}, {strategy:?}, {t}");
                queued_picks += usize::from(pick(&fast).is_some_and(|(_, queued)| queued));
            }
        }
    }
    assert!(queued_picks > 200, "only {queued_picks} placements went to a queue");
}

/// Alike waiting tasks reuse the first one's explanation (one walk for a backlog). What they get
/// stays exactly what a fresh walk of the fleet says, while the round places other tasks.
#[test]
fn a_remembered_explanation_is_what_a_fresh_walk_says() {
    use flowmesh_domain::fleet::uses_service_slot;
    use flowmesh_domain::placement::FleetIndex;
    let mut next = xorshift(0x9E3779B97F4A7C15);
    let types = ["echo", "sft", "inference"];
    let none = BTreeSet::new();
    let (mut waited, mut remembered) = (0, 0);
    for round in 0..150 {
        let fleet = random_fleet(&mut next, &types);
        let mut candidates = random_candidates(&fleet, &mut next, 2);
        let mut index = FleetIndex::new(&candidates);
        let mut seen = Vec::new();
        for step in 0..40 {
            let task_type = types[next(3) as usize];
            let request = random_request(&mut next, task_type);
            let (stage, task) = (format!("s{step}"), format!("wf-{round}-s{step}"));
            let placed = index.place(&request, &stage, &task, Strategy::BestFit, &none, 7_200_000);
            let fresh = FleetIndex::new(&candidates).place_explained(
                &request,
                &stage,
                &task,
                Strategy::BestFit,
                &none,
                7_200_000,
            );
            match (placed, fresh) {
                (Placement::Chosen { worker_id, .. }, Placement::Chosen { .. }) => {
                    let service = uses_service_slot(&request.task_type);
                    index.occupy(&worker_id, service);
                    let c = candidates.iter_mut().find(|c| c.snapshot.id == worker_id).unwrap();
                    if service { c.service_in_use += 1 } else { c.batch_in_use += 1 }
                }
                (Placement::Pending(got), Placement::Pending(want)) => {
                    assert_eq!(got, want, "round {round}, step {step}");
                    waited += 1;
                    remembered += usize::from(seen.contains(&request));
                    seen.push(request);
                }
                (got, want) => panic!("round {round}, step {step}: {got:?} but a fresh walk says {want:?}"),
            }
        }
    }
    // The property is only worth something if the memory was used, many times.
    assert!(remembered > 100 && waited > remembered, "{remembered} remembered of {waited} waits");
}

/// An index kept between rounds (snapshots put as they change, workers removed and coming back,
/// slots in use and cordons set) answers every question exactly as an index built afresh from
/// the same fleet: where each request goes and why it waits, whether a type is full, whether the
/// fleet is saturated, and the fleet's signature.
#[test]
fn an_index_kept_between_rounds_answers_as_one_built_afresh() {
    use flowmesh_domain::fleet::WorkerStatus;
    use flowmesh_domain::placement::FleetIndex;
    let mut next = xorshift(0xD1B54A32D192ED03);
    let types = ["echo", "sft", "inference", "serve"];
    let none = BTreeSet::new();
    let (mut rebuilt, mut kept) = (0, 0);
    for run in 0..20 {
        let mut fleet = random_fleet(&mut next, &types);
        let mut away: Vec<WorkerSnapshot> = Vec::new();
        // (batch, service) in use, cordoned, draining: by worker id.
        let mut usage: std::collections::BTreeMap<String, (u32, u32)> = Default::default();
        let (mut cordoned, mut draining) = (BTreeSet::new(), BTreeSet::new());
        let mut index = FleetIndex::of(&fleet);
        for step in 0..150 {
            let i = next(fleet.len().max(1) as u64) as usize;
            match next(8) {
                // A heartbeat: status, idle time, slot totals, warm models.
                0 | 1 if !fleet.is_empty() => {
                    let w = &mut fleet[i];
                    match next(5) {
                        0 => {
                            w.status =
                                [WorkerStatus::Idle, WorkerStatus::Busy, WorkerStatus::Draining][next(3) as usize]
                        }
                        1 => w.slots.batch.total = next(4) as u32,
                        2 => w.slots.service.total = next(2) as u32,
                        3 => w.prefetch = next(3) as u32,
                        _ => w.idle_since_ms = Some(next(7_200_000)),
                    }
                    index.put(&fleet[i]);
                }
                // A new incarnation with other hardware, types or cost.
                2 if !fleet.is_empty() => {
                    let w = &mut fleet[i];
                    match next(3) {
                        0 => w.hardware.cpu_cores = [4, 8, 32][next(3) as usize],
                        1 => {
                            w.supported_task_types =
                                types.iter().filter(|_| next(2) == 0).map(|t| t.to_string()).collect()
                        }
                        _ => w.cost_per_hour = 1.0 + next(5) as f64,
                    }
                    w.started_at = format!("restart-{step}");
                    index.put(&fleet[i]);
                }
                3 if !fleet.is_empty() => {
                    let w = fleet.remove(i);
                    index.remove(&w.id);
                    away.push(w);
                }
                4 if !away.is_empty() => {
                    // Back with the slots the router counts for it (as `decide_with` sets them).
                    let w = away.swap_remove(next(away.len() as u64) as usize);
                    index.put(&w);
                    let (b, s) = usage.get(&w.id).copied().unwrap_or_default();
                    index.set_usage(&w.id, b, s);
                    fleet.push(w);
                }
                5 if !fleet.is_empty() => {
                    let id = fleet[i].id.clone();
                    usage.insert(id.clone(), (next(4) as u32, next(2) as u32));
                    let (b, s) = usage[&id];
                    index.set_usage(&id, b, s);
                }
                6 if !fleet.is_empty() => {
                    let id = fleet[i].id.clone();
                    for set in [&mut cordoned, &mut draining] {
                        if next(3) == 0 && !set.remove(&id) {
                            set.insert(id.clone());
                        }
                    }
                    index.set_flags(&cordoned, &draining);
                }
                _ => {}
            }
            if index.prepare() {
                // A rebuilt index gets the cordons again (as `decide_with` does): a worker back
                // in the fleet may be cordoned.
                index.set_flags(&cordoned, &draining);
                rebuilt += 1;
            } else {
                kept += 1;
            }
            fleet.sort_by(|a, b| a.id.cmp(&b.id));
            let candidates: Vec<Candidate<'_>> = fleet
                .iter()
                .map(|w| {
                    let (batch_in_use, service_in_use) = usage.get(&w.id).copied().unwrap_or_default();
                    Candidate {
                        snapshot: w,
                        batch_in_use,
                        service_in_use,
                        cordoned: cordoned.contains(&w.id),
                        draining: draining.contains(&w.id),
                    }
                })
                .collect();
            let fresh = FleetIndex::new(&candidates);
            let at = format!("run {run}, step {step}");
            assert_eq!(index.signature(), fresh.signature(), "{at}: signature");
            for (batch, service) in [(true, false), (false, true), (true, true)] {
                assert_eq!(index.saturated(batch, service), fresh.saturated(batch, service), "{at}: saturated");
            }
            for t in types {
                assert_eq!(index.full(t), fresh.full(t), "{at}: {t} full");
                let request = random_request(&mut next, t);
                let task = format!("wf-{run}-{step}");
                for strategy in [Strategy::BestFit, Strategy::MinSatisfying] {
                    let got = index.place(&request, "s", &task, strategy, &none, 7_200_000);
                    let want = fresh.place(&request, "s", &task, strategy, &none, 7_200_000);
                    assert_eq!(got, want, "{at}: {t} {strategy:?}");
                }
            }
        }
    }
    // Both paths ran many times: changes taken in place, and rebuilds.
    assert!(kept > 1000 && rebuilt > 300, "{kept} kept, {rebuilt} rebuilt");
}

#[test]
fn worker_tags_select_and_are_explained_like_any_other_reason() {
    let tagged = |id: &str, tags: &[&str]| {
        let mut w = worker(id, &["echo"], 4, 8, &[]);
        w.tags = tags.iter().map(|t| t.to_string()).collect();
        w
    };
    let pool_a = tagged("a", &["pool-a", "zone=eu"]);
    let pool_a_spot = tagged("b", &["pool-a", "spot"]);
    let untagged = tagged("c", &[]);
    // (selector, worker, fits)
    let table: [(&[&str], &WorkerSnapshot, bool); 8] = [
        (&[], &untagged, true),
        (&["pool-a"], &pool_a, true),
        (&["pool-a"], &untagged, false),
        (&["pool-a", "zone=eu"], &pool_a, true),
        (&["pool-a", "zone=eu"], &pool_a_spot, false),
        (&["!spot"], &pool_a_spot, false),
        (&["!spot"], &untagged, true),
        (&["pool-a", "!spot"], &pool_a, true),
    ];
    for (selector, w, fits) in table {
        let request = request_for("echo", &json!({ "workerTags": selector }), None).unwrap();
        let exclusions = explain(&request, &candidate(w));
        assert_eq!(exclusions.is_empty(), fits, "{selector:?} on {}: {exclusions:?}", w.id);
        if !fits {
            assert_eq!(exclusions, vec![Exclusion::Tags]);
            assert!(Exclusion::Tags.is_permanent(), "tags do not change while a worker lives");
        }
    }
    let request = request_for("echo", &json!({ "workerTags": ["pool-a", "!spot"] }), None).unwrap();
    let fleet = [candidate(&pool_a_spot), candidate(&untagged)];
    match place(&request, "s", "t", &fleet, Strategy::BestFit, &BTreeSet::new(), 0) {
        Placement::Pending(e) => assert_eq!(
            (e.capable, e.message.as_str()),
            (0, "0/2 workers can run stage \"s\": 2 do not match workerTags [pool-a, !spot]")
        ),
        other => panic!("{other:?}"),
    }
    let fleet = [candidate(&pool_a_spot), candidate(&pool_a), candidate(&untagged)];
    match place(&request, "s", "t", &fleet, Strategy::BestFit, &BTreeSet::new(), 0) {
        Placement::Chosen { worker_id, .. } => assert_eq!(worker_id, "a"),
        other => panic!("{other:?}"),
    }
    assert!(request_for("echo", &json!({ "workerTags": "pool-a" }), None).is_err());
}

#[test]
fn an_operator_drain_stops_new_work_and_is_transient() {
    let w = worker("w", &["echo"], 4, 8, &[]);
    let request = request_for("echo", &json!({}), None).unwrap();
    let draining = Candidate { draining: true, ..candidate(&w) };
    assert_eq!(explain(&request, &draining), vec![Exclusion::Draining]);
    match place(&request, "s", "t", &[draining], Strategy::BestFit, &BTreeSet::new(), 0) {
        Placement::Pending(e) => {
            assert_eq!((e.capable, e.message.as_str()), (1, "0/1 workers can run stage \"s\": 1 is draining"))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_warm_worker_is_preferred_among_eligible_ones_and_never_over_a_rule() {
    use flowmesh_domain::fleet::{WarmModel, WarmState};
    let warm = |mut w: WorkerSnapshot, state: WarmState| {
        w.warm_models = vec![WarmModel { id: "Qwen/Qwen3-0.6B".into(), size_bytes: 2 * GIB, state }];
        w
    };
    // The cold one is the better fit by throughput and cost; the warm one wins anyway.
    let big_cold = worker("a-big", &["inference"], 64, 512, &[("NVIDIA H100", 80)]);
    let small_warm = warm(worker("b-small", &["inference"], 8, 32, &[("NVIDIA T4", 16)]), WarmState::Cached);
    let cpu_warm = warm(worker("c-cpu", &["inference"], 64, 512, &[]), WarmState::Loaded);
    let spec = json!({"model": {"source": {"type": "huggingface", "identifier": "qwen/qwen3-0.6b"}},
                      "resources": {"hardware": {"gpu": {"count": 1}}}});
    let request = request_for("inference", &spec, None).unwrap();
    assert_eq!(request.model.as_deref(), Some("qwen/qwen3-0.6b"));
    let fleet = [candidate(&big_cold), candidate(&small_warm), candidate(&cpu_warm)];
    let index = flowmesh_domain::placement::FleetIndex::new(&fleet);
    for placed in [
        place(&request, "s", "t", &fleet, Strategy::BestFit, &BTreeSet::new(), 0),
        index.place(&request, "s", "t", Strategy::BestFit, &BTreeSet::new(), 0),
    ] {
        match placed {
            Placement::Chosen { worker_id, explanation, .. } => {
                assert_eq!(worker_id, "b-small", "warm wins among eligible; c-cpu has no GPU however warm");
                let message = explanation.expect("a warm choice is explained").message;
                assert!(message.ends_with("b-small holds Qwen/Qwen3-0.6B warm (cached, 2 GiB)"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }
    // Without the model in the request, or when the warm one failed the task, the best fit wins.
    let plain = request_for("inference", &json!({"resources": {"hardware": {"gpu": {"count": 1}}}}), None).unwrap();
    let chosen = |r: &flowmesh_domain::placement::Request, avoid: &[&str]| match place(
        r,
        "s",
        "t",
        &fleet,
        Strategy::BestFit,
        &avoid.iter().map(|s| s.to_string()).collect(),
        0,
    ) {
        Placement::Chosen { worker_id, .. } => worker_id,
        other => panic!("{other:?}"),
    };
    assert_eq!(chosen(&plain, &[]), "a-big");
    assert_eq!(chosen(&request, &["b-small"]), "a-big", "a worker that failed the task is avoided, warm or not");
    // A busy warm worker: the task goes elsewhere rather than wait for warmth.
    let busy = Candidate { batch_in_use: 2, ..candidate(&small_warm) };
    let fleet = [candidate(&big_cold), busy];
    match place(&request, "s", "t", &fleet, Strategy::BestFit, &BTreeSet::new(), 0) {
        Placement::Chosen { worker_id, .. } => assert_eq!(worker_id, "a-big"),
        other => panic!("{other:?}"),
    }
}

fn inference_executor(name: &str, backends: &[&str]) -> ExecutorInfo {
    ExecutorInfo {
        name: name.to_owned(),
        task_types: vec!["inference".to_owned()],
        backends: backends.iter().map(|b| (*b).to_owned()).collect(),
        unavailable: None,
    }
}

/// An inference worker whose executors serve `backends` (a runner each; `None`: a plugin that
/// declares none), with one H100 when `gpu`.
fn inference_worker(id: &str, executors: &[(&str, &[&str])], gpu: bool) -> WorkerSnapshot {
    let gpus: &[(&str, u64)] = if gpu { &[("NVIDIA H100 80GB HBM3", 80)] } else { &[] };
    let mut w = worker(id, &["echo", "python", "inference"], 16, 64, gpus);
    w.executors = executors.iter().map(|(name, backends)| inference_executor(name, backends)).collect();
    w
}

/// The spec's backend fields choose (the validator's own classifier), and a worker takes an
/// inference task only with an executor for that backend. One row per spec; one column per
/// worker: whether it fits, else its exclusions.
#[test]
fn inference_goes_only_to_workers_that_serve_its_backend() {
    use flowmesh_domain::validate::InferenceBackend::{Transformers, Vllm};
    let cpu_hf = inference_worker("cpu-hf", &[("transformers", &["transformers"])], false);
    let gpu_hf = inference_worker("gpu-hf", &[("transformers", &["transformers"])], true);
    let gpu_both = inference_worker("gpu-both", &[("transformers", &["transformers"]), ("vllm", &["vllm"])], true);
    let gpu_vllm_only = inference_worker("gpu-vllm-only", &[("vllm", &["vllm"])], true);
    let gpu_plugin = inference_worker("gpu-plugin", &[("my-server", &[])], true);
    let legacy = worker("legacy", &["inference"], 16, 64, &[("NVIDIA H100", 80)]);
    let mut no_torch = worker("no-torch", &["echo", "python"], 16, 64, &[("NVIDIA H100", 80)]);
    no_torch.executors = vec![ExecutorInfo {
        name: "transformers".to_owned(),
        task_types: Vec::new(),
        backends: Vec::new(),
        unavailable: Some("serves none of [\"inference\"]: ModuleNotFoundError: No module named 'torch'".to_owned()),
    }];
    let fleet = [&cpu_hf, &gpu_hf, &gpu_both, &gpu_vllm_only, &gpu_plugin, &legacy, &no_torch];
    let gpu = json!({"hardware": {"gpu": {"count": 1}}});
    let vllm = Exclusion::Backend(Vllm);
    let hf = Exclusion::Backend(Transformers);
    let no_gpu = Exclusion::Gpu { matching: 0, need: 1 };
    let ok = || Vec::<Exclusion>::new();
    #[rustfmt::skip]
    let table: Vec<(&str, Value, [Vec<Exclusion>; 7])> = vec![
        // spec                                                    cpu-hf  gpu-hf  gpu-both gpu-vllm-only gpu-plugin legacy  no-torch
        ("auto", json!({}),                                        [ok(), ok(), ok(), ok(), ok(), ok(), vec![Exclusion::TaskType]]),
        ("enforce_cpu", json!({"enforce_cpu": true}),              [ok(), ok(), ok(), vec![hf.clone()], ok(), ok(), vec![Exclusion::TaskType]]),
        ("model.transformers", json!({"model": {"transformers": {}}}), [ok(), ok(), ok(), vec![hf.clone()], ok(), ok(), vec![Exclusion::TaskType]]),
        ("model.vllm", json!({"model": {"vllm": {}}, "resources": gpu}),
            [vec![vllm.clone(), no_gpu.clone()], vec![vllm.clone()], ok(), ok(), ok(), ok(), vec![Exclusion::TaskType]]),
        ("adapters", json!({"model": {"adapters": [{"path": "/a"}]}, "resources": gpu}),
            [vec![vllm.clone(), no_gpu], vec![vllm.clone()], ok(), ok(), ok(), ok(), vec![Exclusion::TaskType]]),
    ];
    for (name, spec, expected) in table {
        let request = request_for("inference", &spec, None).unwrap();
        for (w, want) in fleet.iter().zip(expected) {
            assert_eq!(explain(&request, &candidate(w)), want, "{name} on {}", w.id);
        }
    }
    // Only inference has backends: a training spec that names vLLM is placed by type alone.
    let sft = request_for("sft", &json!({"model": {"vllm": {}}}), None).unwrap();
    assert_eq!(sft.backend, None);
    assert!(Exclusion::Backend(Vllm).is_permanent(), "what initialised does not change while a worker lives");
}

/// The explanation of an unplaceable vLLM task names the backend, counted like any reason, and
/// the task is not waiting for anything (no capable worker: `no_eligible_worker` after the grace).
#[test]
fn a_vllm_task_without_a_vllm_worker_is_explained_by_its_backend() {
    let cpu_hf = inference_worker("cpu-hf", &[("transformers", &["transformers"])], false);
    let gpu_hf = inference_worker("gpu-hf", &[("transformers", &["transformers"])], true);
    let echo = worker("echo-1", &["echo"], 4, 8, &[]);
    let spec = json!({"model": {"vllm": {}}, "resources": {"hardware": {"gpu": {"count": 1}}}});
    let request = request_for("inference", &spec, None).unwrap();
    let fleet = [candidate(&cpu_hf), candidate(&gpu_hf), candidate(&echo)];
    match place(&request, "serve", "wf-1-serve", &fleet, Strategy::BestFit, &BTreeSet::new(), 0) {
        Placement::Pending(e) => {
            assert_eq!(
                e.message,
                "0/3 workers can run stage \"serve\": 1 does not serve task type \"inference\", 2 do not serve the \"vllm\" inference backend (model.vllm or model.adapters select it)"
            );
            assert_eq!(e.capable, 0);
            assert_eq!(
                e.reasons.iter().map(|r| (r.code.as_str(), r.count)).collect::<Vec<_>>(),
                [("task_type", 1), ("backend", 2)]
            );
        }
        other => panic!("{other:?}"),
    }
    // With a vLLM worker in the fleet, it is chosen, by the fast walk and the full one alike,
    // even when a transformers-only worker scores better (more GPUs, cheaper).
    let gpu_vllm = inference_worker("gpu-vllm", &[("vllm", &["vllm"])], true);
    let mut big_hf = inference_worker("big-hf", &[("transformers", &["transformers"])], true);
    big_hf.hardware.gpus.extend(big_hf.hardware.gpus.clone());
    big_hf.cost_per_hour = 0.1;
    let fleet = [candidate(&big_hf), candidate(&gpu_vllm), candidate(&cpu_hf)];
    let index = flowmesh_domain::placement::FleetIndex::new(&fleet);
    for placed in [
        index.place(&request, "serve", "wf-1-serve", Strategy::BestFit, &BTreeSet::new(), 0),
        index.place_explained(&request, "serve", "wf-1-serve", Strategy::BestFit, &BTreeSet::new(), 0),
    ] {
        assert!(matches!(&placed, Placement::Chosen { worker_id, .. } if worker_id == "gpu-vllm"), "{placed:?}");
    }
    let auto = request_for("inference", &json!({"resources": {"hardware": {"gpu": {"count": 1}}}}), None).unwrap();
    assert!(
        matches!(index.place(&auto, "s", "t", Strategy::BestFit, &BTreeSet::new(), 0), Placement::Chosen { worker_id, .. } if worker_id == "big-hf"),
        "an auto-backend task goes to the best worker by score"
    );
}

/// A worker writes its own snapshot, so its numbers are input like any other: at their extremes
/// (none, the type's largest, out of range) they may make a worker useless, never the router
/// panic, and the fast and full walks still agree on every pick.
#[test]
fn snapshots_with_extreme_numbers_place_and_explain_without_panicking() {
    use flowmesh_domain::placement::FleetIndex;
    const FIELDS: &[&str] = &[
        "/slots/batch/total",
        "/slots/batch/in_use",
        "/slots/service/total",
        "/prefetch",
        "/queued",
        "/hardware/cpu_cores",
        "/hardware/memory_bytes",
        "/hardware/shared_memory_bytes",
        "/hardware/gpus/0/memory_bytes",
        "/cost_per_hour",
        "/load",
        "/idle_since_ms",
        "/ttl_sec",
        "/heartbeat_interval_sec",
    ];
    let extremes =
        [json!(0), json!(1), json!(u32::MAX), json!(u64::MAX), json!(-1), json!(1e308), json!(-1e308), json!(0.5)];
    let mut next = xorshift(0x5DEECE66D);
    let types = ["echo", "sft", "inference"];
    let (mut odd, mut refused) = (0, 0);
    for round in 0..300 {
        let mut fleet = random_fleet(&mut next, &types);
        for w in fleet.iter_mut() {
            if next(3) != 0 {
                continue;
            }
            let mut value = serde_json::to_value(&*w).unwrap();
            for _ in 0..=next(3) {
                if let Some(field) = value.pointer_mut(FIELDS[next(FIELDS.len() as u64) as usize]) {
                    *field = extremes[next(extremes.len() as u64) as usize].clone();
                }
            }
            // What does not decode is ignored by the router with a warning: nothing to place.
            match serde_json::from_value::<WorkerSnapshot>(value) {
                Ok(decoded) => {
                    *w = decoded;
                    odd += 1;
                }
                Err(_) => refused += 1,
            }
        }
        let mut candidates = random_candidates(&fleet, &mut next, 3);
        for c in candidates.iter_mut() {
            if next(4) == 0 {
                c.batch_in_use = [u32::MAX, c.snapshot.slots.batch.total][next(2) as usize];
            }
        }
        let mut index = FleetIndex::new(&candidates);
        index.prepare();
        let avoid = BTreeSet::new();
        for strategy in [Strategy::BestFit, Strategy::FirstFit, Strategy::MinSatisfying] {
            for t in types {
                let request = random_request(&mut next, t);
                let now_ms = [0, 7_200_000, u64::MAX][next(3) as usize];
                let fast = index.place(&request, "s", "wf-1-s", strategy, &avoid, now_ms);
                let full = index.place_explained(&request, "s", "wf-1-s", strategy, &avoid, now_ms);
                let pick = |p: &Placement| match p {
                    Placement::Chosen { worker_id, queued, .. } => Some((worker_id.clone(), *queued)),
                    Placement::Pending(_) => None,
                };
                assert_eq!(pick(&fast), pick(&full), "round {round}, {strategy:?}, {t}");
                let _ = (index.full(t), index.saturated(true, true), index.signature());
                if let Some((worker_id, _)) = pick(&fast) {
                    index.occupy(&worker_id, false);
                }
            }
        }
    }
    assert!(odd > 100 && refused > 100, "{odd} odd snapshots placed, {refused} refused");
}

/// A snapshot is believed only under its own worker's key, as an event is only under its own
/// subject: a worker may write only its own key, never another worker's place in the fleet.
#[test]
fn a_snapshot_is_believed_only_under_its_own_worker_s_key() {
    let bytes = serde_json::to_vec(&worker("w1", &["echo"], 4, 8, &[])).unwrap();
    assert_eq!(WorkerSnapshot::read("w1", &bytes).map(|w| w.id), Ok("w1".to_owned()));
    for (key, body, why) in [
        ("w2", bytes.as_slice(), "it names worker \"w1\" under the key of \"w2\""),
        ("w1x", bytes.as_slice(), "it names worker \"w1\" under the key of \"w1x\""),
        ("w1", b"{}".as_slice(), "missing field"),
        ("w1", b"\xff".as_slice(), "expected value"),
    ] {
        let refused = WorkerSnapshot::read(key, body).expect_err(key);
        assert!(refused.contains(why), "{key}: {refused}");
    }
}
