//! Memory quantities: `<int><K|M|G|T>[i][B]` in binary units, or a bare integer of bytes.

use serde_json::Value;

/// Parses a memory quantity. `40GB`, `40G`, `40Gi` and `40GiB` are all 40 GiB; `1024` is bytes.
/// Anything else is an error, never zero.
pub fn parse_memory(text: &str) -> Result<u64, String> {
    let s = text.trim();
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, suffix) = s.split_at(digits_end);
    if digits.is_empty() {
        return Err(format!("expected a memory size like 16Gi, 512M or 1024, found {text:?}"));
    }
    let shift = match suffix {
        "" | "B" => 0,
        "K" | "Ki" | "KB" | "KiB" => 10,
        "M" | "Mi" | "MB" | "MiB" => 20,
        "G" | "Gi" | "GB" | "GiB" => 30,
        "T" | "Ti" | "TB" | "TiB" => 40,
        _ => {
            return Err(format!(
                "expected a memory size like 16Gi, 512M or 1024 (whole numbers, units K/M/G/T), found {text:?}"
            ));
        }
    };
    let n: u64 = digits.parse().map_err(|_| format!("memory size {text:?} is too large"))?;
    n.checked_mul(1u64 << shift).ok_or_else(|| format!("memory size {text:?} is too large"))
}

/// Reads a memory value from JSON: a string as above or a non-negative integer of bytes.
pub fn memory_value(value: &Value) -> Result<u64, String> {
    match value {
        Value::String(s) => parse_memory(s),
        Value::Number(n) => {
            n.as_u64().ok_or_else(|| format!("expected a non-negative whole number of bytes, found {n}"))
        }
        other => Err(format!("expected a memory size like 16Gi, found {other}")),
    }
}

/// Formats bytes for people: `40 GiB`, `512 MiB`, `1.5 GiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if value.fract() == 0.0 { format!("{value:.0} {}", UNITS[unit]) } else { format!("{value:.1} {}", UNITS[unit]) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_strings() {
        let gib = 1u64 << 30;
        let cases: &[(&str, Option<u64>)] = &[
            ("40GB", Some(40 * gib)),
            ("40G", Some(40 * gib)),
            ("40Gi", Some(40 * gib)),
            ("40GiB", Some(40 * gib)),
            ("512Mi", Some(512 << 20)),
            ("1T", Some(1 << 40)),
            ("1024", Some(1024)),
            ("0", Some(0)),
            ("1.5Gi", None),
            ("lots", None),
            ("-1G", None),
            ("", None),
            ("G", None),
            ("10 Gi", None),
            ("10gb", None),
            ("99999999999999T", None),
        ];
        for (text, want) in cases {
            assert_eq!(parse_memory(text).ok(), *want, "parse_memory({text:?})");
        }
    }

    #[test]
    fn formats_bytes() {
        assert_eq!(format_bytes(40 << 30), "40 GiB");
        assert_eq!(format_bytes(3 << 29), "1.5 GiB");
        assert_eq!(format_bytes(12), "12 B");
    }
}
