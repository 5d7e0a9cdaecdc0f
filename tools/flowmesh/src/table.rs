//! Aligned text tables for people; scripts use `--json`.

/// A typed line of a table: its columns' headers, and its cells in their order.
pub trait Row {
    const HEADERS: &'static [&'static str];
    fn cells(&self) -> Vec<String>;
}

/// Renders typed rows under their headers.
pub fn rows<R: Row>(rows: &[R]) -> String {
    render(R::HEADERS, &rows.iter().map(Row::cells).collect::<Vec<_>>())
}

/// Renders rows under headers, each column as wide as its widest cell.
pub fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
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
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
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
}
