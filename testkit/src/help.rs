//! Checks of a binary's `--help` layout.

/// The lines of `help` that put a flag and its description side by side. Help printed one way
/// throughout has none: every flag's description is on the lines under it.
pub fn flag_lines_with_help(help: &str) -> Vec<&str> {
    help.lines()
        .filter(|line| {
            let flag = line.trim_start();
            if !(flag.starts_with("--") || flag.starts_with("-h") || flag.starts_with("-V")) {
                return false;
            }
            // `-h, --help`, `--flag <VALUE>`, `--flag <VALUE>...` and nothing after them.
            let rest = flag
                .split_whitespace()
                .filter(|word| {
                    !(word.starts_with('-') || word.starts_with('<') || word.starts_with('['))
                })
                .count();
            rest > 0
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_beside_its_help_is_found() {
        let help = "Options:\n      --a <A>\n          The a\n  -h, --help  Print help\n      \
                    --b <B>...\n      --c <C>  The c [default: 1]\n";
        assert_eq!(
            flag_lines_with_help(help),
            [
                "  -h, --help  Print help",
                "      --c <C>  The c [default: 1]"
            ]
        );
    }
}
