//! A deterministic fuzz test over decode + validate: mutated documents always get exactly one
//! verdict — a workflow, or problems that each have a path and a message — and never a panic.

use flowmesh_domain::validate_submission;
use std::path::PathBuf;

#[path = "common/rng.rs"]
mod rng;

use rng::Rng;

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
    let mut rng = Rng(0x9E3779B97F4A7C15);
    let (mut accepted, mut rejected) = (0, 0);
    for _ in 0..4000 {
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
