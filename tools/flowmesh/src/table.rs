//! Aligned text tables for people; scripts use `--json`. And what makes any text fit to print.

use std::borrow::Cow;

/// `text` as a terminal may show it: every control character (escape sequences, carriage
/// returns, backspaces, newlines) and every bidirectional override written out as its escape
/// (`\u{1b}`, `\n`), the rest as it is. Much of what the CLI prints comes from workers (their
/// ids, hosts and tags, failure messages, progress notes, even an event's `time`), and a
/// worker must not be able to write to an operator's terminal: clear it, retitle it, hide a
/// line or make one read backwards. `--json` output is escaped by the JSON encoder instead.
pub fn printable(text: &str) -> Cow<'_, str> {
    let unsafe_char = |c: char| c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    if !text.contains(unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_char(c) {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A typed line of a table: its columns' headers, and its cells in their order.
pub trait Row {
    const HEADERS: &'static [&'static str];
    fn cells(&self) -> Vec<String>;
}

/// Renders typed rows under their headers.
pub fn rows<R: Row>(rows: &[R]) -> String {
    render(R::HEADERS, &rows.iter().map(Row::cells).collect::<Vec<_>>())
}

/// Renders rows under headers, each column as wide as its widest cell, each cell
/// [`printable`].
pub fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<Cow<'_, str>>> =
        rows.iter().map(|row| row.iter().map(|cell| printable(cell)).collect()).collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (i, cell) in row.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            let pad = widths[i].saturating_sub(cell.chars().count());
            out.push_str(cell);
            if i + 1 < cells.len() {
                out.push_str(&" ".repeat(pad + 2));
            }
        }
        out.trim_end().to_owned()
    };
    let mut out = line(headers.to_vec());
    out.push('\n');
    for row in &rows {
        out.push_str(&line(row.iter().map(|cell| cell.as_ref()).collect()));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn aligns_columns() {
        let out = super::render(
            &["ID", "STATUS"],
            &[vec!["wf-1".into(), "completed".into()], vec!["wf-10".into(), "failed".into()]],
        );
        assert_eq!(out, "ID     STATUS\nwf-1   completed\nwf-10  failed\n");
    }

    #[test]
    fn text_from_workers_prints_as_text_never_as_terminal_commands() {
        use super::printable;
        for (text, shown) in [
            ("plain, with é and 日本", "plain, with é and 日本"),
            ("\x1b[2J\x1b[Hall clear", "\\u{1b}[2J\\u{1b}[Hall clear"),
            ("\x1b]0;owned\x07", "\\u{1b}]0;owned\\u{7}"),
            ("done\rfailed", "done\\rfailed"),
            ("two\nlines\tand a tab", "two\\nlines\\tand a tab"),
            ("\u{9b}31m", "\\u{9b}31m"),
            ("abc\u{202e}fed", "abc\\u{202e}fed"),
            ("back\x08space", "back\\u{8}space"),
        ] {
            assert_eq!(printable(text), shown, "{text:?}");
        }
        // A table escapes its cells and aligns what it shows.
        let out =
            super::render(&["ID", "NOTE"], &[vec!["w\x1b1".into(), "a\rb".into()], vec!["w2".into(), "ok".into()]]);
        assert_eq!(out, "ID        NOTE\nw\\u{1b}1  a\\rb\nw2        ok\n");
    }
}
