//! A workflow trace as a picture: an SVG timeline with one row per task, its bar split into
//! coloured phases (waiting, queued, placement, run, upload), the critical path in bold.

use flowmesh_domain::trace::{Phase, Trace};
use std::fmt::Write;

const LABEL_W: f64 = 230.0;
const CHART_W: f64 = 760.0;
const ROW_H: f64 = 26.0;
const TOP: f64 = 78.0;

/// The fill colour of a phase (a failed span is drawn red whatever its phase).
pub fn colour(phase: Phase) -> &'static str {
    match phase {
        Phase::Waiting => "#d0d4da",
        Phase::Queued => "#f2c14e",
        Phase::Placement => "#6fa8dc",
        Phase::Run => "#4caf50",
        Phase::Upload => "#9b6bd1",
    }
}

const FAILED: &str = "#d9534f";

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// Seconds with one decimal (`12.3 s`) or milliseconds below one second.
pub fn duration(ms: u64) -> String {
    if ms < 1000 { format!("{ms} ms") } else { format!("{:.1} s", ms as f64 / 1000.0) }
}

/// A tick step (ms) giving about eight ticks over `total`.
fn tick_step(total: u64) -> u64 {
    let raw = (total / 8).max(1);
    let magnitude = 10u64.pow(raw.ilog10());
    [1, 2, 5, 10].iter().map(|m| m * magnitude).find(|step| *step >= raw).unwrap_or(10 * magnitude)
}

/// Renders `trace` as a standalone SVG document.
pub fn svg(trace: &Trace) -> String {
    let total = trace.total_ms.max(1);
    let x = |ms: u64| LABEL_W + CHART_W * ms as f64 / total as f64;
    let height = TOP + ROW_H * trace.tasks.len() as f64 + 40.0;
    let width = LABEL_W + CHART_W + 30.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let path = if trace.critical_path.is_empty() { "-".to_owned() } else { trace.critical_path.join(" → ") };
    let _ = writeln!(
        out,
        r#"<text x="10" y="20" font-size="15" font-weight="bold">{} ({}) — {}, {}</text>"#,
        escape(&trace.workflow_id),
        escape(&trace.name),
        escape(&trace.outcome),
        duration(trace.total_ms)
    );
    let _ = writeln!(out, r#"<text x="10" y="38">critical path (bold): {}</text>"#, escape(&path));
    // Legend.
    let mut lx = 10.0;
    for phase in Phase::ALL {
        let _ = writeln!(out, r#"<rect x="{lx}" y="48" width="14" height="12" fill="{}"/>"#, colour(phase));
        let _ = writeln!(out, r#"<text x="{}" y="58">{}</text>"#, lx + 18.0, phase.name());
        lx += 30.0 + 7.0 * phase.name().len() as f64 + 12.0;
    }
    let _ = writeln!(out, r#"<rect x="{lx}" y="48" width="14" height="12" fill="{FAILED}"/>"#);
    let _ = writeln!(out, r#"<text x="{}" y="58">failed attempt</text>"#, lx + 18.0);
    // Time axis with grid lines.
    let bottom = TOP + ROW_H * trace.tasks.len() as f64;
    let step = tick_step(total);
    let mut tick = 0;
    while tick <= total {
        let tx = x(tick);
        let _ =
            writeln!(out, r##"<line x1="{tx:.1}" y1="{}" x2="{tx:.1}" y2="{bottom}" stroke="#eeeeee"/>"##, TOP - 4.0);
        let _ = writeln!(
            out,
            r##"<text x="{tx:.1}" y="{}" text-anchor="middle" fill="#555555">{}</text>"##,
            bottom + 16.0,
            duration(tick)
        );
        tick += step;
    }
    for (row, task) in trace.tasks.iter().enumerate() {
        let y = TOP + ROW_H * row as f64;
        let weight = if task.on_critical_path { "bold" } else { "normal" };
        let _ = writeln!(out, r#"<g class="task" id="{}">"#, escape(&task.task_id));
        let _ = writeln!(
            out,
            r##"<text x="10" y="{:.1}" font-weight="{weight}">{} <tspan fill="#777777">{}</tspan></text>"##,
            y + 17.0,
            escape(&task.stage),
            escape(task.worker_id.as_deref().unwrap_or(&task.outcome))
        );
        for span in &task.spans {
            let (x0, x1) = (x(span.start_ms), x(span.end_ms));
            let fill = if span.failed && span.phase == Phase::Run { FAILED } else { colour(span.phase) };
            let stroke = if task.on_critical_path { r##" stroke="#222222" stroke-width="1""## } else { "" };
            let _ = writeln!(
                out,
                r#"<rect class="{}" x="{x0:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{fill}"{stroke}><title>{} {}: {} ({} → {})</title></rect>"#,
                span.phase.name(),
                y + 4.0,
                (x1 - x0).max(1.0),
                ROW_H - 8.0,
                escape(&task.stage),
                span.phase.name(),
                duration(span.end_ms - span.start_ms),
                duration(span.start_ms),
                duration(span.end_ms)
            );
        }
        let _ = writeln!(out, "</g>");
    }
    let _ = writeln!(out, "</svg>");
    out
}

/// The trace as a table: one row per task, time per phase, `*` on the critical path.
pub fn table(trace: &Trace) -> String {
    let rows: Vec<Vec<String>> = trace
        .tasks
        .iter()
        .map(|t| {
            let mut row = vec![
                format!("{}{}", if t.on_critical_path { "* " } else { "  " }, t.stage),
                t.outcome.clone(),
                t.worker_id.clone().unwrap_or_default(),
                t.attempts.to_string(),
            ];
            row.extend(Phase::ALL.iter().map(|p| duration(t.total(*p))));
            row.push(t.end_ms.map(duration).unwrap_or_default());
            row
        })
        .collect();
    crate::table::render(
        &["STAGE", "STATUS", "WORKER", "ATTEMPTS", "WAITING", "QUEUED", "PLACEMENT", "RUN", "UPLOAD", "ENDED AT"],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_numbers() {
        for (total, step) in [(1, 1), (80, 10), (2_500, 500), (9_000, 2_000), (60_000, 10_000)] {
            assert_eq!(tick_step(total), step, "{total}");
        }
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(
            (duration(250), duration(1500), duration(12_345)),
            ("250 ms".into(), "1.5 s".into(), "12.3 s".into())
        );
    }
}
