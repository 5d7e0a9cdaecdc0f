//! Deterministic fuzz tests of what comes from outside: submitted documents and the messages of
//! the event log. Seeded, so a failure names its round and reruns the same.
//!
//! Documents (decode + validate): mutated documents always get exactly one verdict — a workflow,
//! or problems that each have a path and a message — and never a panic.
//!
//! Events: `Event::read` is the gate every message of the log passes before anything folds it.
//! Its decoding is hand-made for speed (issue "Throughput"), and debug builds check what it reads
//! against serde's derived decoding and panic where they disagree: so mutated events, near
//! misses of every kind, are also a differential test of the two (half the rounds in the order
//! our writers use, which it reads in one pass, half in sorted order). For every message it must
//! hold that:
//! - nothing panics, whatever the bytes, the subject or the time: neither `read` nor a fold of
//!   what it lets through;
//! - what it believes is what the subject says: the event's workflow and task are the subject's
//!   first two tokens, so a subject filter finds every event a fold counts for a workflow;
//! - what it returns reads back the same when written again on the same subject;
//! - the fold's reading (`read_skipping_orders`) agrees, but for the order it leaves out.

use flowmesh_domain::Event;
use flowmesh_domain::event::{Author, EventBody, Layout, Unreadable};
use flowmesh_domain::state::State;
use flowmesh_domain::validate_submission;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::path::PathBuf;

#[path = "common/rng.rs"]
mod rng;

use rng::Rng;

/// A longer campaign by hand: `FLOWMESH_FUZZ_ROUNDS=100000 FLOWMESH_FUZZ_SEED=7`.
fn setting(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn seed(default: u64) -> u64 {
    setting("FLOWMESH_FUZZ_SEED").unwrap_or(default).max(1)
}

fn rounds(default: u64) -> u64 {
    setting("FLOWMESH_FUZZ_ROUNDS").unwrap_or(default)
}

const FRAGMENTS: &[&str] = &[
    "${",
    "}",
    ": ",
    "\n",
    "- ",
    "&a ",
    "*a",
    "[",
    "]",
    "{",
    "}",
    "\"",
    "'",
    "#",
    "---\n",
    "\t",
    "~",
    "null",
    "1e999",
    "-1",
    "${up.items.0.output}",
    "dependsOn: [x]",
    "taskType: ppo",
    "stages:",
    "graph:",
    "memory: 1.5Gi",
    "\u{0}",
    "é",
];

fn mutate(rng: &mut Rng, doc: &[u8]) -> Vec<u8> {
    let mut out = doc.to_vec();
    for _ in 0..=rng.below(4) {
        let at = rng.below(out.len() + 1);
        match rng.below(5) {
            0 => {
                if !out.is_empty() {
                    let i = rng.below(out.len());
                    out[i] ^= 1 << rng.below(8);
                }
            }
            1 => out.truncate(at),
            2 => {
                let fragment = FRAGMENTS[rng.below(FRAGMENTS.len())].as_bytes();
                out.splice(at..at, fragment.iter().copied());
            }
            3 => {
                let end = (at + rng.below(40)).min(out.len());
                out.drain(at..end);
            }
            _ => {
                // Duplicate a line: duplicate keys, repeated stages.
                let text = String::from_utf8_lossy(&out).into_owned();
                let lines: Vec<&str> = text.lines().collect();
                if !lines.is_empty() {
                    let i = rng.below(lines.len());
                    let mut copy = lines.clone();
                    copy.insert(i, lines[i]);
                    out = copy.join("\n").into_bytes();
                }
            }
        }
    }
    out
}

#[test]
fn mutated_documents_get_one_verdict_and_never_panic() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut seeds = Vec::new();
    for kind in ["valid", "invalid"] {
        for entry in std::fs::read_dir(dir.join(kind)).unwrap() {
            seeds.push(std::fs::read(entry.unwrap().path()).unwrap());
        }
    }
    let mut rng = Rng(seed(0x9E3779B97F4A7C15));
    let (mut accepted, mut rejected) = (0, 0);
    for _ in 0..rounds(4000) {
        let seed = &seeds[rng.below(seeds.len())];
        let body = mutate(&mut rng, seed);
        match validate_submission(&body, "wf-1") {
            Ok(workflow) => {
                assert!(!workflow.tasks.is_empty());
                accepted += 1;
            }
            Err(problems) => {
                assert!(!problems.is_empty(), "a rejection lists at least one problem");
                for p in &problems {
                    assert!(p.path.starts_with('/'), "path {:?}", p.path);
                    assert!(!p.message.trim().is_empty());
                }
                rejected += 1;
            }
        }
    }
    assert!(
        accepted > 0 && rejected > 0,
        "the mutations exercised both outcomes: {accepted} accepted, {rejected} rejected"
    );
}

