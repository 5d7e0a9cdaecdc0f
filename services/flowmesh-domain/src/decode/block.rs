//! The common shape of a submission read without the YAML parser: block mappings and sequences
//! of one-line scalars and one-line flow collections, in ASCII. Whatever else a document holds
//! (anchors, tags, block and multi-line scalars, escapes, numbers in other forms than `12`,
//! `1.5` and `5e-5`, keys that are not plain words, duplicate keys) makes `read` answer `None`,
//! and the document goes to serde-saphyr, which decides it and gives every error. So where
//! `read` answers, it answers what serde-saphyr would: the tests compare the two on every
//! example and on generated documents (ARCHITECTURE, "Decisions": "Block YAML read directly").

use serde_json::{Map, Number, Value};

/// Deeper documents are left to the parser, which enforces the budget (`MAX_DEPTH`) with its
/// own message.
const DEEPEST: usize = super::MAX_DEPTH - 2;

/// A line that holds something: its indentation and the rest, trailing spaces removed.
#[derive(Clone, Copy)]
struct Line<'a> {
    indent: usize,
    text: &'a str,
}

/// The document's value, or `None` where it is not of the shape read here.
pub(super) fn read(text: &str) -> Option<Value> {
    if !text.is_ascii() || text.contains(['\t', '\r']) {
        return None;
    }
    let mut lines = Vec::with_capacity(text.len() / 16);
    for raw in text.split('\n') {
        let content = raw.trim_start_matches(' ');
        if content.is_empty() || content.starts_with('#') {
            continue;
        }
        let indent = raw.len() - content.len();
        // Directives and document markers.
        if indent == 0 && (content.starts_with("---") || content.starts_with("...") || content.starts_with('%')) {
            return None;
        }
        lines.push(Line { indent, text: content.trim_end_matches(' ') });
    }
    if lines.first()?.indent != 0 {
        return None;
    }
    let mut reader = Reader { lines, at: 0 };
    let value = reader.mapping(0, 1)?;
    (reader.at == reader.lines.len()).then_some(value)
}

struct Reader<'a> {
    lines: Vec<Line<'a>>,
    /// The next line to read.
    at: usize,
}

impl<'a> Reader<'a> {
    fn peek(&self) -> Option<Line<'a>> {
        self.lines.get(self.at).copied()
    }

    /// The block node whose first line is the next one, at `indent`.
    fn node(&mut self, indent: usize, depth: usize) -> Option<Value> {
        if is_item(self.peek()?.text) { self.sequence(indent, depth) } else { self.mapping(indent, depth) }
    }

    /// The value of a key or item that had nothing after it on its line: a block node more
    /// indented than `indent` (or, after a key, a sequence at the same indentation), else null.
    fn nested(&mut self, indent: usize, depth: usize, after_key: bool) -> Option<Value> {
        if depth > DEEPEST {
            return None;
        }
        match self.peek() {
            Some(next) if next.indent > indent => self.node(next.indent, depth),
            Some(next) if after_key && next.indent == indent && is_item(next.text) => self.sequence(indent, depth),
            _ => Some(Value::Null),
        }
    }

    /// A scalar ends its line: a more indented line after it would continue it (a multi-line
    /// scalar), which is left to the parser.
    fn ended(&self, indent: usize) -> bool {
        self.peek().is_none_or(|next| next.indent <= indent)
    }

    fn mapping(&mut self, indent: usize, depth: usize) -> Option<Value> {
        let mut map = Map::new();
        while let Some(line) = self.peek() {
            if line.indent < indent || (line.indent == indent && is_item(line.text) && !map.is_empty()) {
                break;
            }
            if line.indent > indent {
                return None;
            }
            let (key, rest) = split_key(line.text)?;
            if map.contains_key(key) {
                return None;
            }
            self.at += 1;
            let value = if rest.is_empty() {
                self.nested(indent, depth + 1, true)?
            } else {
                let value = scalar(rest, depth + 1)?;
                if !self.ended(indent) {
                    return None;
                }
                value
            };
            map.insert(key.to_owned(), value);
        }
        // An item where the mapping's first key should be is not a mapping.
        (!map.is_empty()).then_some(Value::Object(map))
    }

    fn sequence(&mut self, indent: usize, depth: usize) -> Option<Value> {
        let mut items = Vec::new();
        while let Some(line) = self.peek() {
            if line.indent < indent || (line.indent == indent && !is_item(line.text)) {
                break;
            }
            if line.indent > indent {
                return None;
            }
            let content = line.text[1..].trim_start_matches(' ');
            if content.is_empty() {
                self.at += 1;
                items.push(self.nested(indent, depth + 1, false)?);
            } else if content.starts_with('#') || is_item(content) {
                // A comment after the dash, or a sequence begun on the item's line.
                return None;
            } else if split_key(content).is_some() {
                // A mapping begun on the item's line: its keys line up with the first one.
                let column = indent + line.text.len() - content.len();
                self.lines[self.at] = Line { indent: column, text: content };
                items.push(self.mapping(column, depth + 1)?);
            } else {
                self.at += 1;
                items.push(scalar(content, depth + 1)?);
                if !self.ended(indent) {
                    return None;
                }
            }
        }
        Some(Value::Array(items))
    }
}

