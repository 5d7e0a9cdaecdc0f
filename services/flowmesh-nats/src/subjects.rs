//! Every subject, stream, bucket and consumer name. Nothing else spells one.

use flowmesh_domain::event::{FLEET_SCOPE, Layout, NO_SCOPE};

pub const SUBMIT: &str = "flowmesh.submit";
pub const EVENTS_PREFIX: &str = "flowmesh.events";
pub const WORK_PREFIX: &str = "flowmesh.work";
/// Core-NATS subject on which a worker hears cancellations: `flowmesh.control.<worker_id>.cancel`.
pub const CONTROL_PREFIX: &str = "flowmesh.control";
pub const LOGS_PREFIX: &str = "flowmesh.logs";
pub const HINTS_PREFIX: &str = "flowmesh.hints";
/// Subjects of the temporary streams `flowmesh bench --raw` creates: `flowmesh.bench.raw.<nonce>`.
/// No product stream listens below `flowmesh.bench`, so the raw measurement never mixes with them.
pub const BENCH_RAW_PREFIX: &str = "flowmesh.bench.raw";

pub const SUBMISSIONS_STREAM: &str = "FLOWMESH_SUBMISSIONS";
pub const EVENTS_STREAM: &str = "FLOWMESH_EVENTS";
pub const WORK_STREAM: &str = "FLOWMESH_WORK";
pub const WORKERS_BUCKET: &str = "flowmesh_workers";
pub const ARTIFACTS_BUCKET: &str = "flowmesh_artifacts";
pub const CONTROL_BUCKET: &str = "flowmesh_control";
/// Names of the temporary streams of `flowmesh bench --raw`, deleted when the measurement ends.
pub const BENCH_RAW_STREAM_PREFIX: &str = "FLOWMESH_BENCH_RAW_";

/// A worker's own object store: `flowmesh_artifacts_<worker_id>`, written by that worker only
/// (`ARTIFACTS_BUCKET` is the one workers sharing a NATS user share).
pub fn artifacts_bucket(worker_id: &str) -> String {
    format!("{ARTIFACTS_BUCKET}_{worker_id}")
}

/// The stream behind object store `bucket`.
pub fn object_stream(bucket: &str) -> String {
    format!("OBJ_{bucket}")
}

/// Every stream FlowMesh stores messages in: its streams, and those behind its buckets and
/// object store.
pub fn all_streams() -> [String; 6] {
    [
        SUBMISSIONS_STREAM.to_owned(),
        EVENTS_STREAM.to_owned(),
        WORK_STREAM.to_owned(),
        format!("KV_{WORKERS_BUCKET}"),
        format!("KV_{CONTROL_BUCKET}"),
        object_stream(ARTIFACTS_BUCKET),
    ]
}

/// The prefix under which `user` receives replies: `_INBOX_<user>`. Nobody is granted the
/// shared `_INBOX.>`, where anyone could read anyone's replies.
pub fn inbox_prefix(user: &str) -> String {
    format!("_INBOX_{user}")
}

/// Every reply subject of `user`: what its role may subscribe to.
pub fn inbox(user: &str) -> String {
    format!("{}.>", inbox_prefix(user))
}

/// The durable consumer all validators share (competing consumers).
pub const VALIDATORS_CONSUMER: &str = "validators";

/// `flowmesh.events.<worker|_>.<workflow>.<task>.<noun>.<verb>` (`Event::subject_suffix`).
pub fn event(suffix: &str) -> String {
    format!("{EVENTS_PREFIX}.{suffix}")
}

/// The part of an event subject below `flowmesh.events.`, or `None` for another subject.
pub fn event_suffix(subject: &str) -> Option<&str> {
    subject.strip_prefix(EVENTS_PREFIX)?.strip_prefix('.')
}

/// The kind an event's subject suffix names (`<noun>.<verb>`, e.g. `task.dispatched`): its last
/// two tokens, or in a legacy subject (`Layout::Legacy`) its third and fourth. A body is believed
/// only where it agrees with its subject (`Event::read`), so a reader that wants a few kinds may
/// skip the others by this, without decoding them.
pub fn event_kind(suffix: &str) -> Option<&str> {
    let mut dots = suffix.match_indices('.').map(|(at, _)| at);
    let (start, end) = match Layout::of(suffix) {
        Layout::WorkerFirst => (dots.nth(2)? + 1, suffix.len()),
        Layout::Legacy => (dots.nth(1)? + 1, dots.nth(1).unwrap_or(suffix.len())),
    };
    (start < end).then(|| &suffix[start..end])
}

