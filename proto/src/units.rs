//! Sizes and durations as people type them on command lines: `8MiB`, `64KiB`, `1GiB` or a plain
//! number of bytes; `500ms`, `30s`, `5m`, `1h`.

use std::time::Duration;

pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let number: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a size (try 8MiB, 64KiB or a number of bytes)"))?;
    let multiplier: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" | "K" | "k" => 1 << 10,
        "MiB" | "M" => 1 << 20,
        "GiB" | "G" => 1 << 30,
        other => {
            return Err(format!(
                "unknown size unit {other:?} (use B, KiB, MiB or GiB)"
            ));
        }
    };
    number
        .checked_mul(multiplier)
        .ok_or_else(|| format!("{text:?} is too large"))
}

pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (try 500ms, 30s or 5m)"))?;
    let seconds = match unit.trim() {
        "ms" => number / 1000.0,
        "" | "s" => number,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        other => {
            return Err(format!(
                "unknown duration unit {other:?} (use ms, s, m or h)"
            ));
        }
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_bytes("100MiB"), Ok(100 << 20));
        assert_eq!(parse_bytes("64KiB"), Ok(64 << 10));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("2G"), Ok(2 << 30));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("3TiB").is_err());
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5m"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("3d").is_err());
    }
}