fn is_item(text: &str) -> bool {
    text == "-" || text.starts_with("- ")
}

/// `key: rest` with a `plain_key`; `rest` is empty where only a comment follows.
fn split_key(text: &str) -> Option<(&str, &str)> {
    let (key, after) = text.split_at(text.find(':')?);
    if !plain_key(key) {
        return None;
    }
    let rest = after.strip_prefix(':')?;
    if rest.is_empty() {
        return Some((key, rest));
    }
    let rest = rest.strip_prefix(' ')?.trim_start_matches(' ');
    Some((key, if rest.starts_with('#') { "" } else { rest }))
}

/// A key of letters, digits and `_-./` that begins with a letter or `_` and is not a word some
/// schema reads as other than a string: what both schemas read as the same string.
fn plain_key(key: &str) -> bool {
    key.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && key.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'))
        && !special_word(key)
}

/// Words some YAML schema reads as other than a string, in any case.
fn special_word(word: &str) -> bool {
    const WORDS: [&str; 12] = ["null", "true", "false", "yes", "no", "on", "off", "y", "n", "nan", "inf", "infinity"];
    WORDS.iter().any(|w| w.eq_ignore_ascii_case(word))
}

/// A one-line value after a key or dash, at `depth`, with any trailing comment: a scalar, or a
/// flow collection that closes on its line.
fn scalar(text: &str, depth: usize) -> Option<Value> {
    let (value, rest) = match text.as_bytes()[0] {
        b'\'' | b'"' => quoted(text).map(|(s, rest)| (Value::String(s), rest))?,
        b'[' | b'{' => {
            let mut flow = Flow { text, at: 0 };
            (flow.node(depth)?, &text[flow.at..])
        }
        _ => return resolve(plain(text)?),
    };
    let ends = rest.is_empty() || (rest.starts_with(' ') && rest.trim_start_matches(' ').starts_with('#'));
    ends.then_some(value)
}

/// A plain scalar: the text before a comment, which must not hold what would make it a mapping.
fn plain(text: &str) -> Option<&str> {
    let text = text.find(" #").map_or(text, |end| &text[..end]).trim_end_matches(' ');
    (!text.contains(": ") && !text.ends_with(':')).then_some(text)
}

/// What a plain scalar stands for: null, a boolean, a number or a string.
fn resolve(word: &str) -> Option<Value> {
    match *word.as_bytes().first()? {
        b'0'..=b'9' | b'-' => number_or_string(word),
        b'a'..=b'z' | b'A'..=b'Z' | b'_' | b'/' | b'$' | b'(' | b'^' | b'~' => match word {
            "~" | "null" | "Null" | "NULL" => Some(Value::Null),
            "true" | "True" | "TRUE" => Some(Value::Bool(true)),
            "false" | "False" | "FALSE" => Some(Value::Bool(false)),
            _ if special_word(word) || word.starts_with('~') => None,
            _ => Some(Value::String(word.to_owned())),
        },
        _ => None,
    }
}

