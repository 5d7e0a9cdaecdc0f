//! One file per verb, each with its arguments and its handler; `main.rs` parses and dispatches
//! here. This file holds the little the verbs share.

pub mod bench;
pub mod dev;
pub mod events;
pub mod plan;
pub mod result;
pub mod serve;
pub mod ssh;
pub mod streams;
pub mod submit;
pub mod task;
pub mod trace;
pub mod validate;
pub mod worker;
pub mod workflow;

use anyhow::Context;
use flowmesh_domain::event::Author;
use flowmesh_domain::{Event, EventBody};
use flowmesh_nats::{clock, publish};
use std::io::Read;
use std::path::Path;
use std::process::ExitCode;

/// The exit code of a command that ran: 0 on success, 1 otherwise (clap's usage errors exit 2).
pub fn exit(success: bool) -> ExitCode {
    if success { ExitCode::SUCCESS } else { ExitCode::from(1) }
}

/// A workflow document from a file, or from stdin for `-`.
pub fn read_document(path: &Path) -> anyhow::Result<Vec<u8>> {
    if path.as_os_str() == "-" {
        let mut body = Vec::new();
        std::io::stdin().read_to_end(&mut body)?;
        Ok(body)
    } else {
        std::fs::read(path).with_context(|| format!("reading {}", path.display()))
    }
}

/// Publishes an operator's event (a cancel request, a cordon, a prewarm hint), stamped now.
pub async fn operate(js: &async_nats::jetstream::Context, body: EventBody) -> anyhow::Result<()> {
    let now = clock::now_ms();
    let event = Event::new(body, clock::rfc3339(now), now);
    publish::publish_event(js, &event, Author::Service).await?;
    Ok(())
}

/// Prints `value` as pretty JSON with every object's keys in alphabetical order: the shape the
/// `--json` outputs built with `serde_json::json!` always had (its maps sort their keys), which
/// scripts read.
pub fn print_sorted_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(&serde_json::to_value(value)?)?);
    Ok(())
}
