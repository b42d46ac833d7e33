//! Times on the command line: points in time in (RFC 3339, a date, or Unix milliseconds) and
//! dates out, always in UTC.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use time::format_description::well_known::Rfc3339;
use time::{Date, Month, OffsetDateTime, PrimitiveDateTime, Time};

/// Now, in Unix milliseconds.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A point in time: `2026-12-02T10:30:00Z` (any RFC 3339 offset), `2026-12-02` (midnight UTC),
/// `now`, or Unix milliseconds (`1764671400000`).
pub fn parse_time(text: &str) -> Result<u64, String> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("now") {
        return Ok(now_ms());
    }
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse()
            .map_err(|_| format!("{text:?} is too large for a time in milliseconds"));
    }
    let parsed = OffsetDateTime::parse(text, &Rfc3339)
        .ok()
        .or_else(|| date(text).map(|d| PrimitiveDateTime::new(d, Time::MIDNIGHT).assume_utc()));
    match parsed {
        Some(at) => {
            let ms = at.unix_timestamp_nanos() / 1_000_000;
            u64::try_from(ms).map_err(|_| format!("{text:?} is before 1970"))
        }
        None => Err(format!(
            "{text:?} is not a time: give RFC 3339 (2026-12-02T10:30:00Z), a date (2026-12-02), \
             `now`, or Unix milliseconds"
        )),
    }
}

/// `YYYY-MM-DD`.
fn date(text: &str) -> Option<Date> {
    let mut parts = text.splitn(3, '-');
    let year: i32 = parts.next()?.parse().ok()?;
    let month: u8 = parts.next()?.parse().ok()?;
    let day: u8 = parts.next()?.parse().ok()?;
    Date::from_calendar_date(year, Month::try_from(month).ok()?, day).ok()
}

/// `ms` as an RFC 3339 date in UTC, with milliseconds.
pub fn format_time(ms: u64) -> String {
    let nanos = i128::from(ms) * 1_000_000;
    match OffsetDateTime::from_unix_timestamp_nanos(nanos) {
        Ok(at) => {
            let at = at.replace_nanosecond(at.nanosecond() / 1_000_000 * 1_000_000);
            at.ok()
                .and_then(|at| at.format(&Rfc3339).ok())
                .unwrap_or_else(|| format!("{ms} ms"))
        }
        Err(_) => format!("{ms} ms"),
    }
}

/// A duration for people: `3d 4h`, `12m 5s`, `850 ms`.
pub fn format_duration(d: Duration) -> String {
    let secs = d.as_secs();
    if secs == 0 {
        return format!("{} ms", d.as_millis());
    }
    let (days, hours, minutes, seconds) =
        (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    let parts: Vec<String> = [(days, "d"), (hours, "h"), (minutes, "m"), (seconds, "s")]
        .iter()
        .skip_while(|(n, _)| *n == 0)
        .take(2)
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect();
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_in_every_form() {
        assert_eq!(parse_time("1970-01-01T00:00:01Z"), Ok(1000));
        assert_eq!(parse_time("1970-01-01T01:00:00+01:00"), Ok(0));
        assert_eq!(parse_time("1970-01-02"), Ok(86_400_000));
        assert_eq!(parse_time("1234"), Ok(1234));
        assert!(parse_time("yesterday").unwrap_err().contains("RFC 3339"));
        assert!(
            parse_time("1969-12-31")
                .unwrap_err()
                .contains("before 1970")
        );
        let now = now_ms();
        assert!(parse_time("now").unwrap() >= now);
    }

    #[test]
    fn dates_out() {
        assert_eq!(format_time(1_500), "1970-01-01T00:00:01.5Z");
        assert_eq!(format_time(86_400_000), "1970-01-02T00:00:00Z");
        assert_eq!(
            parse_time(&format_time(1_764_671_400_123)),
            Ok(1_764_671_400_123)
        );
    }

    #[test]
    fn durations_for_people() {
        assert_eq!(format_duration(Duration::from_millis(850)), "850 ms");
        assert_eq!(format_duration(Duration::from_secs(725)), "12m 5s");
        assert_eq!(
            format_duration(Duration::from_secs(3 * 86_400 + 4 * 3600 + 9)),
            "3d 4h"
        );
        assert_eq!(format_duration(Duration::from_secs(7200)), "2h");
    }
}