/// The kinds a worker reports, each on `flowmesh.events.<worker_id>.<workflow>.<task>.<kind>`.
pub const REPORT_KINDS: [&str; 5] = ["task.started", "task.updated", "task.completed", "task.failed", "task.cancelled"];

/// Every report of `kind` written by `worker` (`*` for any worker), in any workflow.
pub fn reports(kind: &str, worker: &str) -> String {
    format!("{EVENTS_PREFIX}.{worker}.*.*.{kind}")
}

/// Every event of `kind` (`<noun>.<verb>`) in any workflow, whoever wrote it.
pub fn events_of_kind(kind: &str) -> String {
    format!("{EVENTS_PREFIX}.*.*.*.{kind}")
}

/// Every event: `flowmesh.events.>`.
pub fn all_events() -> String {
    format!("{EVENTS_PREFIX}.>")
}

/// Every event of one workflow: `flowmesh.events.*.<workflow>.>`.
pub fn workflow_events(workflow_id: &str) -> String {
    format!("{EVENTS_PREFIX}.*.{workflow_id}.>")
}

/// Every event of one workflow in a log written before the worker-first layout, for a purge:
/// its services' events `<workflow>.<task>.<noun>.<verb>` and its tasks' reports and dispatches
/// `<workflow>.<task>.task.<verb>.<worker>`. Neither takes in a worker-first subject (five
/// tokens, the third a task id, which is never `task`), so a purge removes nothing else.
pub fn legacy_workflow_events(workflow_id: &str) -> [String; 2] {
    [format!("{EVENTS_PREFIX}.{workflow_id}.*.*.*"), format!("{EVENTS_PREFIX}.{workflow_id}.*.task.*.*")]
}

/// The verdict on one submission (`*`: on every submission):
/// `flowmesh.events._.<workflow>._.submission.>`.
pub fn submission_events(workflow_id: &str) -> String {
    format!("{EVENTS_PREFIX}.{NO_SCOPE}.{workflow_id}.{NO_SCOPE}.submission.>")
}

/// [`submission_events`] where a log written before the worker-first layout has them:
/// `flowmesh.events.<workflow>._.submission.>`. No subject matches both, so one consumer may
/// filter on the two.
pub fn legacy_submission_events(workflow_id: &str) -> String {
    format!("{EVENTS_PREFIX}.{workflow_id}.{NO_SCOPE}.submission.>")
}

/// The records of retention's purges (`workflows.purged`), on no workflow:
/// `flowmesh.events._._._.workflows.purged`.
pub fn purge_records() -> String {
    format!("{EVENTS_PREFIX}.{NO_SCOPE}.{NO_SCOPE}.{NO_SCOPE}.workflows.purged")
}

/// [`purge_records`] in a log written before the worker-first layout:
/// `flowmesh.events._._.workflows.purged`.
pub fn legacy_purge_records() -> String {
    format!("{EVENTS_PREFIX}.{NO_SCOPE}.{NO_SCOPE}.workflows.purged")
}

/// The JetStream API request (below `$JS.API.`) that deletes one message of the event log by
/// its sequence: how retention removes a workflow's events.
pub fn event_delete_request() -> String {
    format!("STREAM.MSG.DELETE.{EVENTS_STREAM}")
}

/// Every fleet event (joins, losses, cordons, drains, prewarm hints): `flowmesh.events._.fleet.>`.
pub fn fleet_events() -> String {
    format!("{EVENTS_PREFIX}.{NO_SCOPE}.{FLEET_SCOPE}.>")
}

/// [`fleet_events`] in a log written before the worker-first layout: `flowmesh.events.fleet.>`.
/// No subject matches both, so one consumer may filter on the two.
pub fn legacy_fleet_events() -> String {
    format!("{EVENTS_PREFIX}.{FLEET_SCOPE}.>")
}

/// Every event of one task: `flowmesh.events.*.*.<task>.>`.
pub fn task_events(task_id: &str) -> String {
    format!("{EVENTS_PREFIX}.*.*.{task_id}.>")
}

/// Where a log written before the worker-first layout kept the events a view `filter` (one of
/// the views above, `flowmesh.events.<*|_>.….>`) takes in: the same filter without its first
/// token (`flowmesh.events.*.wf-7.>` → `flowmesh.events.wf-7.>`). `None` for a filter that
/// already takes in both (`flowmesh.events.>`) or is no view.
pub fn legacy_view(filter: &str) -> Option<String> {
    let rest = event_suffix(filter)?;
    let (first, rest) = rest.split_once('.')?;
    (matches!(first, "*" | NO_SCOPE) && rest.ends_with('>')).then(|| event(rest))
}

