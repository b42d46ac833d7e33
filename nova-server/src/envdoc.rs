//! An example environment file made from a binary's flags: every setting it reads from the
//! environment, under its help heading, with its help text and its default. `novad
//! --print-env-example` and `novagateway --print-env-example` print it; `ops/*.env.example`
//! are its output, and a test holds each to the flags, so the examples cannot drift.

use std::fmt::Write as _;

/// Lines of help text are wrapped to this width, `# ` included.
const WIDTH: usize = 98;

/// The example file for `command`, opened by `intro` (each of its lines becomes a comment).
pub fn env_example(command: &clap::Command, intro: &str) -> String {
    let mut out = String::new();
    for line in intro.lines() {
        comment(&mut out, line);
    }
    let mut heading: Option<Option<&str>> = None;
    for arg in command.get_arguments() {
        let Some(env) = arg.get_env() else {
            continue;
        };
        if heading != Some(arg.get_help_heading()) {
            heading = Some(arg.get_help_heading());
            let _ = writeln!(
                out,
                "\n# ---- {}",
                arg.get_help_heading().unwrap_or("General")
            );
        }
        out.push('\n');
        // The long help keeps every paragraph; clap drops the short one's final period.
        let mut help = arg
            .get_long_help()
            .or(arg.get_help())
            .map(|h| h.to_string())
            .unwrap_or_else(|| "(no help text)".to_owned());
        if !help.ends_with(['.', ')', ':']) {
            help.push('.');
        }
        for paragraph in help.split("\n\n") {
            wrap(&mut out, &paragraph.replace('\n', " "));
        }
        let name = env.to_string_lossy();
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        if defaults.is_empty() {
            let _ = writeln!(out, "# {name}=");
        } else {
            let _ = writeln!(out, "# {name}={}", defaults.join(","));
        }
    }
    out
}

fn comment(out: &mut String, line: &str) {
    if line.is_empty() {
        out.push_str("#\n");
    } else {
        let _ = writeln!(out, "# {line}");
    }
}

/// `text` as comment lines no wider than `WIDTH`.
fn wrap(out: &mut String, text: &str) {
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && 2 + line.len() + 1 + word.len() > WIDTH {
            comment(out, &line);
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        comment(out, &line);
    }
}

/// Fails with the first difference between `file`'s text and what `env_example` makes now,
/// naming the command that rewrites it.
pub fn check_current(file: &str, on_disk: &str, generated: &str, regenerate: &str) {
    if on_disk == generated {
        return;
    }
    let first_difference = on_disk
        .lines()
        .zip(generated.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| on_disk.lines().count().min(generated.lines().count()));
    panic!(
        "{file} differs from the flags at line {} (on disk: {:?}, from the flags: {:?}); \
         regenerate it with `{regenerate}`",
        first_difference + 1,
        on_disk.lines().nth(first_difference),
        generated.lines().nth(first_difference),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Demo {
        /// Where it listens.
        #[arg(long, env = "DEMO_LISTEN", default_value = "127.0.0.1:1")]
        listen: String,
        /// A budget with a long help text that goes on and on about what it bounds and what
        /// happens at the limit, long enough to wrap onto a second line of the example.
        #[arg(
            long,
            env = "DEMO_BUDGET",
            default_value_t = 64,
            help_heading = "Budgets"
        )]
        budget: u64,
        /// Optional, no default.
        #[arg(long, env = "DEMO_OPTIONAL")]
        optional: Option<String>,
        /// Not from the environment.
        #[arg(long)]
        flag_only: bool,
    }

    #[test]
    fn every_env_setting_with_its_help_and_default() {
        use clap::CommandFactory;
        let text = env_example(&Demo::command(), "Demo settings.");
        assert!(text.starts_with("# Demo settings.\n"));
        assert!(
            text.contains("# Where it listens.\n# DEMO_LISTEN=127.0.0.1:1\n"),
            "{text}"
        );
        assert!(text.contains("# ---- Budgets"), "{text}");
        assert!(text.contains("# DEMO_BUDGET=64\n"), "{text}");
        assert!(text.contains("# DEMO_OPTIONAL=\n"), "{text}");
        assert!(!text.contains("flag_only") && !text.contains("FLAG_ONLY"));
        assert!(text.lines().all(|l| l.len() <= WIDTH), "{text}");
    }
}
