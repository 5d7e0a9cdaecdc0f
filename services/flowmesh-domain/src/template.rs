//! Placeholders `${stage.path}`: finding them at submit, resolving them at dispatch.

use serde_json::Value;

/// One `${stage.path}` occurrence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placeholder {
    pub stage: String,
    /// The dotted path inside the stage's result (`items.0.output`); empty for `${stage}`.
    pub path: Vec<String>,
}

/// Every placeholder in `text`, in order. Unterminated `${` is left alone (it is plain text).
pub fn placeholders(text: &str) -> Vec<Placeholder> {
    spans(text).into_iter().map(|(_, _, p)| p).collect()
}

fn spans(text: &str) -> Vec<(usize, usize, Placeholder)> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(start) = text[from..].find("${").map(|i| i + from) {
        let Some(len) = text[start + 2..].find('}') else {
            break;
        };
        let inner = &text[start + 2..start + 2 + len];
        let end = start + 2 + len + 1;
        // Only `${stage.path}` names a stage; `${API_KEY}` is left for the executor's environment.
        if let Some((stage, rest)) = inner.trim().split_once('.')
            && !stage.is_empty()
            && !rest.is_empty()
        {
            found.push((start, end, Placeholder { stage: stage.to_owned(), path: parse_path(rest) }));
        }
        from = end;
    }
    found
}

/// Splits `items[1].output` or `items.1.output` into `["items", "1", "output"]`.
pub fn parse_path(text: &str) -> Vec<String> {
    text.replace('[', ".")
        .replace(']', "")
        .split('.')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Whether any string inside `value` holds a placeholder.
pub fn contains_placeholder(value: &Value) -> bool {
    match value {
        Value::String(s) => !placeholders(s).is_empty(),
        Value::Array(items) => items.iter().any(contains_placeholder),
        Value::Object(map) => map.values().any(contains_placeholder),
        _ => false,
    }
}

/// Calls `visit(pointer, placeholder)` for every placeholder in `value`; pointers are relative
/// to `pointer`. A pointer is spelt only where a placeholder is: a spec is walked at every
/// submission, and most of its strings hold none.
pub fn walk(value: &Value, pointer: &str, visit: &mut dyn FnMut(&str, &Placeholder)) {
    walk_below(value, pointer, &mut Vec::new(), visit);
}

/// One step of a pointer: an array index or an object key.
enum Step<'a> {
    Index(usize),
    Key(&'a str),
}

fn walk_below<'a>(value: &'a Value, base: &str, steps: &mut Vec<Step<'a>>, visit: &mut dyn FnMut(&str, &Placeholder)) {
    match value {
        Value::String(s) => {
            let found = placeholders(s);
            if found.is_empty() {
                return;
            }
            let pointer = steps.iter().fold(base.to_owned(), |pointer, step| match step {
                Step::Index(i) => crate::problem::push(&pointer, i),
                Step::Key(key) => crate::problem::push(&pointer, key),
            });
            found.iter().for_each(|p| visit(&pointer, p));
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                steps.push(Step::Index(i));
                walk_below(item, base, steps, visit);
                steps.pop();
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                steps.push(Step::Key(key));
                walk_below(item, base, steps, visit);
                steps.pop();
            }
        }
        _ => {}
    }
}

/// What a placeholder resolves against: the upstream stage's task id and result.
pub trait Upstream {
    fn task_id(&self, stage: &str) -> Option<String>;
    fn result(&self, stage: &str) -> Option<&Value>;
}

/// Looks up `path` in `value`: object keys by name, array items by index.
pub fn lookup<'a>(value: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(value, |current, key| match current {
        Value::Object(map) => map.get(key),
        Value::Array(items) => key.parse::<usize>().ok().and_then(|i| items.get(i)),
        _ => None,
    })
}

fn resolve_one(p: &Placeholder, upstream: &dyn Upstream) -> Result<Value, String> {
    if p.path.len() == 1 && p.path[0] == "task_id" {
        return upstream
            .task_id(&p.stage)
            .map(Value::String)
            .ok_or_else(|| format!("stage {:?} is not part of this workflow", p.stage));
    }
    let result = upstream.result(&p.stage).ok_or_else(|| format!("stage {:?} has no result to read", p.stage))?;
    lookup(result, &p.path)
        .cloned()
        .ok_or_else(|| format!("the result of stage {:?} has no value at {:?}", p.stage, p.path.join(".")))
}