const TIME: &str = "2026-11-27T10:30:24.843Z";

/// One message of every kind, on the subject (below `flowmesh.events.`) its writer uses, and
/// each again where a log written before the worker-first layout has it.
fn corpus() -> Vec<(String, Value)> {
    let legacy = legacy_corpus();
    let now = legacy.iter().map(|(subject, event)| (worker_first(subject), event.clone()));
    now.collect::<Vec<_>>().into_iter().chain(legacy).collect()
}

/// A legacy subject (`<workflow>.<task>.<noun>.<verb>[.<worker>]`) as it is written now:
/// `<worker|_>.<workflow>.<task>.<noun>.<verb>`.
fn worker_first(legacy: &str) -> String {
    let tokens: Vec<&str> = legacy.split('.').collect();
    match tokens.as_slice() {
        [rest @ .., worker] if tokens.len() == 5 => format!("{worker}.{}", rest.join(".")),
        _ => format!("_.{legacy}"),
    }
}

/// One message of every kind, on the subject its writer used before the worker-first layout.
fn legacy_corpus() -> Vec<(String, Value)> {
    let task = |kind: &str, extra: Value| {
        let mut event = json!({
            "id": format!("wf-1-main.1.{kind}"), "time": TIME, "type": kind,
            "workflow_id": "wf-1", "task_id": "wf-1-main", "stage": "main", "attempt": 1,
        });
        event.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        event
    };
    let spec = json!({
        "taskType": "echo", "data": {"type": "list", "items": ["hello", "from", "flowmesh"]},
        "resources": {"hardware": {"cpu": 1, "memory": "256Mi"}},
    });
    let explanation = json!({
        "workers": 2, "eligible": 0, "capable": 1,
        "reasons": [{"code": "busy", "count": 1, "text": "busy"}, {"code": "task_type", "count": 1, "text": "no echo"}],
        "message": "0/2 workers can run stage \"main\"",
    });
    let fleet = |kind: &str, extra: Value| {
        let mut event = json!({"id": format!("worker.w1.{kind}"), "time": TIME, "type": kind, "worker_id": "w1"});
        event.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        (format!("fleet.w1.{kind}"), event)
    };
    let ended = |kind: &str, reason: Value| {
        let mut event = json!({"id": "wf-1.end", "time": TIME, "type": kind, "workflow_id": "wf-1"});
        if !reason.is_null() {
            event["reason"] = reason;
        }
        (format!("wf-1._.{kind}"), event)
    };
    vec![
        (
            "wf-1._.submission.accepted".into(),
            json!({
                "id": "sub.1.verdict", "time": TIME, "type": "submission.accepted", "workflow_id": "wf-1",
                "submission": {"stream": "FLOWMESH_SUBMISSIONS", "seq": 1, "msg_id": "m-1", "validated_by": "v1"},
                "task_ids": ["wf-1-main"],
                "workflow": {"workflow_id": "wf-1", "name": "echo-demo", "owner": "demo", "tasks": [{
                    "task_id": "wf-1-main", "stage": "main", "task_type": "echo", "depends_on": [],
                    "spec": spec, "max_attempts": 3, "spec_path": "/spec",
                }]},
            }),
        ),
        (
            "wf-2._.submission.rejected".into(),
            json!({
                "id": "sub.2.verdict", "time": TIME, "type": "submission.rejected", "workflow_id": "wf-2",
                "submission": {"stream": "FLOWMESH_SUBMISSIONS", "seq": 2},
                "errors": [{"path": "/spec", "message": "spec is required", "line": 3, "column": 1}],
            }),
        ),
        (
            "wf-1.wf-1-main.task.pending".into(),
            task(
                "task.pending",
                json!({"reason": "busy", "message": "waiting", "explanation": explanation, "unplaceable_since_ms": 17}),
            ),
        ),
        (
            "wf-1.wf-1-main.task.dispatched.w1".into(),
            task(
                "task.dispatched",
                json!({
                    "worker_id": "w1", "task_type": "echo", "message": "main placed on w1",
                    "order": {
                        "workflow_id": "wf-1", "task_id": "wf-1-main", "stage": "main", "attempt": 1,
                        "task_type": "echo", "spec": spec, "upstream": {"up": "wf-1-up"},
                        "upstream_artifacts": {"up": [{"name": "a.txt", "object": "o/a.txt", "size": 3, "digest": "SHA-256=x"}]},
                        "upstream_results": {"up": {"ok": true}},
                    },
                }),
            ),
        ),
        (
            "wf-3.wf-3-main.task.merged".into(),
            json!({
                "id": "wf-3-main.1.merged", "time": TIME, "type": "task.merged", "workflow_id": "wf-3",
                "task_id": "wf-3-main", "stage": "main", "attempt": 1, "into": "wf-1-main",
                "message": "shares wf-1-main's run",
            }),
        ),
        ("wf-1.wf-1-main.task.started.w1".into(), task("task.started", json!({"worker_id": "w1"}))),
        (
            "wf-1.wf-1-main.task.updated.w1".into(),
            task("task.updated", json!({"worker_id": "w1", "message": "epoch 1", "data": {"loss": 0.5}})),
        ),
        (
            "wf-1.wf-1-main.task.completed.w1".into(),
            task(
                "task.completed",
                json!({
                    "worker_id": "w1", "result": {"ok": true, "count": 3}, "artifacts": [], "upload_ms": 0,
                    "started_at": TIME,
                }),
            ),
        ),
        (
            "wf-1.wf-1-main.task.completed.w1".into(),
            task(
                "task.completed",
                json!({
                    "worker_id": "w1", "result": null, "result_object": "wf-1/wf-1-main/1/results.json",
                    "artifacts": [{"name": "model.tar", "object": "wf-1/model.tar", "size": 1024, "digest": "SHA-256=y", "bucket": "b1"}],
                }),
            ),
        ),
        (
            "wf-1.wf-1-main.task.failed.w1".into(),
            task(
                "task.failed",
                json!({"worker_id": "w1", "reason": "executor_error", "message": "exit 1", "retryable": true}),
            ),
        ),
        (
            "wf-1.wf-1-main.task.failed.w1".into(),
            task(
                "task.failed",
                json!({"worker_id": "w1", "reason": "released", "message": "given back unrun", "retryable": true}),
            ),
        ),
        (
            "wf-1.wf-1-main.task.failed".into(),
            task("task.failed", json!({"reason": "worker_lost", "message": "w1 was lost", "retryable": true})),
        ),
        (
            "wf-1.wf-1-main.task.requeued".into(),
            task("task.requeued", json!({"reason": "handed_back_unrun", "worker_id": "w1"})),
        ),
        ("wf-1.wf-1-main.task.skipped".into(), task("task.skipped", json!({"reason": "condition false"}))),
        (
            "wf-1.wf-1-main.task.cancel_requested".into(),
            json!({"id": "wf-1-main.cancel.4", "time": TIME, "type": "task.cancel_requested",
                   "workflow_id": "wf-1", "task_id": "wf-1-main", "reason": "asked"}),
        ),
        (
            "wf-1._.task.cancel_requested".into(),
            json!({"id": "wf-1.cancel.5", "time": TIME, "type": "task.cancel_requested",
                   "workflow_id": "wf-1", "reason": "asked"}),
        ),
        (
            "wf-1.wf-1-main.task.cancelled.w1".into(),
            task("task.cancelled", json!({"worker_id": "w1", "reason": "cancelled while running"})),
        ),
        ("wf-1.wf-1-main.task.cancelled".into(), task("task.cancelled", json!({"reason": "cancelled before it ran"}))),
        ended("workflow.completed", Value::Null),
        ended("workflow.failed", json!("main failed")),
        ended("workflow.cancelled", json!("asked")),
        fleet(
            "worker.joined",
            json!({"started_at": TIME, "supported_task_types": ["echo", "python"], "gpus": 2, "simulated": true}),
        ),
        fleet("worker.lost", json!({"started_at": TIME, "reason": "no heartbeat for 15 s"})),
        fleet("worker.cordoned", json!({})),
        fleet("worker.uncordoned", json!({})),
        fleet("worker.drain_requested", json!({})),
        fleet("worker.prewarm_requested", json!({"model": "tiny-gpt2"})),
        (
            "_._.workflows.purged".into(),
            json!({"id": "purged.7", "time": TIME, "type": "workflows.purged",
                   "workflows": {"ranges": [[1, 5], [9, 9]], "others": ["job-x"]},
                   "removing": {"ranges": [[9, 9]], "others": []}}),
        ),
        (
            // A checkpoint-era record: the ids as a plain list.
            "_._.workflows.purged".into(),
            json!({"id": "purged.2", "time": TIME, "type": "workflows.purged", "workflows": ["wf-1", "wf-2"]}),
        ),
    ]
}