/// Every dispatch sent to `worker` (`*`: to any worker):
/// `flowmesh.events.<worker>.*.*.task.dispatched`. A dispatch of a task with no secret carries
/// its work order, and the worker consumes this subject as its work queue. Its first token is
/// literal, so when the server looks through its subject index for the next block holding one
/// of these, it looks only at this worker's subjects.
pub fn dispatches(worker: &str) -> String {
    format!("{EVENTS_PREFIX}.{worker}.*.*.task.dispatched")
}

/// Where a worker's dispatch consumer pushes: `<inbox_prefix>.dispatches.<worker>`, under the
/// reply prefix only that worker's user may subscribe to.
pub fn dispatch_inbox(inbox_prefix: &str, worker: &str) -> String {
    format!("{inbox_prefix}.dispatches.{worker}")
}

/// The work orders that hold a secret, sent to one worker: `flowmesh.work.<worker_id>`.
pub fn work(worker_id: &str) -> String {
    format!("{WORK_PREFIX}.{worker_id}")
}

/// The worker a work subject (`flowmesh.work.<worker>`) is for, or `None` for another subject.
pub fn work_worker(subject: &str) -> Option<&str> {
    subject.strip_prefix(WORK_PREFIX)?.strip_prefix('.')
}

/// The durable consumer of one worker on its work subject, and (same name, other stream) on its
/// dispatch subject.
pub fn work_consumer(worker_id: &str) -> String {
    format!("worker-{worker_id}")
}

pub fn cancel(worker_id: &str) -> String {
    format!("{CONTROL_PREFIX}.{worker_id}.cancel")
}

/// Core-NATS subject on which a worker hears the router ask for an order back from its queue
/// (it could run sooner elsewhere): `flowmesh.control.<worker_id>.release`, payload = task id.
pub fn release(worker_id: &str) -> String {
    format!("{CONTROL_PREFIX}.{worker_id}.release")
}

/// Core-NATS subject on which a worker hears prewarm hints: `flowmesh.control.<worker_id>.prewarm`,
/// payload = a model id (the `worker.prewarm_requested` event records each hint).
pub fn prewarm(worker_id: &str) -> String {
    format!("{CONTROL_PREFIX}.{worker_id}.prewarm")
}

/// Core-NATS subject carrying a running task's output as it is written, by the worker running
/// it: `flowmesh.logs.<task_id>.stdout|stderr.<worker_id>` (best effort; the stored logs are
/// complete). The worker's token is what NATS binds to a per-worker user, so a follower
/// believes a chunk only from the worker the task was dispatched to ([`logs_writer`]).
pub fn logs(task_id: &str, stream: &str, worker_id: &str) -> String {
    format!("{LOGS_PREFIX}.{task_id}.{stream}.{worker_id}")
}

/// What a follower of a task's live output subscribes to: its chunks from any worker.
pub fn logs_of(task_id: &str, stream: &str) -> String {
    logs(task_id, stream, "*")
}

/// The task and the worker of a live-output subject ([`logs`]).
pub fn logs_writer(subject: &str) -> Option<(&str, &str)> {
    let rest = subject.strip_prefix(LOGS_PREFIX)?.strip_prefix('.')?;
    let mut tokens = rest.split('.');
    match (tokens.next(), tokens.next(), tokens.next(), tokens.next()) {
        (Some(task), Some("stdout" | "stderr"), Some(worker), None) if !task.is_empty() && !worker.is_empty() => {
            Some((task, worker))
        }
        _ => None,
    }
}

/// Core-NATS subject on which the router explains why a task waits for a slot on a busy fleet
/// (`task.pending` with reason `busy`, never stored): `flowmesh.hints.<workflow>.<task_id>`.
pub fn hint(workflow_id: &str, task_id: &str) -> String {
    format!("{HINTS_PREFIX}.{workflow_id}.{task_id}")
}

/// Every hint about one workflow's tasks: `flowmesh.hints.<workflow>.*`.
pub fn workflow_hints(workflow_id: &str) -> String {
    format!("{HINTS_PREFIX}.{workflow_id}.*")
}

/// The status endpoint of a service: `flowmesh.router.status`, `flowmesh.worker.<id>.status`, …
pub fn status(scope: &str) -> String {
    format!("flowmesh.{scope}.status")
}

/// The NATS micro-service name of a service (`$SRV.PING.flowmesh-router`).
pub fn service_name(service: &str) -> String {
    format!("flowmesh-{service}")
}