/// Replaces every placeholder in `value`. A string that is exactly one placeholder takes the
/// value's JSON type; a placeholder embedded in text is stringified.
pub fn resolve(value: &Value, upstream: &dyn Upstream) -> Result<Value, String> {
    // Most specs hold none: a plain copy, where rebuilding every object through an iterator
    // cost a fifth more allocations (BENCHMARKS, "Seventeenth round").
    if !contains_placeholder(value) {
        return Ok(value.clone());
    }
    resolve_within(value, upstream)
}

fn resolve_within(value: &Value, upstream: &dyn Upstream) -> Result<Value, String> {
    match value {
        Value::String(s) => {
            let found = spans(s);
            if found.is_empty() {
                return Ok(value.clone());
            }
            if found.len() == 1 && found[0].0 == 0 && found[0].1 == s.len() {
                return resolve_one(&found[0].2, upstream);
            }
            let mut out = String::with_capacity(s.len());
            let mut last = 0;
            for (start, end, p) in &found {
                out.push_str(&s[last..*start]);
                match resolve_one(p, upstream)? {
                    Value::String(text) => out.push_str(&text),
                    other => out.push_str(&other.to_string()),
                }
                last = *end;
            }
            out.push_str(&s[last..]);
            Ok(Value::String(out))
        }
        Value::Array(items) => {
            items.iter().map(|v| resolve_within(v, upstream)).collect::<Result<_, _>>().map(Value::Array)
        }
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| resolve_within(v, upstream).map(|v| (k.clone(), v)))
            .collect::<Result<serde_json::Map<_, _>, _>>()
            .map(Value::Object),
        _ => Ok(value.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    struct Fixture(Value);
    impl Upstream for Fixture {
        fn task_id(&self, stage: &str) -> Option<String> {
            (stage == "train").then(|| "wf-1-train".to_owned())
        }
        fn result(&self, stage: &str) -> Option<&Value> {
            (stage == "train").then_some(&self.0)
        }
    }

    #[test]
    fn finds_placeholders() {
        let found = placeholders("a ${train.final_model_archive} b ${up.items[0].output} ${ broken ${API_KEY}");
        assert_eq!(found.len(), 2);
        assert_eq!(
            found[1],
            Placeholder { stage: "up".into(), path: vec!["items".into(), "0".into(), "output".into()] }
        );
    }

    #[test]
    fn walk_names_each_placeholder_with_its_pointer() {
        let spec = json!({
            "plain": "no placeholder",
            "model": {"path": "${train.final_model_archive}"},
            "items": ["a", "${up.items[0].output} and ${up.task_id}"],
            "a/b": "${train.epochs}",
        });
        let mut seen = Vec::new();
        walk(&spec, "/spec", &mut |pointer, p| seen.push((pointer.to_owned(), p.stage.clone())));
        seen.sort();
        let want =
            [("/spec/a~1b", "train"), ("/spec/items/1", "up"), ("/spec/items/1", "up"), ("/spec/model/path", "train")];
        assert_eq!(seen, want.map(|(p, s)| (p.to_owned(), s.to_owned())));
        let mut none = 0;
        walk(&json!({"a": ["b", {"c": "d"}], "e": 1}), "", &mut |_, _| none += 1);
        assert_eq!(none, 0);
    }

    #[test]
    fn resolves_typed_and_embedded() {
        let up = Fixture(json!({"final_model_archive": "s3://m.tar", "epochs": 3, "items": [{"output": "x"}]}));
        let cases = [
            (json!("${train.epochs}"), json!(3)),
            (json!("epochs=${train.epochs}"), json!("epochs=3")),
            (json!("${train.items.0.output}"), json!("x")),
            (json!({"m": ["${train.final_model_archive}"]}), json!({"m": ["s3://m.tar"]})),
            (json!("${train.task_id}"), json!("wf-1-train")),
            (json!("plain"), json!("plain")),
        ];
        for (input, want) in cases {
            assert_eq!(resolve(&input, &up).unwrap(), want, "{input}");
        }
        assert!(resolve(&json!("${train.missing}"), &up).unwrap_err().contains("missing"));
        assert!(resolve(&json!("${other.x}"), &up).is_err());
    }
}
