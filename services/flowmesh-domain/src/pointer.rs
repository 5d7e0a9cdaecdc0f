//! JSON pointers (RFC 6901) looked up without allocating.
//!
//! `serde_json::Value::pointer` un-escapes every token into a new string, two per token, even
//! where the token holds no `~`; the validator, placement and the echo runner look up a dozen
//! fixed paths per workflow (28 allocations per one-task workflow in validation alone). `get`
//! answers exactly as `Value::pointer` does and allocates only for a token that holds `~`.

use serde_json::Value;

/// The value at `pointer` in `value`: `""` is the whole value, otherwise each `/`-separated
/// token names a key of an object or an index of an array (digits, no leading zero).
pub fn get<'a>(value: &'a Value, pointer: &str) -> Option<&'a Value> {
    if pointer.contains('~') {
        return value.pointer(pointer);
    }
    if pointer.is_empty() {
        return Some(value);
    }
    let tokens = pointer.strip_prefix('/')?;
    tokens.split('/').try_fold(value, |at, token| match at {
        Value::Object(map) => map.get(token),
        Value::Array(items) => index(token).and_then(|i| items.get(i)),
        _ => None,
    })
}

/// `get`, for changing the value found.
pub fn get_mut<'a>(value: &'a mut Value, pointer: &str) -> Option<&'a mut Value> {
    if pointer.contains('~') {
        return value.pointer_mut(pointer);
    }
    if pointer.is_empty() {
        return Some(value);
    }
    let tokens = pointer.strip_prefix('/')?;
    tokens.split('/').try_fold(value, |at, token| match at {
        Value::Object(map) => map.get_mut(token),
        Value::Array(items) => index(token).and_then(|i| items.get_mut(i)),
        _ => None,
    })
}

/// An array index as RFC 6901 spells it: `0`, or digits with no leading zero.
fn index(token: &str) -> Option<usize> {
    if token.starts_with('+') || (token.starts_with('0') && token.len() != 1) {
        return None;
    }
    token.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn answers_as_serde_json_does() {
        let doc = json!({
            "spec": {"resources": {"hardware": {"gpu": {"count": 2}, "memory": "8Gi"}}},
            "items": ["a", {"b": [1, 2]}],
            "": {"": "empty keys"},
            "a/b": 1,
            "m~n": 2,
            "01": "a key that looks like an index",
        });
        let pointers = [
            "",
            "/",
            "//",
            "/spec",
            "/spec/resources/hardware/gpu/count",
            "/spec/resources/missing",
            "/spec/resources/hardware/memory/deeper",
            "/items/0",
            "/items/1/b/1",
            "/items/2",
            "/items/01",
            "/items/+1",
            "/items/-1",
            "/items/",
            "/items/1/b/18446744073709551616",
            "/a~1b",
            "/m~0n",
            "/a/b",
            "/01",
            "spec",
            "/items/0/x",
            "/spec/",
            "/spec//",
        ];
        for pointer in pointers {
            assert_eq!(get(&doc, pointer), doc.pointer(pointer), "{pointer:?}");
            let (mut ours, mut theirs) = (doc.clone(), doc.clone());
            assert_eq!(get_mut(&mut ours, pointer), theirs.pointer_mut(pointer), "{pointer:?}");
        }
    }
}
