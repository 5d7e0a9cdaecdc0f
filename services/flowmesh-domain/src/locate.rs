//! Where a problem sits in the YAML source: JSON pointers mapped back to line and column.
//!
//! Only a rejected document pays for this: its body is read once more into a tree of nodes that
//! remember where each starts, and every problem's path is looked up in it.

use crate::problem::Problem;
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// A YAML node and where it starts (1-based line and column).
struct Node {
    line: u64,
    column: u64,
    kind: Kind,
}

enum Kind {
    Map(Vec<(String, Node)>),
    Seq(Vec<Node>),
    Leaf,
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let spanned = serde_saphyr::Spanned::<Kind>::deserialize(deserializer)?;
        Ok(Node { line: spanned.referenced.line(), column: spanned.referenced.column(), kind: spanned.value })
    }
}

impl<'de> Deserialize<'de> for Kind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(KindVisitor)
    }
}

struct KindVisitor;

macro_rules! leaf {
    ($($name:ident: $ty:ty),*) => {
        $(fn $name<E: de::Error>(self, _: $ty) -> Result<Kind, E> { Ok(Kind::Leaf) })*
    };
}

impl<'de> Visitor<'de> for KindVisitor {
    type Value = Kind;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML node")
    }

    leaf!(visit_bool: bool, visit_i64: i64, visit_u64: u64, visit_f64: f64, visit_str: &str);

    fn visit_unit<E: de::Error>(self) -> Result<Kind, E> {
        Ok(Kind::Leaf)
    }

    fn visit_none<E: de::Error>(self) -> Result<Kind, E> {
        Ok(Kind::Leaf)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Kind, A::Error> {
        let mut items = Vec::new();
        while let Some(node) = seq.next_element::<Node>()? {
            items.push(node);
        }
        Ok(Kind::Seq(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Kind, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<Key>()? {
            entries.push((key.0, map.next_value::<Node>()?));
        }
        Ok(Kind::Map(entries))
    }
}

/// A mapping key as the text a JSON pointer uses for it.
struct Key(String);

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a scalar key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
                Ok(Key(v.to_owned()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
        }
        deserializer.deserialize_any(KeyVisitor)
    }
}

/// The line and column of the deepest node on `pointer` that exists in the document: the node
/// itself, or for a missing key, the mapping that lacks it.
fn locate(root: &Node, pointer: &str) -> (u64, u64) {
    let mut node = root;
    for token in pointer.trim_start_matches('/').split('/').filter(|t| !t.is_empty()) {
        let token = token.replace("~1", "/").replace("~0", "~");
        let next = match &node.kind {
            Kind::Map(entries) => entries.iter().find(|(k, _)| *k == token).map(|(_, v)| v),
            Kind::Seq(items) => token.parse::<usize>().ok().and_then(|i| items.get(i)),
            Kind::Leaf => None,
        };
        match next {
            Some(n) => node = n,
            None => break,
        }
    }
    (node.line, node.column)
}

/// Adds YAML line and column to every problem that has none, when `text` parses.
pub fn annotate(text: &str, problems: &mut [Problem], options: serde_saphyr::Options) {
    let Ok(root) = serde_saphyr::from_str_with_options::<Node>(text, options) else { return };
    for p in problems.iter_mut().filter(|p| p.line.is_none()) {
        let (line, column) = locate(&root, &p.path);
        p.line = Some(line);
        p.column = Some(column);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointers_map_to_lines() {
        let text = "apiVersion: flowmesh/v1\nspec:\n  taskType: echo\n  stages:\n    - name: a\n    - name: b\n      dependsOn: [zz]\n";
        let root: Node = serde_saphyr::from_str(text).unwrap();
        assert_eq!(locate(&root, "/spec/taskType"), (3, 13));
        assert_eq!(locate(&root, "/spec/stages/1/name"), (6, 13));
        assert_eq!(locate(&root, "/spec/stages/1/dependsOn/0").0, 7);
        assert_eq!(locate(&root, "/spec/missing").0, 3, "a missing key points at its mapping");
    }
}