/// The object name of a task's file: `<task_id>/<path>`.
pub fn artifact(task_id: &str, path: &str) -> String {
    format!("{task_id}/{path}")
}

/// The object name of a task's stored output: `<task_id>/logs/stdout.log` / `stderr.log`.
pub fn log_object(task_id: &str, stream: &str) -> String {
    artifact(task_id, &format!("logs/{stream}.log"))
}

/// The subject of one `flowmesh bench --raw` run.
pub fn bench_raw(nonce: &str) -> String {
    format!("{BENCH_RAW_PREFIX}.{nonce}")
}

/// The temporary stream of one `flowmesh bench --raw` run.
pub fn bench_raw_stream(nonce: &str) -> String {
    format!("{BENCH_RAW_STREAM_PREFIX}{nonce}")
}

#[cfg(test)]
mod tests {
    use super::{
        all_events, dispatches, event, event_kind, events_of_kind, fleet_events, legacy_fleet_events,
        legacy_purge_records, legacy_submission_events, legacy_view, legacy_workflow_events, logs, logs_of,
        logs_writer, purge_records, reports, submission_events, task_events, workflow_events,
    };

    /// NATS subject matching: `*` is one token, `>` the rest.
    fn matches(pattern: &str, subject: &str) -> bool {
        let (mut p, mut s) = (pattern.split('.'), subject.split('.'));
        loop {
            match (p.next(), s.next()) {
                (Some(">"), Some(_)) => return true,
                (Some("*"), Some(_)) => {}
                (Some(a), Some(b)) if a == b => {}
                (None, None) => return true,
                _ => return false,
            }
        }
    }

    #[test]
    fn a_live_output_subject_names_its_task_and_writer() {
        assert_eq!(logs("wf-1-main", "stdout", "w1"), "flowmesh.logs.wf-1-main.stdout.w1");
        assert_eq!(logs_of("wf-1-main", "stderr"), "flowmesh.logs.wf-1-main.stderr.*");
        assert_eq!(logs_writer("flowmesh.logs.wf-1-main.stderr.w1"), Some(("wf-1-main", "w1")));
        for subject in [
            "flowmesh.logs.wf-1-main.stdout",
            "flowmesh.logs.wf-1-main.stdin.w1",
            "flowmesh.logs.wf-1-main.stdout.w1.x",
            "flowmesh.logs..stdout.w1",
            "flowmesh.logsx.wf-1-main.stdout.w1",
            "flowmesh.events.wf-1.wf-1-main.task.started.w1",
        ] {
            assert_eq!(logs_writer(subject), None, "{subject}");
        }
    }

    #[test]
    fn events_of_a_kind_are_matched_as_their_authors_write_them() {
        let written = [
            "w-1.wf-1.wf-1-a.task.started",
            "w-1.wf-1.wf-1-a.task.completed",
            "w-1.wf-1.wf-1-a.task.dispatched",
            "_.wf-1.wf-1-a.task.skipped",
            "_.wf-1._.workflow.failed",
            "_.wf-1._.submission.rejected",
            "_.wf-1._.submission.accepted",
        ];
        let cases = [
            ("task.started", "w-1.wf-1.wf-1-a.task.started"),
            ("task.completed", "w-1.wf-1.wf-1-a.task.completed"),
            ("task.skipped", "_.wf-1.wf-1-a.task.skipped"),
            ("workflow.failed", "_.wf-1._.workflow.failed"),
            ("submission.rejected", "_.wf-1._.submission.rejected"),
        ];
        for (kind, only) in cases {
            let pattern = events_of_kind(kind);
            let hits: Vec<&str> = written.iter().copied().filter(|suffix| matches(&pattern, &event(suffix))).collect();
            assert_eq!(hits, [only], "{pattern}");
        }
    }

