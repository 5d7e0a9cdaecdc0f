//! One thing wrong with a submission, located by a JSON-pointer-like path.

use serde::{Deserialize, Serialize};

/// A single validation problem. `path` is a JSON pointer into the document as submitted
/// (`/spec/stages/1/dependsOn/0`); `/` stands for the document as a whole.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Problem {
    pub path: String,
    pub message: String,
    /// 1-based position in the YAML source, where the decoder knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub column: Option<u64>,
}

impl Problem {
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        let path = path.into();
        let path = if path.is_empty() { "/".to_owned() } else { path };
        Problem { path, message: message.into(), line: None, column: None }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.message)?;
        if let (Some(line), Some(col)) = (self.line, self.column) {
            write!(f, " (line {line}, column {col})")?;
        }
        Ok(())
    }
}

/// Appends a token to a JSON pointer, escaping `~` and `/` as RFC 6901 requires.
pub fn push(path: &str, token: impl std::fmt::Display) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(path.len() + 16);
    if path != "/" {
        out.push_str(path);
    }
    out.push('/');
    let start = out.len();
    write!(out, "{token}").expect("writing to a String");
    if out[start..].contains(['~', '/']) {
        let escaped = out[start..].replace('~', "~0").replace('/', "~1");
        out.truncate(start);
        out.push_str(&escaped);
    }
    out
}

/// Problems a rejection lists; the rest are counted.
pub const MAX_LISTED: usize = 100;
/// The longest path or message a rejection keeps (in bytes, cut at a character boundary).
pub const MAX_TEXT_BYTES: usize = 1024;

/// The problems a rejection carries: the first [`MAX_LISTED`] (in the order given), each path and
/// message cut to [`MAX_TEXT_BYTES`], and, when some were left out, a last problem at `/` that
/// counts them. So a rejection stays far below the event size limit whatever the document held
/// (100 × 2 KiB of text at most).
pub fn cap(mut problems: Vec<Problem>) -> Vec<Problem> {
    let more = problems.len().saturating_sub(MAX_LISTED);
    problems.truncate(MAX_LISTED);
    for p in &mut problems {
        cut(&mut p.path);
        cut(&mut p.message);
    }
    if more > 0 {
        problems.push(Problem::new("/", format!("and {more} more problems not listed (the first {MAX_LISTED} are)")));
    }
    problems
}

fn cut(text: &mut String) {
    cut_text(text, MAX_TEXT_BYTES);
}

/// Cuts `text` to at most `max` bytes, an ellipsis included where it cut, at a character
/// boundary: what it cuts is often someone else's text (a message quoting the value it
/// refuses), and `String::truncate` inside a character panics.
pub fn cut_text(text: &mut String, max: usize) {
    if text.len() > max {
        let mut end = max.saturating_sub("…".len());
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_appended_to_a_pointer_escaped_as_rfc_6901_says() {
        for (path, token, want) in [
            ("/", "spec", "/spec"),
            ("", "spec", "/spec"),
            ("/spec", "stages", "/spec/stages"),
            ("/spec/stages", "3", "/spec/stages/3"),
            ("/spec", "a/b", "/spec/a~1b"),
            ("/spec", "~x", "/spec/~0x"),
            ("/spec", "~/", "/spec/~0~1"),
            ("/spec", "", "/spec/"),
        ] {
            assert_eq!(push(path, token), want, "{path} + {token:?}");
        }
        assert_eq!(push("/items", 12), "/items/12");
    }

    #[test]
    fn a_rejection_lists_a_bounded_number_of_bounded_problems() {
        let many = |n: usize, len: usize| -> Vec<Problem> {
            (0..n).map(|i| Problem::new(format!("/k{i}"), "é".repeat(len))).collect()
        };
        for (n, len, listed, last) in [
            (0, 1, 0, None),
            (3, 1, 3, Some("/k2")),
            (100, 1, 100, Some("/k99")),
            (101, 1, 101, Some("and 1 more problems not listed (the first 100 are)")),
            (50_000, 4000, 101, Some("and 49900 more problems not listed (the first 100 are)")),
        ] {
            let capped = cap(many(n, len));
            assert_eq!(capped.len(), listed, "{n} problems");
            let shown = capped.last().map(|p| if p.path == "/" { p.message.as_str() } else { p.path.as_str() });
            assert_eq!(shown, last, "{n} problems");
            assert!(capped.iter().all(|p| p.message.len() <= MAX_TEXT_BYTES && p.path.len() <= MAX_TEXT_BYTES));
            assert!(serde_json::to_vec(&capped).unwrap().len() < 256 * 1024);
        }
    }
}
