//! Turning raw submission bytes into a JSON value, safely: size, encoding, YAML budgets.

use crate::problem::Problem;
use serde_json::Value;

mod block;

/// The largest submission accepted (the submissions stream refuses larger messages too).
pub const MAX_SUBMISSION_BYTES: usize = 1024 * 1024;
/// The deepest nesting accepted. FlowMesh documents are a dozen levels deep at most.
pub const MAX_DEPTH: usize = 64;

/// Decodes a submission body. JSON is detected by its first non-blank byte (`{`); everything
/// else is read as YAML 1.2 (strict booleans, duplicate keys rejected, alias and size budgets).
pub fn decode(body: &[u8]) -> Result<Value, Problem> {
    if body.len() > MAX_SUBMISSION_BYTES {
        return Err(Problem::new(
            "/",
            format!("submission is {} bytes; the limit is {MAX_SUBMISSION_BYTES} bytes (1 MiB)", body.len()),
        ));
    }
    let text = std::str::from_utf8(body).map_err(|e| {
        Problem::new("/", format!("submission is not valid UTF-8 (first bad byte at offset {})", e.valid_up_to()))
    })?;
    if text.trim().is_empty() {
        return Err(Problem::new("/", "submission is empty; expected a flowmesh/v1 YAML or JSON document"));
    }
    if let Some(pos) = text.find(|c: char| c.is_control() && !matches!(c, '\n' | '\r' | '\t')) {
        return Err(Problem::new(
            "/",
            format!("submission contains a control character at byte {pos}; expected YAML or JSON text"),
        ));
    }
    let value = if text.trim_start().starts_with('{') { decode_json(text)? } else { decode_yaml(text)? };
    if depth(&value) > MAX_DEPTH {
        return Err(Problem::new("/", format!("document nests deeper than {MAX_DEPTH} levels")));
    }
    Ok(value)
}

fn decode_json(text: &str) -> Result<Value, Problem> {
    serde_json::from_str(text).map_err(|e| Problem {
        line: Some(e.line() as u64),
        column: Some(e.column() as u64),
        ..Problem::new("/", format!("invalid JSON: {e}"))
    })
}

/// The YAML parser's settings: YAML 1.2 booleans and budgets that stop hostile input early.
pub fn yaml_options() -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_depth = MAX_DEPTH;
    budget.max_aliases = 1_000;
    budget.max_anchors = 1_000;
    budget.max_events = 200_000;
    budget.max_nodes = 100_000;
    budget.max_documents = 1;
    budget.max_total_scalar_bytes = MAX_SUBMISSION_BYTES;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options.strict_booleans = true;
    options
}

/// The common block shape is read directly (`block`), several times faster than the parser and
/// to the same value; every other document, and every error, comes from serde-saphyr.
fn decode_yaml(text: &str) -> Result<Value, Problem> {
    if let Some(value) = block::read(text) {
        return Ok(value);
    }
    parse_yaml(text)
}

fn parse_yaml(text: &str) -> Result<Value, Problem> {
    let value: Value = serde_saphyr::from_str_with_options(text, yaml_options()).map_err(|e| {
        let location = e.location();
        let message = e.to_string();
        // The library's message may repeat the position; keep its first line, which says what went wrong.
        let first = message.lines().next().unwrap_or("invalid YAML").trim();
        Problem {
            line: location.as_ref().map(|l| l.line()),
            column: location.as_ref().map(|l| l.column()),
            ..Problem::new("/", format!("invalid YAML: {first}"))
        }
    })?;
    if value.is_null() {
        return Err(Problem::new("/", "submission holds no document; expected a flowmesh/v1 mapping"));
    }
    Ok(value)
}

fn depth(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejects(body: &[u8], needle: &str) {
        let problem = decode(body).expect_err("must be rejected");
        assert!(problem.message.contains(needle), "{:?} should mention {needle:?}", problem.message);
    }

    #[test]
    fn hostile_inputs_are_rejected_with_a_reason() {
        rejects(b"", "empty");
        rejects(b"   \n", "empty");
        rejects(b"\xff\xfe\x00", "UTF-8");
        rejects(b"a: \x01\x02", "control character");
        rejects(&vec![b'a'; MAX_SUBMISSION_BYTES + 1], "limit");
        rejects(b"a: 1\na: 2\n", "invalid YAML");
        rejects(b"a: 1\n---\nb: 2\n", "invalid YAML");
        rejects(b"{\"a\": }", "invalid JSON");
        let deep = "[".repeat(10_000) + &"]".repeat(10_000);
        assert!(decode(deep.as_bytes()).is_err());
        let deep_yaml = (0..10_000).map(|i| format!("{}a:\n", " ".repeat(i))).collect::<String>();
        assert!(decode(deep_yaml.as_bytes()).is_err());
    }

    #[test]
    fn alias_bomb_is_stopped() {
        let mut doc = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..10 {
            let prev = i - 1;
            doc += &format!(
                "a{i}: &a{i} [*a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}]\n"
            );
        }
        assert!(decode(doc.as_bytes()).is_err());
    }

    #[test]
    fn yaml_and_json_decode_to_the_same_value() {
        let yaml = decode(b"kind: Workflow\nspec:\n  n: 1\n  ok: true\n  country: NO\n").unwrap();
        let json = decode(br#"{"kind":"Workflow","spec":{"n":1,"ok":true,"country":"NO"}}"#).unwrap();
        assert_eq!(yaml, json);
    }
}