/// Values of every JSON type, and of the shapes that break the usual assumptions.
fn odd_value(rng: &mut Rng) -> Value {
    match rng.below(20) {
        // Long text that is not ASCII: messages that quote it get cut inside a character.
        16 => json!(format!("{}{}", "a".repeat(rng.below(4)), "\u{e9}".repeat(150))),
        // Times that are almost RFC 3339: the fold reads an end's time for retention.
        17 => json!(
            ["2026-11-27T10:30:24\u{e9}1:00", "2026-11-27T10:30:24+\u{e9}:00", "2026-13-01T00:00:00Z"][rng.below(3)]
        ),
        18 => json!("9999-12-31T23:59:60.999+23:59"),
        19 => json!("0000-01-01T00:00:00-23:59"),
        0 => Value::Null,
        1 => json!(true),
        2 => json!(-1),
        3 => json!(4_294_967_296u64),
        4 => json!([u64::MAX, u64::from(u32::MAX)][rng.below(2)]),
        5 => json!(1.5),
        6 => json!(""),
        7 => json!("w1.w2"),
        8 => json!("*"),
        9 => json!(">"),
        10 => json!("_"),
        11 => json!("fleet"),
        12 => json!([]),
        13 => json!({}),
        14 => json!("wf-1"),
        _ => json!("w1"),
    }
}

