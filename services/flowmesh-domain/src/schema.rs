//! The JSON Schemas in `schemas/`, embedded at build time and compiled once.

use crate::problem::{Problem, push};
use serde_json::{Value, json};
use std::sync::OnceLock;

/// `schemas/workflow.schema.json`: the whole `flowmesh/v1` document.
pub const WORKFLOW_SCHEMA: &str = include_str!("../../../schemas/workflow.schema.json");
/// `schemas/event.schema.json`: every event on `FLOWMESH_EVENTS`.
pub const EVENT_SCHEMA: &str = include_str!("../../../schemas/event.schema.json");
/// `schemas/worker.schema.json`: the capability snapshot in `flowmesh_workers`.
pub const WORKER_SCHEMA: &str = include_str!("../../../schemas/worker.schema.json");

fn compile(schema: &Value) -> jsonschema::Validator {
    // The schemas ship inside the binary and are tested; failing here is a build defect.
    jsonschema::draft202012::new(schema).expect("embedded schema compiles")
}

fn parse(text: &str) -> Value {
    serde_json::from_str(text).expect("embedded schema is JSON")
}

fn document_validator() -> &'static jsonschema::Validator {
    static V: OnceLock<jsonschema::Validator> = OnceLock::new();
    V.get_or_init(|| compile(&parse(WORKFLOW_SCHEMA)))
}

/// Validates one complete (merged) task spec against `#/$defs/taskSpec`.
fn task_validator() -> &'static jsonschema::Validator {
    static V: OnceLock<jsonschema::Validator> = OnceLock::new();
    V.get_or_init(|| {
        let full = parse(WORKFLOW_SCHEMA);
        compile(&json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$defs": full["$defs"],
            "$ref": "#/$defs/taskSpec",
        }))
    })
}

fn event_validator() -> &'static jsonschema::Validator {
    static V: OnceLock<jsonschema::Validator> = OnceLock::new();
    V.get_or_init(|| compile(&parse(EVENT_SCHEMA)))
}

fn worker_validator() -> &'static jsonschema::Validator {
    static V: OnceLock<jsonschema::Validator> = OnceLock::new();
    V.get_or_init(|| compile(&parse(WORKER_SCHEMA)))
}

fn problems(validator: &jsonschema::Validator, instance: &Value, base: &str) -> Vec<Problem> {
    use jsonschema::error::ValidationErrorKind as Kind;
    // Almost every instance is valid, and `is_valid` stops at the first failure without
    // building errors: collecting them costs more (BENCHMARKS "Sixth round").
    if validator.is_valid(instance) {
        return Vec::new();
    }
    let mut out = Vec::new();
    for error in validator.iter_errors(instance) {
        let at = join(base, error.instance_path().as_str());
        // Unknown and missing keys are reported at the key's own path, which is where a person
        // looks for them (`/spec/resources/hardware/vram`, not `/spec/resources/hardware`).
        match error.kind() {
            Kind::AdditionalProperties { unexpected } | Kind::UnevaluatedProperties { unexpected } => {
                for key in unexpected {
                    out.push(Problem::new(push(&at, key), format!("unknown field {key:?}")));
                }
            }
            Kind::Required { property } => {
                let key = property.as_str().map_or_else(|| property.to_string(), str::to_owned);
                out.push(Problem::new(push(&at, &key), format!("missing required field {key:?}")));
            }
            Kind::Not { .. } if at == "/spec" || at.ends_with("/spec") => {
                out.push(Problem::new(at, "use either stages or graph.nodes, not both"));
            }
            _ => out.push(Problem::new(at, shorten(&error.to_string()))),
        }
    }
    out
}

/// Schema messages quote the offending value; a huge value must not make a huge event.
fn shorten(message: &str) -> String {
    let mut message = message.to_owned();
    crate::problem::cut_text(&mut message, 240 + "…".len());
    message
}

/// Compiles the schemas a validator checks every submission against, if not done yet. The
/// first check would otherwise compile them: about 6 ms of CPU on the thread that validates
/// (BENCHMARKS "Forty-seventh round"), which in a one-process stack stalls everything sharing
/// that thread, so a service calls this before it takes its first message.
pub fn compile_submission_schemas() {
    document_validator();
    task_validator();
}

/// Problems of a whole document against the workflow schema.
pub fn check_document(doc: &Value) -> Vec<Problem> {
    problems(document_validator(), doc, "/")
}

/// Problems of one merged task spec; `base` is the pointer the paths are relative to.
pub fn check_task_spec(spec: &Value, base: &str) -> Vec<Problem> {
    problems(task_validator(), spec, base)
}

/// Problems of an event (used by tests and by `flowmesh events --check`).
pub fn check_event(event: &Value) -> Vec<Problem> {
    problems(event_validator(), event, "/")
}

/// Problems of a worker snapshot.
pub fn check_worker(snapshot: &Value) -> Vec<Problem> {
    problems(worker_validator(), snapshot, "/")
}

/// Re-roots a relative pointer under `base` (`/spec` + `/resources` = `/spec/resources`).
pub fn join(base: &str, relative: &str) -> String {
    match (base, relative) {
        (_, "" | "/") => base.to_owned(),
        ("/" | "", _) => relative.to_owned(),
        _ => format!("{base}{relative}"),
    }
}