/// A quoted scalar that closes on its line, and the text after it. Single quotes double a quote
/// inside; double-quoted text with escapes is left to the parser.
fn quoted(text: &str) -> Option<(String, &str)> {
    let quote = text.chars().next()?;
    let mut out = String::new();
    let mut chars = text[1..].char_indices();
    while let Some((i, c)) = chars.next() {
        let rest = &text[1 + i + 1..];
        match c {
            '\\' if quote == '"' => return None,
            c if c != quote => out.push(c),
            '\'' if rest.starts_with('\'') => {
                out.push('\'');
                chars.next();
            }
            _ => return Some((out, rest)),
        }
    }
    None
}

/// A flow collection on one line (`[a, b]`, `{r: 4, modules: [q, v]}`) of plain keys and one-line
/// scalars. Plain scalars here hold no `:` or `#`, and no trailing comma is read.
struct Flow<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Flow<'a> {
    fn rest(&self) -> &'a str {
        &self.text[self.at..]
    }

    fn skip_spaces(&mut self) {
        self.at = self.text.len() - self.rest().trim_start_matches(' ').len();
    }

    /// Takes `byte` if it comes next.
    fn take(&mut self, byte: u8) -> bool {
        let next = self.rest().as_bytes().first() == Some(&byte);
        self.at += usize::from(next);
        next
    }

    fn node(&mut self, depth: usize) -> Option<Value> {
        if depth > DEEPEST {
            return None;
        }
        self.skip_spaces();
        match *self.rest().as_bytes().first()? {
            b'[' => self.sequence(depth),
            b'{' => self.mapping(depth),
            b'\'' | b'"' => {
                let (value, rest) = quoted(self.rest())?;
                self.at = self.text.len() - rest.len();
                Some(Value::String(value))
            }
            _ => {
                let end = self.rest().find([',', '[', ']', '{', '}']).unwrap_or(self.rest().len());
                let word = self.rest()[..end].trim_end_matches(' ');
                if word.contains([':', '#']) {
                    return None;
                }
                self.at += end;
                resolve(word)
            }
        }
    }

    /// Reads `open`, then items with `item` separated by commas, then `close`.
    fn items(&mut self, open: u8, close: u8, mut item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.take(open);
        self.skip_spaces();
        if self.take(close) {
            return Some(());
        }
        loop {
            item(self)?;
            self.skip_spaces();
            if self.take(close) {
                return Some(());
            }
            if !self.take(b',') {
                return None;
            }
            self.skip_spaces();
            if self.rest().starts_with(char::from(close)) {
                return None;
            }
        }
    }

    fn sequence(&mut self, depth: usize) -> Option<Value> {
        let mut items = Vec::new();
        self.items(b'[', b']', |flow| {
            items.push(flow.node(depth + 1)?);
            Some(())
        })?;
        Some(Value::Array(items))
    }

    fn mapping(&mut self, depth: usize) -> Option<Value> {
        let mut map = Map::new();
        self.items(b'{', b'}', |flow| {
            let end = flow.rest().find(':')?;
            let key = &flow.rest()[..end];
            if !plain_key(key) || map.contains_key(key) {
                return None;
            }
            flow.at += end + 1;
            if !flow.take(b' ') {
                return None;
            }
            let value = flow.node(depth + 1)?;
            map.insert(key.to_owned(), value);
            Some(())
        })?;
        Some(Value::Object(map))
    }
}