/// A random path into `value` (object keys and array indexes), at most `depth` deep.
fn pick_path(rng: &mut Rng, value: &Value, depth: usize) -> Vec<Value> {
    let mut path = Vec::new();
    let mut at = value;
    for _ in 0..depth {
        let next = match at {
            Value::Object(map) if !map.is_empty() => {
                let key = map.keys().nth(rng.below(map.len())).unwrap().clone();
                path.push(json!(key));
                &map[&key]
            }
            Value::Array(items) if !items.is_empty() => {
                let i = rng.below(items.len());
                path.push(json!(i));
                &items[i]
            }
            _ => break,
        };
        at = next;
        if rng.below(3) == 0 {
            break;
        }
    }
    path
}

fn at_path<'a>(value: &'a mut Value, path: &[Value]) -> &'a mut Value {
    path.iter().fold(value, |v, step| match step {
        Value::String(key) => &mut v[key.as_str()],
        _ => &mut v[step.as_u64().unwrap() as usize],
    })
}

const KINDS: &[&str] = &[
    "submission.accepted",
    "task.pending",
    "task.dispatched",
    "task.started",
    "task.completed",
    "task.failed",
    "task.cancelled",
    "workflow.completed",
    "worker.joined",
    "workflows.purged",
    "no.such_kind",
];

/// A structural mutation of the event's JSON: a field removed, retyped, renamed to another
/// kind's, its id fields changed, a field added.
fn mutate_json(rng: &mut Rng, event: &mut Value) {
    let path = pick_path(rng, event, 4);
    match rng.below(6) {
        0 if !path.is_empty() => {
            let (last, parent) = path.split_last().unwrap();
            match (at_path(event, parent), last) {
                (Value::Object(map), Value::String(key)) => {
                    map.remove(key);
                }
                (Value::Array(items), step) => {
                    items.remove(step.as_u64().unwrap() as usize);
                }
                _ => {}
            }
        }
        1 => *at_path(event, &path) = odd_value(rng),
        2 => event["type"] = json!(KINDS[rng.below(KINDS.len())]),
        3 => {
            let field =
                ["workflow_id", "task_id", "worker_id", "stage", "attempt", "id", "time", "started_at"][rng.below(8)];
            event[field] = odd_value(rng);
        }
        4 => {
            if let Value::Object(map) = at_path(event, &path) {
                let key = ["extra", "type", "id", "time", "order", "worker_id"][rng.below(6)];
                map.insert(key.into(), odd_value(rng));
            }
        }
        _ => {
            // A deep nest where a value was: the decoders' recursion limits.
            let mut deep = json!(1);
            for _ in 0..rng.below(200) {
                deep = json!([deep]);
            }
            *at_path(event, &path) = deep;
        }
    }
}

