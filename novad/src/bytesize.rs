//! Byte sizes on the command line: `8MiB`, `64KiB`, `100MiB`, `1GiB`, or a plain number of bytes.

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
}
