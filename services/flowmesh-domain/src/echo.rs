//! The `echo` task type, FlowMesh's semantics: `data.items` are echoed back as
//! `{ok: true, items: [{output: v}, …], count: N}`. An item is a value, or `{node, path}` or
//! `{expr: "stage.path"}` read from an upstream result; an item that resolves to a list
//! contributes each of its elements.

use crate::template::{Upstream, lookup, parse_path};
use serde_json::{Value, json};

/// `(pointer, stage)` for every item that reads an upstream stage.
pub fn references(spec: &Value) -> Vec<(String, String)> {
    let Some(items) = crate::pointer::get(spec, "/data/items").and_then(Value::as_array) else {
        return Vec::new();
    };
    items
        .iter()
        .enumerate()
        .filter_map(|(i, item)| reference(item).map(|(stage, _)| (format!("/data/items/{i}"), stage)))
        .collect()
}

fn reference(item: &Value) -> Option<(String, Vec<String>)> {
    if let (Some(node), Some(path)) =
        (item.get("node").and_then(Value::as_str), item.get("path").and_then(Value::as_str))
    {
        return Some((node.to_owned(), parse_path(path)));
    }
    let expr = item.get("expr").and_then(Value::as_str)?;
    let (stage, path) = expr.split_once('.').unwrap_or((expr, ""));
    Some((stage.trim().to_owned(), parse_path(path)))
}

/// Replaces reference items by the values they read (flattening lists). Other items stay.
pub fn resolve_items(spec: Value, upstream: &dyn Upstream) -> Result<Value, String> {
    let mut spec = spec;
    let Some(items) = crate::pointer::get_mut(&mut spec, "/data/items").and_then(Value::as_array_mut) else {
        return Ok(spec);
    };
    let mut out = Vec::with_capacity(items.len());
    for item in items.drain(..) {
        match reference(&item) {
            None => out.push(item),
            Some((stage, path)) => {
                let result = upstream.result(&stage).ok_or_else(|| format!("stage {stage:?} has no result to read"))?;
                let value = lookup(result, &path)
                    .ok_or_else(|| format!("the result of stage {stage:?} has no value at {:?}", path.join(".")))?;
                match value {
                    Value::Array(values) => out.extend(values.iter().cloned()),
                    other => out.push(other.clone()),
                }
            }
        }
    }
    *items = out;
    Ok(spec)
}

/// Runs an echo task on a resolved spec.
pub fn run(spec: &Value) -> Result<Value, String> {
    let items = crate::pointer::get(spec, "/data/items")
        .and_then(Value::as_array)
        .ok_or_else(|| "echo needs data.items, a list of values to echo".to_owned())?;
    let outputs: Vec<Value> = items.iter().map(|v| json!({ "output": v })).collect();
    Ok(json!({ "ok": true, "count": outputs.len(), "items": outputs }))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Up(Value);
    impl Upstream for Up {
        fn task_id(&self, _: &str) -> Option<String> {
            None
        }
        fn result(&self, stage: &str) -> Option<&Value> {
            (stage == "greet").then_some(&self.0)
        }
    }

    #[test]
    fn echoes_items_and_reads_upstream() {
        let up = Up(json!({"ok": true, "count": 2, "items": [{"output": "a"}, {"output": "b"}], "tags": ["x", "y"]}));
        let spec = json!({"data": {"type": "list", "items": [
            "lit", {"node": "greet", "path": "items[1].output"}, {"expr": "greet.tags"}]}});
        let resolved = resolve_items(spec, &up).unwrap();
        assert_eq!(resolved["data"]["items"], json!(["lit", "b", "x", "y"]));
        assert_eq!(
            run(&resolved).unwrap(),
            json!({"ok": true, "count": 4, "items": [{"output": "lit"}, {"output": "b"}, {"output": "x"}, {"output": "y"}]})
        );
        assert!(resolve_items(json!({"data": {"items": [{"node": "greet", "path": "nope"}]}}), &up).is_err());
        assert!(run(&json!({"data": {}})).is_err());
    }
}