/// A mutation of the bytes: what a JSON value cannot say (duplicate keys, bad UTF-8, escapes,
/// truncation, trailing bytes).
fn mutate_bytes(rng: &mut Rng, bytes: &mut Vec<u8>) {
    const FRAGMENTS: &[&str] =
        &["\"type\":\"task.started\",", "\"workflow_id\":\"wf-9\",", "\"id\":1,", ",", "}", "\\u0000", "\u{FFFD}", " "];
    let at = rng.below(bytes.len() + 1);
    match rng.below(5) {
        0 if !bytes.is_empty() => {
            let i = rng.below(bytes.len());
            bytes[i] ^= 1 << rng.below(8);
        }
        1 => bytes.truncate(at),
        2 => {
            // Right after the opening brace, so the key is a duplicate of a field that follows.
            let fragment = FRAGMENTS[rng.below(FRAGMENTS.len())].as_bytes();
            let at = if rng.below(2) == 0 { 1.min(bytes.len()) } else { at };
            bytes.splice(at..at, fragment.iter().copied());
        }
        3 => bytes.extend_from_slice(&[0xff, b'x', b'}'][..rng.below(4)]),
        _ => {
            let end = (at + rng.below(24)).min(bytes.len());
            bytes.drain(at..end);
        }
    }
}

/// A mutation of the subject: a token changed, dropped or added.
fn mutate_subject(rng: &mut Rng, subject: &str) -> String {
    let mut tokens: Vec<String> = subject.split('.').map(str::to_owned).collect();
    let i = rng.below(tokens.len());
    let token = ["w1", "w2", "wf-1", "wf-1-main", "_", "fleet", "task", "dispatched", "completed", "", "a.b"]
        [rng.below(11)]
    .to_owned();
    match rng.below(3) {
        0 => tokens[i] = token,
        1 => {
            tokens.remove(i);
        }
        _ => tokens.insert(i, token),
    }
    tokens.join(".")
}

/// `event` with `id`, `time` and `type` first, where it has them, as our writers put them: the
/// order `Event::read` takes in one pass. serde_json's maps sort their keys, which puts most of a
/// task event's fields before its type and leaves it to the two-pass reading; rounds take both.
fn in_writer_order(event: &Value) -> Vec<u8> {
    let Some(fields) = event.as_object() else { return serde_json::to_vec(event).unwrap() };
    let envelope = ["id", "time", "type"];
    let first = envelope.iter().filter_map(|key| fields.get_key_value(*key));
    let rest = fields.iter().filter(|(key, _)| !envelope.contains(&key.as_str()));
    let pairs: Vec<String> =
        first.chain(rest).map(|(key, value)| format!("{}:{}", Value::from(key.as_str()), value)).collect();
    format!("{{{}}}", pairs.join(",")).into_bytes()
}

