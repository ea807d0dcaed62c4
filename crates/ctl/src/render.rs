//! Human-readable output: aligned tables, key/value blocks, ages. `--json` output does not come
//! through here; it is the serde form of the same values, so scripts never parse these tables.

use std::fmt::Write as _;

/// Longest cell printed in a table; longer text (errors, reasons) is cut with `...`, the full
/// text is in `show` and in `--json`.
pub const CELL_CHARS_MAX: usize = 72;
/// Space between two table columns.
const COLUMN_GAP: &str = "  ";

/// A table with a header row, printed with every column as wide as its widest cell.
#[derive(Debug)]
pub struct Table {
    header: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&'static str]) -> Table {
        Table { header: header.to_vec(), rows: Vec::new() }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells.into_iter().map(|cell| cut(&cell)).collect());
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (index, cell) in row.iter().enumerate() {
                if let Some(width) = widths.get_mut(index) {
                    *width = (*width).max(cell.chars().count());
                }
            }
        }
        let mut out = String::new();
        let header: Vec<String> = self.header.iter().map(|h| (*h).to_owned()).collect();
        for row in std::iter::once(&header).chain(&self.rows) {
            out.push_str(&line(row, &widths));
            out.push('\n');
        }
        out
    }
}

fn line(cells: &[String], widths: &[usize]) -> String {
    let mut out = String::new();
    for (index, cell) in cells.iter().enumerate() {
        if index > 0 {
            out.push_str(COLUMN_GAP);
        }
        out.push_str(cell);
        // The last column is not padded, so lines carry no trailing spaces.
        if index + 1 < cells.len() {
            let pad = widths.get(index).copied().unwrap_or(0).saturating_sub(cell.chars().count());
            out.extend(std::iter::repeat_n(' ', pad));
        }
    }
    out
}

/// `key  value` lines with the keys aligned, for one record.
pub fn block(pairs: &[(&str, String)]) -> String {
    let width = pairs.iter().map(|(key, _)| key.len()).max().unwrap_or(0);
    let mut out = String::new();
    for (key, value) in pairs {
        let _ = writeln!(out, "  {key:<width$}  {value}");
    }
    out
}

/// Text cut to [`CELL_CHARS_MAX`] characters, on one line.
pub fn cut(text: &str) -> String {
    let one_line = text.replace(['\n', '\r'], " ");
    if one_line.chars().count() <= CELL_CHARS_MAX {
        return one_line;
    }
    let kept: String = one_line.chars().take(CELL_CHARS_MAX - 3).collect();
    format!("{kept}...")
}

/// An optional value, `-` when absent.
pub fn or_dash<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// How long before `now_ms` the time `at_ms` was: `850ms`, `12s`, `5m03s`, `2h04m`, `3d02h`.
/// A time in the future (a lease still running) reads `in 12s`.
pub fn age(at_ms: i64, now_ms: i64) -> String {
    let delta = now_ms - at_ms;
    if delta < 0 {
        return format!("in {}", span(-delta));
    }
    format!("{} ago", span(delta))
}

fn span(ms: i64) -> String {
    let seconds = ms / 1_000;
    match seconds {
        _ if ms < 1_000 => format!("{ms}ms"),
        0..60 => format!("{seconds}s"),
        60..3_600 => format!("{}m{:02}s", seconds / 60, seconds % 60),
        3_600..86_400 => format!("{}h{:02}m", seconds / 3_600, seconds % 3_600 / 60),
        _ => format!("{}d{:02}h", seconds / 86_400, seconds % 86_400 / 3_600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_and_cut() {
        let mut table = Table::new(&["BIZ_ID", "STATUS"]);
        table.row(vec!["O-1:PAID".into(), "DONE".into()]);
        table.row(vec!["O-22:PAID".into(), "x".repeat(100)]);
        let text = table.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "BIZ_ID     STATUS");
        assert_eq!(lines[1], "O-1:PAID   DONE");
        assert!(lines[2].ends_with("...") && lines[2].chars().count() == 11 + CELL_CHARS_MAX, "{}", lines[2]);
    }

    #[test]
    fn ages_read_naturally() {
        let cases = [(0, "0ms ago"), (850, "850ms ago"), (12_000, "12s ago"), (303_000, "5m03s ago")];
        for (delta, expected) in cases {
            assert_eq!(age(1_000_000 - delta, 1_000_000), expected);
        }
        assert_eq!(age(0, 7_440_000), "2h04m ago");
        assert_eq!(age(0, 266_400_000), "3d02h ago");
        assert_eq!(age(12_000, 0), "in 12s");
    }
}
