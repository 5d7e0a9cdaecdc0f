//! Workflow traces from the event log: each task's time waiting on upstream stages, queued for a
//! worker, being placed (dispatch to start), running and uploading, and the workflow's critical
//! path. Pure: the events carry their own times.

use crate::event::{Event, EventBody};
use serde::Serialize;
use std::collections::HashMap;

/// What a span of a task's time was spent on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Accepted, waiting for upstream stages to end.
    Waiting,
    /// Ready, waiting for a worker (placement, a free slot, a retry).
    Queued,
    /// Dispatched to a worker, not started yet.
    Placement,
    Run,
    /// Storing logs, results and artifacts after the run.
    Upload,
}

impl Phase {
    pub const ALL: [Phase; 5] = [Phase::Waiting, Phase::Queued, Phase::Placement, Phase::Run, Phase::Upload];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Waiting => "waiting",
            Phase::Queued => "queued",
            Phase::Placement => "placement",
            Phase::Run => "run",
            Phase::Upload => "upload",
        }
    }
}

/// One span, in milliseconds since the workflow was accepted.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Span {
    pub phase: Phase,
    pub start_ms: u64,
    pub end_ms: u64,
    /// The attempt this span belongs to.
    pub attempt: u32,
    /// The span ended in a failure (or a cancel) of its attempt.
    pub failed: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TaskTrace {
    pub task_id: String,
    pub stage: String,
    pub depends_on: Vec<String>,
    /// The worker of the last attempt that reached one.
    pub worker_id: Option<String>,
    pub attempts: u32,
    /// The last event kind of the task (`task.completed`, `task.failed`, …).
    pub outcome: String,
    pub spans: Vec<Span>,
    /// When it ended, if it did.
    pub end_ms: Option<u64>,
    pub on_critical_path: bool,
}

