//! Sizes and durations as people type them on command lines: `8MiB`, `64KiB`, `1GiB` or a plain
//! number of bytes (KiB and K are 1024, KB is 1000); `500ms`, `30s`, `5m`, `1h30m`, `2w`.

use std::time::Duration;

pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let not_a_size =
        || format!("{text:?} is not a size (try 8MiB, 1.5GiB, 500MB or a number of bytes)");
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
        return Err(not_a_size());
    }
    let multiplier = unit_bytes(unit.trim()).ok_or_else(|| {
        format!(
            "unknown size unit {:?} in {text:?} (use B, KiB, MiB, GiB, TiB, or KB, MB, GB, TB \
             for powers of 1000)",
            unit.trim()
        )
    })?;
    let too_large = || format!("{text:?} is too large");
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| not_a_size())?
    };
    let mut bytes = whole.checked_mul(multiplier).ok_or_else(too_large)?;
    if !fraction.is_empty() {
        // Exact: the fraction's digits times the unit, over the power of ten they span.
        let digits: u128 = fraction.parse().map_err(|_| not_a_size())?;
        let scale = 10u128
            .checked_pow(fraction.len() as u32)
            .ok_or_else(not_a_size)?;
        let part = digits * multiplier as u128;
        if !part.is_multiple_of(scale) {
            return Err(format!("{text:?} is not a whole number of bytes"));
        }
        let part = u64::try_from(part / scale).map_err(|_| too_large())?;
        bytes = bytes.checked_add(part).ok_or_else(too_large)?;
    }
    Ok(bytes)
}

/// Bytes in one `unit`, case aside: binary units (KiB, and K as its shorthand), or decimal
/// ones (KB), as storage and network tools write them.
fn unit_bytes(unit: &str) -> Option<u64> {
    let unit = unit.to_ascii_lowercase();
    Some(match unit.as_str() {
        "" | "b" => 1,
        "k" | "ki" | "kib" => 1 << 10,
        "m" | "mi" | "mib" => 1 << 20,
        "g" | "gi" | "gib" => 1 << 30,
        "t" | "ti" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return None,
    })
}

/// A size flag's value: parsed with `parse_bytes`, shown in the largest whole unit (`100MiB`),
/// so a default written once as a number reads well in `--help`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub fn bytes(self) -> u64 {
        self.0
    }
}

impl std::fmt::Display for ByteSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.0;
        for (unit, size) in [
            ("TiB", 1u64 << 40),
            ("GiB", 1 << 30),
            ("MiB", 1 << 20),
            ("KiB", 1 << 10),
        ] {
            if n >= size && n.is_multiple_of(size) {
                return write!(f, "{}{unit}", n / size);
            }
        }
        write!(f, "{n}")
    }
}

impl std::str::FromStr for ByteSize {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        parse_bytes(text).map(ByteSize)
    }
}

/// `bytes` for a person to read: `14.1 GiB`, `256 MiB`, `512 B`.
pub fn human_bytes(bytes: u64) -> String {
    for (unit, size) in [
        ("TiB", 1u64 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ] {
        if bytes >= size {
            let value = bytes as f64 / size as f64;
            return if bytes.is_multiple_of(size) {
                format!("{} {unit}", bytes / size)
            } else {
                format!("{value:.1} {unit}")
            };
        }
    }
    format!("{bytes} B")
}

/// A duration flag's value: parsed with `parse_duration`, shown in its largest whole unit
/// (`2s`, `500ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DurationArg(pub Duration);

impl std::fmt::Display for DurationArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = self.0.as_millis();
        for (unit, size) in [
            ("d", 86_400_000u128),
            ("h", 3_600_000),
            ("m", 60_000),
            ("s", 1000),
        ] {
            if ms >= size && ms.is_multiple_of(size) {
                return write!(f, "{}{unit}", ms / size);
            }
        }
        write!(f, "{ms}ms")
    }
}

impl std::str::FromStr for DurationArg {
    type Err = String;

    /// As `parse_duration`, but a bare number is seconds: the servers' duration flags took
    /// that before durations needed a unit, and deployed settings keep working.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim().parse::<u64>() {
            Ok(seconds) => Ok(DurationArg(Duration::from_secs(seconds))),
            Err(_) => parse_duration(text).map(DurationArg),
        }
    }
}

