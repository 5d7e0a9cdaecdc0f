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
    let token = token.to_string().replace('~', "~0").replace('/', "~1");
    if path == "/" { format!("/{token}") } else { format!("{path}/{token}") }
}