/// `12`, `-3`, `1.5`, `5e-5` and `2.0E+3` as numbers; a word that begins with digits but holds a
/// letter no number form uses (`64Mi`, `1h30m`) as a string; anything else (`007`, `0x1F`,
/// `1_000`, `.5`, `+1`, `12:30`) is left to the parser.
fn number_or_string(word: &str) -> Option<Value> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let unsigned = word.strip_prefix('-').unwrap_or(word);
    let (mantissa, exponent) = match unsigned.split_once(['e', 'E']) {
        Some((m, e)) => (m, Some(e.strip_prefix(['-', '+']).unwrap_or(e))),
        None => (unsigned, None),
    };
    let (int, frac) = match mantissa.split_once('.') {
        Some((int, frac)) => (int, Some(frac)),
        None => (mantissa, None),
    };
    let int_ok = digits(int) && (int == "0" || !int.starts_with('0'));
    if int_ok && frac.is_none_or(digits) && exponent.is_none_or(digits) {
        return if frac.is_none() && exponent.is_none() {
            word.parse::<i64>().ok().map(Value::from)
        } else {
            word.parse::<f64>().ok().and_then(Number::from_f64).map(Value::Number)
        };
    }
    let number_like =
        |b: u8| b.is_ascii_hexdigit() || matches!(b, b'x' | b'X' | b'o' | b'O' | b'_' | b'.' | b'+' | b'-' | b':');
    let starts_with_digit = word.as_bytes()[0].is_ascii_digit();
    (starts_with_digit && !word.bytes().all(number_like)).then(|| Value::String(word.to_owned()))
}

#[cfg(test)]
#[path = "../../tests/common/rng.rs"]
mod rng;

#[cfg(test)]
mod tests {
    use super::read;
    use super::rng;
    use crate::decode::parse_yaml;

    /// `read` answers for `doc`, with what the parser reads.
    fn reads_as_the_parser(doc: &str) {
        let ours = read(doc).unwrap_or_else(|| panic!("not read directly:\n{doc}"));
        assert_eq!(Ok(&ours), parse_yaml(doc).as_ref(), "read differently from the parser:\n{doc}");
    }

    #[test]
    fn the_common_shape_reads_as_the_parser_reads_it() {
        let bench = "apiVersion: flowmesh/v1\nmetadata:\n  name: bench-echo-7\n  owner: flowmesh-bench\nkind: EchoTask\nspec:\n  taskType: echo\n  resources:\n    hardware:\n      cpu: 1\n      memory: 64Mi\n  maxAttempts: 1\n  data:\n    type: list\n    items:\n      - bench\n";
        for doc in [
            bench,
            "a: 1\nb: -3\nc: 1.5\nd: 3.10\ne: 0\nf: -0\ng: 9223372036854775807\nh: 5e-5\ni: 2.0E+3\nj: 1e3\n",
            "a: ~\nb: null\nc: Null\nd: NULL\ne:\nf: true\ng: False\nh: TRUE\n",
            "a: 64Mi\nb: 1h30m\nc: http://host:80/x\nd: a#b\ne: x # a comment\nf: 'it''s # not a comment'\ng: \"dq 'x'\"\nh: ''\ni: \"\"\n",
            "# leading comment\n\nkey: value   \n  # indented comment\nother: $HOME/x # trailing\n",
            "list:\n- a\n- b\nnext: 1\n",
            "list:\n  -   a\n  - b: 1\n    c: x]\n  -\n    d: 2\n  - \n",
            "stages:\n  - name: s1\n    spec:\n      data:\n        items:\n        - x\n        - z\n  - name: s2\n    dependsOn:\n      - s1\n",
            "deep:\n    four:\n        spaces: yes_please\n",
            "a: [1, -2, 1.5, x, 'q', \"d\", ~, true, 64Mi]\nb: {}\nc: []\n",
            "lora: {r: 4, alpha: 8, target_modules: [q_proj, v_proj]}  # flow\nout: [results.json, artifacts/]\n",
            "seq:\n- [a, b]\n- {k: v}\n",
            "nvidia.com/gpu: 1\nCUDA_VISIBLE_DEVICES: '0,1'\n_x: /data/a b\n",
        ] {
            reads_as_the_parser(doc);
        }
    }