/// A duration with its unit (ms, s, m, h, d or w), terms in any number one after another
/// (`1h30m`, `1d 12h`). A bare number is refused: nobody can tell whether `5` meant seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    const FORMS: &str = "500ms, 30s, 5m, 1h30m, 7d or 2w";
    let whole = text.trim();
    if whole.is_empty() {
        return Err(format!("an empty duration (try {FORMS})"));
    }
    let mut rest = whole;
    let mut seconds = 0f64;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(digits);
        let number: f64 = number
            .parse()
            .map_err(|_| format!("{whole:?} is not a duration (try {FORMS})"))?;
        let after = after.trim_start();
        let letters = after
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(after.len());
        let (unit, tail) = after.split_at(letters);
        let size = match unit.to_ascii_lowercase().as_str() {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "d" => 86_400.0,
            "w" => 604_800.0,
            // A bare number is refused rather than guessed at: 5 could be seconds or minutes.
            "" => return Err(format!("{whole:?} needs a unit (try {FORMS})")),
            other => {
                return Err(format!(
                    "unknown duration unit {other:?} in {whole:?} (use ms, s, m, h, d or w)"
                ));
            }
        };
        seconds += number * size;
        rest = tail.trim_start();
    }
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{whole:?}: {e}"))
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
        assert_eq!(parse_bytes("3TiB"), Ok(3 << 40));
        assert_eq!(parse_bytes("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_bytes("0.5MiB"), Ok(512 << 10));
        assert_eq!(parse_bytes("500MB"), Ok(500_000_000));
        assert_eq!(parse_bytes("1.5 GB"), Ok(1_500_000_000));
        assert_eq!(parse_bytes("64kib"), Ok(64 << 10));
        assert_eq!(parse_bytes("2kB"), Ok(2_000));
        assert_eq!(parse_bytes(".5KiB"), Ok(512));
        assert!(
            parse_bytes("0.1KiB")
                .unwrap_err()
                .contains("whole number of bytes")
        );
        assert!(parse_bytes("1.2.3MiB").is_err());
        assert!(
            parse_bytes("5PB")
                .unwrap_err()
                .contains("unknown size unit")
        );
        assert!(
            parse_bytes("99999999999TiB")
                .unwrap_err()
                .contains("too large")
        );
        assert!(parse_bytes("MiB").is_err());
    }

    #[test]
    fn sizes_show_in_their_largest_whole_unit_and_parse_back() {
        for (bytes, shown) in [
            (100 << 20, "100MiB"),
            (1 << 20, "1MiB"),
            (64 << 10, "64KiB"),
            (3 << 30, "3GiB"),
            (1536, "1536"),
            (0, "0"),
        ] {
            assert_eq!(ByteSize(bytes).to_string(), shown);
            assert_eq!(shown.parse::<ByteSize>(), Ok(ByteSize(bytes)));
        }
    }

    #[test]
    fn sizes_read_well() {
        assert_eq!(human_bytes(256 << 20), "256 MiB");
        assert_eq!(human_bytes(15_165_594_009), "14.1 GiB");
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1.5m"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("soon").is_err());
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        // Weeks, and terms one after another (a space between is fine).
        assert_eq!(parse_duration("3w"), Ok(Duration::from_secs(21 * 86_400)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1d 12h"), Ok(Duration::from_secs(129_600)));
        assert_eq!(
            parse_duration("2m30s500ms"),
            Ok(Duration::from_millis(150_500))
        );
        // A number without a unit is refused, not taken for seconds.
        let bare = parse_duration("5").unwrap_err();
        assert!(bare.contains("needs a unit"), "{bare}");
        assert!(parse_duration("1h30").is_err());
        assert!(parse_duration("").is_err());
        assert!(
            parse_duration("3y")
                .unwrap_err()
                .contains("unknown duration unit")
        );
        // A server's duration flag still takes a bare number as seconds.
        assert_eq!(
            "600".parse::<DurationArg>(),
            Ok(DurationArg(Duration::from_secs(600)))
        );
        assert_eq!(
            "1h30m".parse::<DurationArg>(),
            Ok(DurationArg(Duration::from_secs(5400)))
        );
        for (text, shown) in [
            ("2s", "2s"),
            ("1500ms", "1500ms"),
            ("90s", "90s"),
            ("2m", "2m"),
            ("0.5s", "500ms"),
        ] {
            let parsed: DurationArg = text.parse().unwrap();
            assert_eq!(parsed.to_string(), shown);
            assert_eq!(shown.parse::<DurationArg>(), Ok(parsed));
        }
    }
}