impl TaskTrace {
    /// Total time spent in `phase`.
    pub fn total(&self, phase: Phase) -> u64 {
        self.spans.iter().filter(|s| s.phase == phase).map(|s| s.end_ms - s.start_ms).sum()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Trace {
    pub workflow_id: String,
    pub name: String,
    pub accepted_at: String,
    /// From acceptance to the workflow's end (or its last event, while it runs).
    pub total_ms: u64,
    pub outcome: String,
    pub tasks: Vec<TaskTrace>,
    /// Stages from a root to the stage that ended last, each the upstream stage that ended last.
    pub critical_path: Vec<String>,
}

/// Builds the trace of `workflow_id` from its events (in log order).
pub fn trace(events: &[Event], workflow_id: &str) -> Result<Trace, String> {
    let accepted = events
        .iter()
        .find_map(|e| match &e.body {
            EventBody::SubmissionAccepted(a) if a.workflow_id == workflow_id => Some((e, a)),
            _ => None,
        })
        .ok_or_else(|| format!("no accepted workflow {workflow_id} in the log"))?;
    let t0 = unix_ms(&accepted.0.time).ok_or_else(|| format!("unreadable time {:?}", accepted.0.time))?;
    let at = |e: &Event| unix_ms(&e.time).map(|t| t.saturating_sub(t0)).unwrap_or(0);
    let workflow = &accepted.1.workflow;
    let index: HashMap<&str, usize> = workflow.tasks.iter().enumerate().map(|(i, t)| (t.task_id.as_str(), i)).collect();
    let mut tasks: Vec<TaskTrace> = workflow
        .tasks
        .iter()
        .map(|t| TaskTrace {
            task_id: t.task_id.clone(),
            stage: t.stage.clone(),
            depends_on: t.depends_on.clone(),
            worker_id: None,
            attempts: 1,
            outcome: "waiting".to_owned(),
            spans: Vec::new(),
            end_ms: None,
            on_critical_path: false,
        })
        .collect();
    let mut events_of: Vec<Vec<&Event>> = vec![Vec::new(); tasks.len()];
    let mut end_ms = 0;
    let mut outcome = "running".to_owned();
    for e in events {
        match &e.body {
            EventBody::WorkflowCompleted(w) | EventBody::WorkflowFailed(w) | EventBody::WorkflowCancelled(w)
                if w.workflow_id == workflow_id =>
            {
                outcome = e.body.kind().trim_start_matches("workflow.").to_owned();
                end_ms = end_ms.max(at(e));
            }
            body => {
                if let Some(&i) = body.task().and_then(|t| index.get(t.task_id.as_str())) {
                    events_of[i].push(e);
                    end_ms = end_ms.max(at(e));
                }
            }
        }
    }
    // Tasks come in topological order, so every upstream end is known before it is needed.
    for i in 0..tasks.len() {
        let ready = tasks[i]
            .depends_on
            .iter()
            .map(|d| tasks.iter().find(|t| &t.stage == d).and_then(|t| t.end_ms))
            .try_fold(0u64, |acc, end| end.map(|e| acc.max(e)));
        let mut state = ready.map(|r| (Phase::Queued, r));
        let t = &mut tasks[i];
        if let Some(r) = ready
            && r > 0
        {
            t.spans.push(Span { phase: Phase::Waiting, start_ms: 0, end_ms: r, attempt: 1, failed: false });
        }
        for e in &events_of[i] {
            let now = at(e);
            let attempt = e.body.task().map_or(1, |r| r.attempt);
            let close = |t: &mut TaskTrace, state: &mut Option<(Phase, u64)>, next: Option<Phase>, failed| {
                if let Some((phase, since)) = *state {
                    t.spans.push(Span { phase, start_ms: since, end_ms: now.max(since), attempt, failed });
                }
                *state = next.map(|p| (p, now));
            };
            if let Some(status) = status_after(&e.body) {
                t.outcome = status.to_owned();
            }
            match &e.body {
                EventBody::TaskDispatched(d) => {
                    t.worker_id = Some(d.worker_id.clone());
                    close(t, &mut state, Some(Phase::Placement), false);
                }
                EventBody::TaskStarted(_) => close(t, &mut state, Some(Phase::Run), false),
                EventBody::TaskCompleted(c) => {
                    // Completed before its start was due: the run began at `started_at`.
                    if let (Some((Phase::Placement, since)), Some(started)) =
                        (state, c.started_at.as_deref().and_then(unix_ms))
                    {
                        let started = started.saturating_sub(t0).clamp(since, now.max(since));
                        t.spans.push(Span {
                            phase: Phase::Placement,
                            start_ms: since,
                            end_ms: started,
                            attempt,
                            failed: false,
                        });
                        state = Some((Phase::Run, started));
                    }
                    let upload = c.upload_ms.unwrap_or(0);
                    if let (Some((Phase::Run, since)), true) = (state, upload > 0) {
                        let split = now.saturating_sub(upload).max(since);
                        t.spans.push(Span {
                            phase: Phase::Run,
                            start_ms: since,
                            end_ms: split,
                            attempt,
                            failed: false,
                        });
                        state = Some((Phase::Upload, split));
                    }
                    close(t, &mut state, None, false);
                    t.end_ms = Some(now);
                }
                EventBody::TaskFailed(_) | EventBody::TaskCancelled(_) => {
                    close(t, &mut state, Some(Phase::Queued), true);
                    t.end_ms = Some(now);
                }
                EventBody::TaskRequeued(r) => {
                    t.attempts = r.task.attempt;
                    t.end_ms = None;
                    if let Some((Phase::Placement | Phase::Run, _)) = state {
                        close(t, &mut state, Some(Phase::Queued), true);
                    }
                }
                EventBody::TaskSkipped(_) => {
                    state = None;
                    t.end_ms = Some(now);
                }
                _ => {}
            }
        }
        // A terminal failure leaves nothing open; a task still in flight is shown up to now.
        if t.end_ms.is_some() {
            state = None;
        }
        if let Some((phase, since)) = state
            && end_ms > since
            && outcome == "running"
        {
            t.spans.push(Span { phase, start_ms: since, end_ms, attempt: t.attempts, failed: false });
        }
    }
    let critical_path = critical_path(&mut tasks);
    Ok(Trace {
        workflow_id: workflow_id.to_owned(),
        name: workflow.name.clone(),
        accepted_at: accepted.0.time.clone(),
        total_ms: end_ms,
        outcome,
        tasks,
        critical_path,
    })
}

/// The task's status after an event about it, as `task list` spells it.
fn status_after(body: &EventBody) -> Option<&'static str> {
    Some(match body {
        EventBody::TaskPending(_) => "pending",
        EventBody::TaskDispatched(_) => "dispatched",
        EventBody::TaskMerged(_) => "merged",
        EventBody::TaskStarted(_) => "running",
        EventBody::TaskCompleted(_) => "completed",
        EventBody::TaskFailed(_) => "failed",
        EventBody::TaskRequeued(_) => "waiting",
        EventBody::TaskSkipped(_) => "skipped",
        EventBody::TaskCancelled(_) => "cancelled",
        _ => return None,
    })
}

/// From the stage that ended last, back through the upstream stage that ended last.
fn critical_path(tasks: &mut [TaskTrace]) -> Vec<String> {
    let Some(mut i) = (0..tasks.len()).filter(|&i| tasks[i].end_ms.is_some()).max_by_key(|&i| (tasks[i].end_ms, i))
    else {
        return Vec::new();
    };
    let mut path = vec![i];
    loop {
        let upstream = tasks[i]
            .depends_on
            .iter()
            .filter_map(|d| tasks.iter().position(|t| &t.stage == d))
            .filter(|&j| tasks[j].end_ms.is_some())
            .max_by_key(|&j| (tasks[j].end_ms, j));
        match upstream {
            Some(j) if !path.contains(&j) => {
                path.push(j);
                i = j;
            }
            _ => break,
        }
    }
    path.reverse();
    for &j in &path {
        tasks[j].on_critical_path = true;
    }
    path.into_iter().map(|j| tasks[j].stage.clone()).collect()
}

/// Milliseconds since the Unix epoch of an RFC 3339 time (`2026-01-02T03:04:05.678Z`, or with
/// an offset); `None` when it does not read as one.
pub fn unix_ms(text: &str) -> Option<u64> {
    let b = text.as_bytes();
    let num = |from: usize, len: usize| -> Option<i64> {
        let s = text.get(from..from + len)?;
        s.bytes().all(|c| c.is_ascii_digit()).then(|| s.parse().ok())?
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') || b[13] != b':' {
        return None;
    }
    let (year, month, day) = (num(0, 4)?, num(5, 2)?, num(8, 2)?);
    let (hour, minute, second) = (num(11, 2)?, num(14, 2)?, num(17, 2)?);
    let mut rest = &text[19..];
    let mut millis = 0i64;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let padded = format!("{:0<3}", &fraction[..digits.min(3)]);
        millis = padded.parse().ok()?;
        rest = &fraction[digits..];
    }
    // Matched as bytes: the text is whatever its writer put there, and slicing a str inside a
    // character panics (a worker's completion time is read by the router's fold).
    let digits =
        |pair: [u8; 2]| pair.iter().all(u8::is_ascii_digit).then(|| i64::from((pair[0] - b'0') * 10 + pair[1] - b'0'));
    let offset_min = match *rest.as_bytes() {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let minutes = digits([h1, h2])? * 60 + digits([m1, m2])?;
            if sign == b'-' { -minutes } else { minutes }
        }
        _ => return None,
    };
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_min * 60;
    u64::try_from(seconds * 1000 + millis).ok()
}