    #[test]
    fn everything_else_is_left_to_the_parser() {
        for doc in [
            "a: [1, 2,]\n",
            "a: [a: b]\n",
            "a: {b:1}\n",
            "a: {\"b\": 1}\n",
            "a: {b: 1, b: 2}\n",
            "a: [x #c]\n",
            "a: [http://x]\n",
            "a: [1,\n  2]\n",
            "a: [1] x\n",
            "a: [[1]\n",
            // Deeper than the budget only in block and flow levels together.
            &((0..40).map(|i| format!("{}k:\n", " ".repeat(2 * i))).collect::<String>()
                + &format!("{}k: {}1{}\n", " ".repeat(80), "[".repeat(30), "]".repeat(30))),
            "a: &x 1\nb: *x\n",
            "a: !!str 1\n",
            "a: |\n  text\n",
            "a: >\n  text\n",
            "a: one\n  two\n",
            "a:\n  plain on the next line\n",
            "a: 1\na: 2\n",
            "a: 0x1F\n",
            "a: 1e999\n",
            "a: .inf\n",
            "a: 007\n",
            "a: 2024-01-01\n",
            "a: 12:30\n",
            "a: 1_000\n",
            "a: +1\n",
            "a: yes\n",
            "a: On\n",
            "a: NaN\n",
            "a: 9223372036854775808\n",
            "a: \"tab\\tescaped\"\n",
            "a: 'open\n  close'\n",
            "a: b: c\n",
            "a:\tb\n",
            "a: b\r\n",
            "a: caf\u{e9}\n",
            "---\na: 1\n",
            "%YAML 1.2\n---\na: 1\n",
            "key : value\n",
            "\"quoted key\": 1\n",
            "1: one\n",
            "true: x\n",
            "- a\n- b\n",
            "  a: 1\n",
            "a: 1\n  b: 2\n",
            "a:\n  - x\n   - y\n",
            "a:\n- - x\n",
            "a:\n- # comment\n  x\n",
            "? a\n: b\n",
            "<<: {a: 1}\n",
            "just a scalar\n",
            "# only a comment\n",
            "",
        ] {
            assert_eq!(read(doc), None, "read directly, but should be left to the parser:\n{doc}");
        }
    }

