//! Wall-clock readings for the shell; the domain gets them passed in.

use std::fmt::Write;
use std::time::{SystemTime, UNIX_EPOCH};

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// A server timestamp (a KV entry's `created`, say) in unix ms; 0 before the epoch.
pub fn unix_ms(t: time::OffsetDateTime) -> u64 {
    u64::try_from(t.unix_timestamp_nanos() / 1_000_000).unwrap_or(0)
}

/// RFC 3339 in UTC with milliseconds, e.g. `2026-11-23T00:05:53.123Z`.
pub fn now_rfc3339() -> String {
    rfc3339(now_ms())
}

pub fn rfc3339(ms: u64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    // Written into its final size: `format!` grew its string three times on the way.
    let mut text = String::with_capacity("2026-11-23T00:05:53.123Z".len());
    let _ = write!(
        text,
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    );
    text
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339_spells_utc_with_milliseconds() {
        for (ms, text) in [
            (0, "1970-01-01T00:00:00.000Z"),
            (1_795_392_353_123, "2026-11-23T00:05:53.123Z"),
            (253_402_300_799_999, "9999-12-31T23:59:59.999Z"),
        ] {
            assert_eq!(super::rfc3339(ms), text, "{ms}");
        }
    }
}