#[test]
fn mutated_events_are_read_as_their_subject_says_or_refused_and_never_panic() {
    let corpus = corpus();
    // The corpus itself reads, and holds every kind there is.
    let mut kinds = BTreeSet::new();
    for (subject, event) in &corpus {
        let read = Event::read(subject, &serde_json::to_vec(event).unwrap());
        let read = read.unwrap_or_else(|e| panic!("{subject}: the corpus event is refused: {e}"));
        kinds.insert(read.body.kind());
    }
    assert_eq!(kinds.len(), 23, "every kind of event is in the corpus: {kinds:?}");
    assert!(corpus.iter().any(|(subject, _)| Layout::of(subject) == Layout::Legacy));
    assert!(corpus.iter().any(|(subject, _)| Layout::of(subject) == Layout::WorkerFirst));

    let mut rng = Rng(seed(0xF1E2_D3C4_B5A6_9788));
    let (mut read, mut refused) = (0usize, BTreeSet::new());
    let history: Vec<Event> = corpus
        .iter()
        .filter(|(subject, _)| subject.ends_with("submission.accepted") || subject.contains("dispatched"))
        .map(|(subject, event)| Event::read(subject, &serde_json::to_vec(event).unwrap()).unwrap())
        .collect();
    let rounds = rounds(8_000);
    for round in 0..rounds {
        let (subject, event) = &corpus[rng.below(corpus.len())];
        let mut event = event.clone();
        let mut subject = subject.clone();
        for _ in 0..=rng.below(3) {
            match rng.below(4) {
                0 | 1 => mutate_json(&mut rng, &mut event),
                2 => subject = mutate_subject(&mut rng, &subject),
                _ => {}
            }
        }
        let mut bytes = if rng.below(2) == 0 { in_writer_order(&event) } else { serde_json::to_vec(&event).unwrap() };
        if rng.below(4) == 0 {
            mutate_bytes(&mut rng, &mut bytes);
        }
        let context = || format!("round {round}: {subject} {}", String::from_utf8_lossy(&bytes));

        let full = Event::read(&subject, &bytes);
        let fold = Event::read_skipping_orders(&subject, &bytes);
        match (&full, &fold) {
            (Ok(full), Ok(fold)) => {
                let mut without_order = full.clone();
                if let EventBody::TaskDispatched(d) = &mut without_order.body {
                    d.order = None;
                }
                assert_eq!(&without_order, fold, "{}", context());
            }
            (Ok(_), Err(e)) => panic!("{}: the fold refuses what the full reading takes: {e}", context()),
            // Only a dispatch's order, which the fold does not read, may tell them apart: the
            // full reading refuses it as no event, the fold reads further.
            (
                Err(Unreadable::NotAnEvent(_)),
                Ok(_) | Err(Unreadable::WrongAuthor { .. } | Unreadable::SubjectMismatch { .. }),
            ) => {
                let kind = match fold {
                    Ok(event) => event.body.kind(),
                    Err(Unreadable::WrongAuthor { kind, .. }) => kind,
                    Err(_) => "task.dispatched",
                };
                assert_eq!(kind, "task.dispatched", "{}", context());
                assert!(bytes.windows(8).any(|w| w == b"\"order\":"), "{}", context());
            }
            (Err(Unreadable::NotAnEvent(_)), Err(Unreadable::NotAnEvent(_))) => {}
            (Err(a), Err(b)) => assert_eq!(a, b, "{}", context()),
            (Err(e), Ok(_)) => panic!("{}: refused only with its order read: {e}", context()),
        }
        // What it refuses as no event, serde's derived decoding refuses too, but where it is
        // the stricter of the two by design: a `type` that is no string, bytes not UTF-8.
        if matches!(full, Err(Unreadable::NotAnEvent(_))) && serde_json::from_slice::<Event>(&bytes).is_ok() {
            let parsed: Option<Value> = serde_json::from_slice(&bytes).ok();
            let typed = parsed.as_ref().and_then(|v| v.get("type")).is_some_and(Value::is_string);
            assert!(!typed || std::str::from_utf8(&bytes).is_err(), "{}: refused", context());
        }
        let Ok(event) = full else {
            let reason = full.unwrap_err();
            assert!(!reason.to_string().trim().is_empty(), "{}", context());
            refused.insert(match reason {
                Unreadable::TooLarge { .. } => "too large",
                Unreadable::NotAnEvent(_) => "not an event",
                Unreadable::WrongAuthor { .. } => "wrong author",
                Unreadable::SubjectMismatch { .. } => "subject mismatch",
            });
            continue;
        };
        read += 1;

        // What it believes is what the subject says.
        let (workflow, task) = event.body.scope();
        let layout = Layout::of(&subject);
        let mut tokens = subject.split('.').skip(usize::from(layout == Layout::WorkerFirst));
        assert_eq!((tokens.next(), tokens.next()), (Some(workflow), Some(task)), "{}", context());
        let author = Author::of(&subject);
        let written = event.subject_suffix(author);
        // A legacy subject reads as what is now written in its place; a dispatch stored before
        // dispatches named their worker in the subject reads too.
        let as_written = if layout == Layout::Legacy { worker_first(&subject) } else { subject.clone() };
        let workerless = layout == Layout::Legacy
            && matches!(event.body, EventBody::TaskDispatched(_))
            && written.split_once('.').is_some_and(|(_, without_worker)| without_worker == subject);
        assert!(written == as_written || workerless, "{}: written on {written}", context());
        if let Author::Worker(worker) = author {
            assert_eq!(event.body.reporter(), Some(worker), "{}", context());
        }
        // A fold takes whatever `read` lets through, at any time its writer wrote, after the
        // acceptance and the dispatch it may follow.
        let mut at = event.clone();
        if rng.below(2) == 0 {
            at.time = odd_value(&mut rng).as_str().unwrap_or("").to_owned();
        }
        let mut folded = State::default();
        for before in &history {
            folded.apply(before);
        }
        folded.apply_deriving(&at);
        // And reads back the same once written again.
        let again = Event::read(&subject, &serde_json::to_vec(&event).unwrap());
        assert_eq!(again.as_ref(), Ok(&event), "{}", context());
    }
    // The mutations reached both sides and every way of refusing.
    assert!(read as u64 > rounds / 16, "only {read} of {rounds} mutated events read");
    assert_eq!(refused.len(), 3, "refusals seen: {refused:?}");
}