    #[test]
    fn every_example_read_directly_reads_as_the_parser_reads_it() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
        let (mut read_directly, mut yaml) = (0, 0);
        for kind in ["valid", "invalid", "n8n"] {
            for entry in std::fs::read_dir(root.join(kind)).expect("examples folder") {
                let path = entry.expect("example").path();
                if path.extension().is_none_or(|e| e != "yaml" && e != "yml") {
                    continue;
                }
                yaml += 1;
                let doc = std::fs::read_to_string(&path).expect("readable example");
                if let Some(ours) = read(&doc) {
                    read_directly += 1;
                    assert_eq!(Ok(&ours), parse_yaml(&doc).as_ref(), "{} read differently", path.display());
                }
            }
        }
        // The examples are the documents users write: most of them take the direct path.
        assert!(read_directly * 2 > yaml, "only {read_directly} of {yaml} examples read directly");
    }

    /// Values as documents hold them most often.
    const COMMON: [&str; 27] = [
        "bench",
        "64Mi",
        "1",
        "-3",
        "0",
        "1.5",
        "3.10",
        "5e-5",
        "2.0E+3",
        "true",
        "false",
        "~",
        "'quoted'",
        "'it''s'",
        "\"dq\"",
        "''",
        "a b",
        "http://x:80/y",
        "a#b",
        "${s0.count}",
        "/data/x",
        "[a, 'b', 1.5]",
        "{a: [1, x], b: ~}",
        "[]",
        "{}",
        "{a: b,c: d}",
        "1 apple",
    ];
    /// Values that look alike to a person and not to YAML.
    const ODD: [&str; 51] = [
        "-0",
        "007",
        "-0.0",
        "1.",
        ".5",
        "1e3",
        "1e999",
        "1.5e3x",
        "0e0",
        "00.5",
        "-.5",
        "0x1F",
        "0o17",
        "1_000",
        "+1",
        "2024-01-01",
        "12:30",
        "1h30m",
        ".inf",
        "-.inf",
        ".nan",
        "NaN",
        "Null",
        "NULL",
        "nULL",
        "True",
        "TRUE",
        "tRUE",
        "yes",
        "No",
        "on",
        "OFF",
        "y",
        "\"a\\tb\"",
        "a: b",
        "a:b",
        "a #c",
        "$HOME",
        "-",
        "!!str 1",
        "&a x",
        "*a",
        "|",
        "=x",
        "9223372036854775808",
        "[a, b,]",
        "[http://x]",
        "{a:1}",
        "[a #c]",
        "{a: 1, a: 2}",
        "[[a], {b: [c]}]",
    ];
    const KEYS: [&str; 9] = ["name", "spec", "a", "b_c", "x.y", "k8s/app", "data", "items", "on_x"];
    const ODD_KEYS: [&str; 4] = ["yes", "1a", "null", "a b"];

    struct Gen {
        rng: rng::Rng,
        out: String,
    }

    impl Gen {
        fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
            from[self.rng.below(from.len())]
        }

        fn spaces(&mut self) -> &'static str {
            ["", "", "", " ", "  "][self.rng.below(5)]
        }

        fn comment(&mut self) -> &'static str {
            ["", "", "", " # note", "#tight"][self.rng.below(5)]
        }

        /// A value after `key:` or `-` on a line at `indent`: a scalar on the same line, or a
        /// nested node on the next ones.
        fn value(&mut self, indent: usize, depth: usize, after_key: bool) {
            let step = [2, 2, 4, 3][self.rng.below(4)];
            match self.rng.below(if depth > 3 { 1 } else { 4 }) {
                0 => {
                    let pool: &[&str] = if self.rng.below(6) == 0 { &ODD } else { &COMMON };
                    let (s, scalar, c) = (self.spaces(), self.pick(pool), self.comment());
                    self.out += &format!(" {s}{scalar}{c}\n");
                }
                1 => {
                    self.out += "\n";
                    self.mapping(indent + step, depth + 1);
                }
                2 => {
                    self.out += "\n";
                    let at = if after_key && self.rng.below(2) == 0 { indent } else { indent + step };
                    self.sequence(at, depth + 1);
                }
                _ => self.out += "\n",
            }
        }

        fn mapping(&mut self, indent: usize, depth: usize) {
            for _ in 0..1 + self.rng.below(3) {
                self.key_line(indent, depth);
            }
        }

        fn key(&mut self) -> &'static str {
            if self.rng.below(12) == 0 { self.pick(&ODD_KEYS) } else { self.pick(&KEYS) }
        }

        fn key_line(&mut self, indent: usize, depth: usize) {
            if self.rng.below(8) == 0 {
                self.out += &format!("{}# between\n", " ".repeat(self.rng.below(6)));
            }
            let key = self.key();
            self.out += &format!("{}{key}:", " ".repeat(indent));
            self.value(indent, depth, true);
        }

        fn sequence(&mut self, indent: usize, depth: usize) {
            for _ in 0..1 + self.rng.below(3) {
                let gap = [" ", " ", "   "][self.rng.below(3)];
                if self.rng.below(3) == 0 && depth < 4 {
                    // A mapping begun on the item's line.
                    let key = self.key();
                    self.out += &format!("{}-{gap}{key}:", " ".repeat(indent));
                    let column = indent + 1 + gap.len();
                    self.value(column, depth + 1, true);
                    if self.rng.below(2) == 0 {
                        self.key_line(column, depth + 1);
                    }
                } else {
                    self.out += &format!("{}-", " ".repeat(indent));
                    self.value(indent, depth, false);
                }
            }
        }
    }

    #[test]
    fn generated_documents_read_directly_read_as_the_parser_reads_them() {
        let mut doc = Gen { rng: rng::Rng(0x5eed_b10c), out: String::new() };
        let (mut read_directly, total) = (0, 10_000);
        for _ in 0..total {
            doc.out.clear();
            doc.mapping(0, 0);
            if let Some(ours) = read(&doc.out) {
                read_directly += 1;
                assert_eq!(Ok(&ours), parse_yaml(&doc.out).as_ref(), "read differently from the parser:\n{}", doc.out);
            }
        }
        // Most scalars are of the common shape, so the direct path must answer often.
        assert!(read_directly * 4 > total, "only {read_directly} of {total} generated documents read directly");
    }
}