    /// Each view's filter takes in exactly its own events, written where their writers write
    /// them; a legacy filter and its worker-first one never take in the same subject.
    #[test]
    fn each_view_takes_in_its_own_events() {
        let written = [
            "w-1.wf-1.wf-1-a.task.dispatched",
            "w-1.wf-1.wf-1-a.task.completed",
            "w-2.wf-2.wf-2-a.task.dispatched",
            "_.wf-1._.submission.accepted",
            "_.wf-2._.submission.rejected",
            "_.fleet.w-1.worker.joined",
            "_._._.workflows.purged",
        ];
        let hits = |pattern: &str| -> Vec<&str> {
            written.iter().copied().filter(|suffix| matches(pattern, &event(suffix))).collect()
        };
        assert_eq!(hits(&dispatches("w-1")), ["w-1.wf-1.wf-1-a.task.dispatched"]);
        assert_eq!(hits(&workflow_events("wf-1")), [written[0], written[1], written[3]]);
        assert_eq!(hits(&task_events("wf-1-a")), [written[0], written[1]]);
        assert_eq!(hits(&submission_events("*")), [written[3], written[4]]);
        assert_eq!(hits(&fleet_events()), ["_.fleet.w-1.worker.joined"]);
        assert_eq!(hits(&purge_records()), ["_._._.workflows.purged"]);
        assert_eq!(hits(&reports("task.completed", "w-1")), ["w-1.wf-1.wf-1-a.task.completed"]);
        let legacy = ["wf-1._.submission.accepted", "fleet.w-1.worker.joined", "_._.workflows.purged"];
        let legacy_hits = |pattern: &str| -> Vec<&str> {
            legacy.iter().copied().filter(|suffix| matches(pattern, &event(suffix))).collect()
        };
        assert_eq!(legacy_hits(&legacy_submission_events("*")), [legacy[0]]);
        assert_eq!(legacy_hits(&legacy_fleet_events()), [legacy[1]]);
        assert_eq!(legacy_hits(&legacy_purge_records()), [legacy[2]]);
        // Each view's legacy twin is where a legacy log kept the same events.
        assert_eq!(legacy_view(&workflow_events("wf-1")).as_deref(), Some("flowmesh.events.wf-1.>"));
        assert_eq!(legacy_view(&task_events("wf-1-a")).as_deref(), Some("flowmesh.events.*.wf-1-a.>"));
        assert_eq!(legacy_view(&fleet_events()), Some(legacy_fleet_events()));
        assert_eq!(legacy_view(&submission_events("*")), Some(legacy_submission_events("*")));
        assert_eq!(legacy_view(&all_events()), None);
        assert_eq!(legacy_view(&dispatches("w-1")), None);
        // What a purge of a legacy workflow removes: its events, nothing written since.
        let legacy_log =
            ["wf-1._.submission.accepted", "wf-1.wf-1-a.task.dispatched.w-1", "wf-1.wf-1-a.task.completed.w-1"];
        let purged = |suffix: &&str| legacy_workflow_events("wf-1").iter().any(|f| matches(f, &event(suffix)));
        assert!(legacy_log.iter().all(purged));
        let named_like_it = ["wf-1.wf-2.wf-2-a.task.completed", "wf-1.wf-1.wf-1-a.task.started"];
        assert!(!written.iter().chain(&named_like_it).any(purged));
        for (new, old) in [
            (submission_events("*"), legacy_submission_events("*")),
            (fleet_events(), legacy_fleet_events()),
            (purge_records(), legacy_purge_records()),
        ] {
            assert!(hits(&old).is_empty() && legacy_hits(&new).is_empty(), "{new} and {old} overlap");
            assert!(!could_overlap(&new, &old), "{new} and {old}");
        }
    }

    /// Whether some subject matches both patterns (what the server refuses in one consumer).
    fn could_overlap(a: &str, b: &str) -> bool {
        let (a, b): (Vec<&str>, Vec<&str>) = (a.split('.').collect(), b.split('.').collect());
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            if *x == ">" || *y == ">" {
                return true;
            }
            if *x != "*" && *y != "*" && x != y {
                return false;
            }
            if i + 1 == a.len().min(b.len()) {
                return a.len() == b.len();
            }
        }
        false
    }

    #[test]
    fn the_kind_is_the_last_two_tokens_or_a_legacy_subject_s_third_and_fourth() {
        let cases = [
            ("w-1.wf-1.wf-1-a.task.completed", Some("task.completed")),
            ("w-1.wf-1.wf-1-a.task.dispatched", Some("task.dispatched")),
            ("_.wf-1._.submission.accepted", Some("submission.accepted")),
            ("_.fleet.w-1.worker.joined", Some("worker.joined")),
            // A task named like a noun changes nothing.
            ("w-1.wf-1.task.task.started", Some("task.started")),
            // Legacy subjects.
            ("wf-1.wf-1-a.task.completed.w-1", Some("task.completed")),
            ("wf-1.wf-1-a.task.dispatched.w-1", Some("task.dispatched")),
            ("wf-1._.submission.accepted", Some("submission.accepted")),
            ("fleet._.worker.joined", Some("worker.joined")),
            ("wf-1.wf-1-a", None),
            ("wf-1.wf-1-a.", None),
            ("", None),
        ];
        for (suffix, want) in cases {
            assert_eq!(event_kind(suffix), want, "{suffix}");
        }
    }
}
