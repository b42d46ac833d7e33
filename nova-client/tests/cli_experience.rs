//! The `nova` CLI at its edges, against real novad and novagateway processes: followers that
//! outlive a restart of their server, reads by time, limits learned from the server, errors
//! with hints and as JSON, status, formats, and bench's clean-up.

#![allow(
    clippy::disallowed_methods,
    reason = "drives real processes and the nova CLI on the real clock"
)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nova_testkit::{Novad, NovadBuilder, workspace_binary, workspace_root};

use common::{failed, nova, ok};

fn star() -> Novad {
    NovadBuilder::new(workspace_binary("novad")).start()
}

fn lines(prefix: &str, range: std::ops::Range<u32>) -> String {
    range.map(|i| format!("{prefix}{i}\n")).collect()
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A `nova` running in the background, its stdout lines arriving on a channel.
struct Follower {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Follower {
    fn start(server: &str, args: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let stderr = dir.path().join("stderr");
        let mut child = Command::new(env!("CARGO_BIN_EXE_nova"))
            .arg("--server")
            .arg(server)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("run nova");
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if sender.send(line).is_err() {
                    return;
                }
            }
        });
        Self {
            child,
            lines,
            stderr,
            _dir: dir,
        }
    }

    /// The next `n` lines, or a panic naming what arrived and what the follower said.
    fn take(&self, n: usize) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut got = Vec::new();
        while got.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => got.push(line),
                Err(_) => panic!(
                    "the follower printed {got:?} of {n} lines; its stderr:\n{}",
                    self.stderr()
                ),
            }
        }
        got
    }

    /// Whatever else it printed within `wait`.
    fn more(&self, wait: Duration) -> Vec<String> {
        let mut got = Vec::new();
        while let Ok(line) = self.lines.recv_timeout(wait) {
            got.push(line);
        }
        got
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn tail_follow_survives_a_star_restart_missing_nothing_and_repeating_nothing() {
    let mut novad = star();
    let url = novad.url();
    ok(nova(&url, &["stream", "create", "follow"], b""));
    ok(nova(
        &url,
        &["append", "follow"],
        lines("r", 0..5).as_bytes(),
    ));
    let follower = Follower::start(&url, &["tail", "-f", "-n", "100", "follow"]);
    assert_eq!(
        follower.take(5),
        (0..5).map(|i| format!("r{i}")).collect::<Vec<_>>()
    );

    // Killed mid-wait: the follower's long poll breaks, and it keeps trying.
    novad.kill9();
    std::thread::sleep(Duration::from_millis(500));
    novad.restart();
    ok(nova(
        &url,
        &["append", "follow"],
        lines("r", 5..10).as_bytes(),
    ));
    assert_eq!(
        follower.take(5),
        (5..10).map(|i| format!("r{i}")).collect::<Vec<_>>()
    );
    // A clean restart too.
    novad.terminate(Duration::from_secs(30));
    novad.restart();
    ok(nova(
        &url,
        &["append", "follow"],
        lines("r", 10..12).as_bytes(),
    ));
    assert_eq!(follower.take(2), ["r10", "r11"]);
    assert!(
        follower.more(Duration::from_millis(500)).is_empty(),
        "nothing twice"
    );
    let said = follower.stderr();
    assert!(said.contains("lost the server"), "{said}");
    assert!(said.contains("resuming follow at seq"), "{said}");
}

#[test]
fn read_follow_through_a_gateway_survives_the_gateway_restarting() {
    let star = star();
    let mut gateway = NovadBuilder::gateway(workspace_binary("novagateway"))
        .args([
            "--star",
            &star.url(),
            "--store-dir",
            star.data_dir().join("store").to_str().unwrap(),
        ])
        .start();
    ok(nova(&star.url(), &["stream", "create", "g"], b""));
    ok(nova(
        &star.url(),
        &["append", "g"],
        lines("g", 0..3).as_bytes(),
    ));
    let follower = Follower::start(&gateway.url(), &["read", "g", "--follow"]);
    assert_eq!(follower.take(3), ["g0", "g1", "g2"]);
    gateway.kill9();
    ok(nova(
        &star.url(),
        &["append", "g"],
        lines("g", 3..6).as_bytes(),
    ));
    gateway.restart();
    ok(nova(
        &star.url(),
        &["append", "g"],
        lines("g", 6..8).as_bytes(),
    ));
    assert_eq!(
        follower.take(5),
        ["g3", "g4", "g5", "g6", "g7"],
        "every record once, in order, across the gateway's restart"
    );
    assert!(follower.more(Duration::from_millis(500)).is_empty());
}

#[test]
fn read_by_time_from_memory_and_through_the_index() {
    let mut novad = star();
    let url = novad.url();
    ok(nova(&url, &["stream", "create", "timed"], b""));
    // Records whose producer gave them times, then records the star stamps, in three flights a
    // second apart.
    let given: String = (1..=5)
        .map(|i| format!("{{\"body\":\"given-{i}\",\"timestamp\":{}}}\n", i * 1000))
        .collect();
    ok(nova(
        &url,
        &["append", "timed", "--format", "json"],
        given.as_bytes(),
    ));
    std::thread::sleep(Duration::from_millis(1100));
    ok(nova(&url, &["append", "timed"], b"early-0\nearly-1\n"));
    std::thread::sleep(Duration::from_millis(1100));
    let between = now_ms();
    std::thread::sleep(Duration::from_millis(1100));
    ok(nova(&url, &["append", "timed"], b"late-0\nlate-1\n"));

    let check = |url: &str| {
        assert_eq!(
            ok(nova(
                url,
                &["read", "timed", "--from-time", "3000", "--until", "4999"],
                b""
            )),
            "given-3\ngiven-4\n"
        );
        let from = between.to_string();
        assert_eq!(
            ok(nova(url, &["read", "timed", "--from-time", &from], b"")),
            "late-0\nlate-1\n"
        );
        assert_eq!(
            ok(nova(
                url,
                &["read", "timed", "--ago", "1h", "--limit", "3"],
                b""
            )),
            "early-0\nearly-1\nlate-0\n",
            "an hour ago is after the given times (1970), before the stamped ones"
        );
        assert_eq!(
            ok(nova(url, &["read", "timed", "--until", &from], b"")),
            "given-1\ngiven-2\ngiven-3\ngiven-4\ngiven-5\nearly-0\nearly-1\n"
        );
        // A time after every record: nothing, and no error.
        let later = (now_ms() + 3_600_000).to_string();
        assert_eq!(
            ok(nova(url, &["read", "timed", "--from-time", &later], b"")),
            ""
        );
    };
    // Everything is in the tail cache: the reader passes over earlier records itself.
    check(&url);
    // After a restart the cache is empty: the star finds the start in the index.
    novad.terminate(Duration::from_secs(30));
    novad.restart();
    check(&url);
    // RFC 3339 and dates are times too.
    assert_eq!(
        ok(nova(
            &url,
            &[
                "read",
                "timed",
                "--from-time",
                "1970-01-01T00:00:04Z",
                "--limit",
                "1"
            ],
            b""
        )),
        "given-4\n"
    );
    let (_, stderr) = failed(nova(
        &url,
        &["read", "timed", "--from-time", "yesterday"],
        b"",
    ));
    assert!(stderr.contains("RFC 3339"), "{stderr}");
}

#[test]
fn the_record_limit_is_learned_from_the_server_and_an_oversize_line_is_named() {
    let novad = NovadBuilder::new(workspace_binary("novad"))
        .args(["--max-record-bytes", "1KiB"])
        .start();
    let url = novad.url();
    ok(nova(&url, &["stream", "create", "small"], b""));
    let mut input = b"a\nb\n".to_vec();
    input.extend(std::iter::repeat_n(b'x', 2000));
    input.extend(b"\nc\n");
    let (stdout, stderr) = failed(nova(&url, &["append", "small"], &input));
    assert_eq!(stdout, "0..2\n", "the records before it are appended");
    assert!(stderr.contains("stdin line 3"), "{stderr}");
    // The record's real size, and whose limit it is over.
    assert!(
        stderr.contains("a record of 2.0 KiB is over the server's --max-record-bytes of 1 KiB"),
        "{stderr}"
    );
    assert!(stderr.contains("nothing after it was sent"), "{stderr}");
    assert_eq!(ok(nova(&url, &["read", "small"], b"")), "a\nb\n");
    // A larger limit on the command line does not lift the server's.
    let (stdout, stderr) = failed(nova(
        &url,
        &["append", "small", "--max-record-bytes", "8MiB"],
        &input,
    ));
    assert_eq!(stdout, "2..4\n");
    assert!(stderr.contains("stdin line 3"), "{stderr}");
    // A lower limit on the command line is nova's, and named so.
    let (_, stderr) = failed(nova(
        &url,
        &["append", "small", "--max-record-bytes", "4"],
        b"twelve bytes\n",
    ));
    assert!(
        stderr.contains("a record of 12 B is over nova's --max-record-bytes of 4 B"),
        "{stderr}"
    );

    // In JSON, the same: the range on stdout, the error on stderr with its code.
    let (stdout, stderr) = failed(nova(&url, &["--output", "json", "append", "small"], &input));
    assert!(stdout.contains("\"records\":2"), "{stdout}");
    let error: serde_json::Value = serde_json::from_str(stderr.trim()).unwrap();
    assert_eq!(error["error"]["code"], "INVALID_ARGUMENT");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("line 3")
    );
}

#[test]
fn errors_say_what_to_do_and_are_json_with_their_code() {
    let novad = star();
    let url = novad.url();
    // A stream that does not exist: NOT_FOUND, and where to look.
    let (stdout, stderr) = failed(nova(&url, &["read", "nope"], b""));
    assert!(stdout.is_empty());
    assert!(stderr.contains("does not exist"), "{stderr}");
    assert!(stderr.contains("hint: `nova stream list`"), "{stderr}");
    // The message in words, without the gRPC code in front.
    assert!(!stderr.contains("NotFound"), "{stderr}");
    let (_, stderr) = failed(nova(&url, &["--output", "json", "read", "nope"], b""));
    let error: serde_json::Value = serde_json::from_str(stderr.trim()).unwrap();
    assert_eq!(error["error"]["code"], "NOT_FOUND", "{stderr}");
    assert!(
        !stderr.contains("NotFound"),
        "the code is not repeated: {stderr}"
    );
    assert_eq!(error["error"]["retryable"], false);

    // A duration without its unit is refused rather than taken for seconds; compound
    // durations and weeks are durations.
    let (_, stderr) = failed(nova(&url, &["read", "nope", "--ago", "5"], b""));
    assert!(stderr.contains("needs a unit"), "{stderr}");
    let (_, stderr) = failed(nova(&url, &["read", "nope", "--ago", "1h30m"], b""));
    assert!(stderr.contains("does not exist"), "{stderr}");
    let (_, stderr) = failed(nova(&url, &["read", "nope", "--ago", "2w"], b""));
    assert!(stderr.contains("does not exist"), "{stderr}");
    // A command line nova cannot read is an error like any other: JSON with --output json,
    // and exit status 1 either way.
    let output = nova(
        &url,
        &["--output", "json", "read", "nope", "--ago", "5"],
        b"",
    );
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr).unwrap();
    let error: serde_json::Value = serde_json::from_str(stderr.trim()).unwrap();
    assert_eq!(error["error"]["code"], "INVALID_ARGUMENT", "{stderr}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("needs a unit"),
        "{stderr}"
    );
    assert_eq!(
        nova(&url, &["read", "nope", "--bogus"], b"").status.code(),
        Some(1)
    );
    // The size and duration conventions are in --help.
    let help = ok(nova(&url, &["--help"], b""));
    assert!(
        help.contains("powers of 1024") && help.contains("1h30m"),
        "{help}"
    );

    // Nothing listening.
    let closed = format!("127.0.0.1:{}", nova_testkit::free_port());
    let (_, stderr) = failed(nova(&closed, &["stream", "list"], b""));
    assert!(
        stderr.contains(&format!("nothing listens on {closed}")),
        "{stderr}"
    );
    let (_, stderr) = failed(nova(&closed, &["--output", "json", "stream", "list"], b""));
    let error: serde_json::Value = serde_json::from_str(stderr.trim()).unwrap();
    assert_eq!(error["error"]["code"], "DISCONNECTED", "{stderr}");

    // The metrics port is not the gRPC port.
    let metrics = format!("http://127.0.0.1:{}", novad.metrics_port());
    let (_, stderr) = failed(nova(&metrics, &["stream", "list"], b""));
    assert!(stderr.contains("metrics port"), "{stderr}");
    assert!(stderr.contains("plain HTTP, not gRPC"), "{stderr}");
    assert!(!stderr.contains("grpc-status header missing"), "{stderr}");
    // `status` too, rather than calling the server too old (HTTP's 404 maps to UNIMPLEMENTED).
    let (_, stderr) = failed(nova(&metrics, &["status"], b""));
    assert!(stderr.contains("metrics port"), "{stderr}");
    assert!(!stderr.contains("too old"), "{stderr}");

    // https:// speaks TLS, and never falls back to plain text: a plain-text server fails the
    // handshake, and the hint says what is wrong.
    let (_, stderr) = failed(nova(
        &url.replace("http://", "https://"),
        &["stream", "list"],
        b"",
    ));
    assert!(stderr.contains("does not speak TLS"), "{stderr}");
}

#[test]
fn status_describes_the_star_and_the_gateway() {
    let novad = star();
    let url = novad.url();
    ok(nova(&url, &["stream", "create", "one"], b""));
    let status = ok(nova(&url, &["status"], b""));
    assert!(status.contains(": star nova (version "), "{status}");
    assert!(status.contains("ready:      yes"), "{status}");
    assert!(status.contains("streams:    1"), "{status}");
    assert!(
        !status.contains("fleet:"),
        "a single star is in no fleet: {status}"
    );
    assert!(status.contains("record 1 MiB"), "{status}");
    // A single star is a fleet of one that leads every stream, not a fleet of none.
    assert_eq!(novad.metric("nova_fleet_stars"), Some(1.0));
    assert_eq!(novad.metric("nova_fleet_streams_led"), Some(1.0));
    let json: serde_json::Value =
        serde_json::from_str(&ok(nova(&url, &["--output", "json", "ping"], b""))).unwrap();
    assert!(json.get("fleet").is_none(), "{json}");
    assert_eq!(json["role"], "star");
    assert_eq!(json["ready"], true);
    assert_eq!(json["fenced"], false);
    assert_eq!(json["limits"]["max_batch_records"], 65536);
    assert_eq!(json["version"], env!("CARGO_PKG_VERSION"));

    let gateway = NovadBuilder::gateway(workspace_binary("novagateway"))
        .args([
            "--star",
            &url,
            "--store-dir",
            novad.data_dir().join("store").to_str().unwrap(),
        ])
        .start();
    let status = ok(nova(&gateway.url(), &["status"], b""));
    assert!(status.contains(": gateway "), "{status}");
    // Only the limits a gateway has: no append limits shown as "-".
    assert!(!status.contains(" - "), "{status}");
    assert!(!status.contains("record -"), "{status}");
    assert!(status.contains(&format!("star:       {url}")), "{status}");
    // A gateway takes no appends, and says where to send them.
    let (_, stderr) = failed(nova(&gateway.url(), &["append", "one"], b"x\n"));
    assert!(stderr.contains("is a gateway"), "{stderr}");
    assert!(stderr.contains(&url), "{stderr}");
}

/// On a fleet star, `nova status` says what fleet it sees and counts the streams it leads, not
/// every stream in the fleet's catalog.
#[test]
fn status_on_a_fleet_star_shows_the_fleet_and_the_streams_it_leads() {
    let etcd = nova_testkit::Etcd::start();
    let moto = nova_testkit::Moto::start();
    moto.create_bucket("fleet");
    let star = |id: &str| {
        NovadBuilder::new(workspace_binary("novad"))
            .args([
                "--s3-bucket",
                "fleet",
                "--s3-endpoint",
                &moto.endpoint(),
                "--s3-path-style",
                "--metastore",
                &etcd.url(),
                "--star-id",
                id,
                "--lease-ttl-secs",
                "3",
            ])
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "testtest")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .start()
    };
    let stars = [star("star-0"), star("star-1")];
    let url = stars[0].url();
    for i in 0..6 {
        ok(nova(&url, &["stream", "create", &format!("s{i}")], b""));
        // A leader takes a placed stream up at its first request.
        ok(nova(&url, &["append", &format!("s{i}")], b"one\n"));
    }
    let mut led = 0;
    for novad in &stars {
        let deadline = Instant::now() + Duration::from_secs(20);
        let json = loop {
            let json: serde_json::Value = serde_json::from_str(&ok(nova(
                &novad.url(),
                &["--output", "json", "status"],
                b"",
            )))
            .unwrap();
            if json["fleet"]["stars"] == 2 || Instant::now() > deadline {
                break json;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        assert_eq!(json["fleet"]["stars"], 2, "{json}");
        assert_eq!(json["fleet"]["advertise"], novad.url(), "{json}");
        let here = json["streams"].as_u64().unwrap();
        assert_eq!(
            Some(here as f64),
            novad.metric("nova_fleet_streams_led"),
            "{json}"
        );
        led += here;
        let text = ok(nova(&novad.url(), &["status"], b""));
        assert!(
            text.contains(&format!(
                "fleet:      2 stars, this one reached at {}",
                novad.url()
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!("streams:    {here} led here")),
            "{text}"
        );
    }
    assert_eq!(led, 6, "every stream is led by exactly one star");
}

#[test]
fn describe_prints_dates_and_json_keeps_the_milliseconds() {
    let novad = star();
    let url = novad.url();
    ok(nova(
        &url,
        &["stream", "create", "d", "--retention-age", "7d"],
        b"",
    ));
    let text = ok(nova(&url, &["stream", "describe", "d"], b""));
    let year = &text[text.find("created:").unwrap()..];
    assert!(year.contains("T") && year.contains("Z"), "{text}");
    assert!(
        text.contains("retention:      age 7d, size no limit"),
        "{text}"
    );
    let json: serde_json::Value = serde_json::from_str(&ok(nova(
        &url,
        &["--output", "json", "stream", "describe", "d"],
        b"",
    )))
    .unwrap();
    let ms = json["created_at_ms"].as_u64().unwrap();
    assert!(ms > 1_700_000_000_000);
    assert!(json["created_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(json["retention_age_ms"], 7 * 86_400_000u64);

    // The storage class is a setting too; this star has no zone buckets for Express.
    let (_, stderr) = failed(nova(
        &url,
        &["stream", "reconfigure", "d", "--storage-class", "express"],
        b"",
    ));
    assert!(stderr.contains("--s3-express-zone"), "{stderr}");
    let text = ok(nova(
        &url,
        &[
            "stream",
            "reconfigure",
            "d",
            "--storage-class",
            "standard",
            "--retention-age",
            "none",
        ],
        b"",
    ));
    assert!(text.contains("storage class:  standard"), "{text}");
    assert!(text.contains("retention:      age no limit"), "{text}");

    // A limit of 0 is refused with the way to say "no limit" that applies where it was given.
    let (_, stderr) = failed(nova(
        &url,
        &["stream", "reconfigure", "d", "--retention-age", "0s"],
        b"",
    ));
    assert!(stderr.contains("`none` removes the limit"), "{stderr}");
    let (_, stderr) = failed(nova(
        &url,
        &["stream", "create", "z", "--retention-bytes", "0"],
        b"",
    ));
    assert!(stderr.contains("leave the flag out"), "{stderr}");
    // A reconfigure that changes nothing says so, and fails.
    let (_, stderr) = failed(nova(&url, &["stream", "reconfigure", "d"], b""));
    assert!(stderr.contains("nothing to change"), "{stderr}");
    // A prefix to list by is taken as a positional too.
    let listed = ok(nova(&url, &["stream", "list", "d"], b""));
    assert!(listed.starts_with("d\t"), "{listed}");
    assert_eq!(listed.lines().count(), 1, "{listed}");
}

#[test]
fn formats_round_trip_headers_timestamps_and_bytes() {
    let novad = star();
    let url = novad.url();
    ok(nova(&url, &["stream", "create", "src"], b""));
    ok(nova(&url, &["stream", "create", "dst"], b""));
    let input = "{\"body\":\"plain\",\"headers\":[[\"k\",\"v\"],[\"k\",\"w\"]],\"timestamp\":1234}\n\
                 {\"body_hex\":\"ff00\"}\n";
    ok(nova(
        &url,
        &["append", "src", "--format", "json"],
        input.as_bytes(),
    ));
    // The CLI ends its append session in order: the star counts it OK, not CANCELLED (an
    // error-ratio panel would otherwise count every CLI append as a failure).
    assert_eq!(
        novad.metric("nova_rpc_requests_total{code=\"OK\",method=\"Append\"}"),
        Some(1.0)
    );
    assert_eq!(
        novad.metric("nova_rpc_requests_total{code=\"CANCELLED\",method=\"Append\"}"),
        None
    );
    let json = ok(nova(&url, &["read", "src", "--format", "json"], b""));
    let lines: Vec<&str> = json.lines().collect();
    assert_eq!(
        lines[0],
        "{\"seq\":0,\"timestamp\":1234,\"body\":\"plain\",\"headers\":[[\"k\",\"v\"],[\"k\",\"w\"]]}"
    );
    assert!(lines[1].contains("\"body_hex\":\"ff00\""), "{}", lines[1]);
    // What read prints, append takes: a stream copied with its headers and times.
    ok(nova(
        &url,
        &["append", "dst", "--format", "json"],
        json.as_bytes(),
    ));
    assert_eq!(
        ok(nova(&url, &["read", "dst", "--format", "json"], b"")),
        json
    );
    // Length-prefixed out.
    let framed = nova(&url, &["read", "src", "--format", "length-prefixed"], b"").stdout;
    assert_eq!(&framed[..9], b"\0\0\0\x05plain");
    assert_eq!(&framed[9..], &[0, 0, 0, 2, 0xff, 0]);
}

#[test]
fn reading_past_the_tail_says_so() {
    let novad = star();
    let url = novad.url();
    ok(nova(&url, &["stream", "create", "short"], b""));
    ok(nova(&url, &["append", "short"], b"a\nb\n"));
    let output = nova(&url, &["read", "short", "--from", "10"], b"");
    assert!(output.status.success());
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.contains("hint: --from 10 is past the tail of \"short\" (2)"),
        "{stderr}"
    );
}

/// `nova bench` with `args`, its JSON report.
fn bench_report(url: &str, args: &[&str]) -> serde_json::Value {
    let args: Vec<&str> = ["--output", "json", "bench"]
        .into_iter()
        .chain(args.iter().copied())
        .collect();
    let report = ok(nova(url, &args, b""));
    serde_json::from_str(report.trim()).unwrap()
}

#[test]
fn bench_uses_fresh_streams_cleans_them_up_and_says_when_it_falls_short() {
    let novad = star();
    let url = novad.url();
    let report = bench_report(
        &url,
        &[
            "--sessions",
            "2",
            "--duration",
            "1s",
            "--rate",
            "100000000",
            "--record-bytes",
            "100B",
        ],
    );
    assert_eq!(report["rate_shortfall"], true, "{report}");
    assert!(report["rate_achieved"].as_f64().unwrap() < 0.95);
    assert!(report["records"].as_u64().unwrap() > 0);
    assert_eq!(
        ok(nova(&url, &["stream", "list"], b"")),
        "",
        "its fresh streams are gone"
    );
    let text = ok(nova(
        &url,
        &[
            "bench",
            "--sessions",
            "1",
            "--duration",
            "1s",
            "--rate",
            "100000000",
            "--quiet",
            "--keep-streams",
        ],
        b"",
    ));
    assert!(text.contains("SHORT OF --rate"), "{text}");
    assert!(text.contains("streams kept bench-"), "{text}");
    assert_eq!(ok(nova(&url, &["stream", "list"], b"")).lines().count(), 1);

    // A slow rate (a batch per session every 200 s) still ends when the duration is up: a
    // session waiting for its next tick stops with the run.
    let begun = std::time::Instant::now();
    let report = bench_report(
        &url,
        &[
            "--sessions",
            "2",
            "--batch-records",
            "1",
            "--rate",
            "0.01",
            "--duration",
            "1s",
        ],
    );
    assert!(
        begun.elapsed() < Duration::from_secs(30),
        "{:?}",
        begun.elapsed()
    );
    assert_eq!(report["records"], 2, "one batch each, at once: {report}");
}

/// Values `nova bench` cannot pace or run are refused with a message naming the flag, never
/// a panic (a rate of `inf`, or batches of no records with a rate, once panicked in a timer).
#[test]
fn bench_refuses_rates_and_counts_it_cannot_run() {
    let novad = star();
    let url = novad.url();
    let cases: &[(&[&str], &str)] = &[
        (&["--rate", "inf"], "--rate"),
        (&["--rate", "NaN"], "--rate"),
        (&["--rate=-5"], "--rate"),
        (
            &["--batch-records", "0", "--rate", "100"],
            "--batch-records",
        ),
        (&["--sessions", "0"], "--sessions"),
        (&["--pipeline", "0"], "--pipeline"),
        (
            &["--rate", "1e300", "--duration", "1s"],
            "which a timer cannot pace",
        ),
    ];
    for (flags, named) in cases {
        let mut args = vec!["bench", "--quiet"];
        args.extend_from_slice(flags);
        let output = nova(&url, &args, b"");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{flags:?} ran");
        assert!(stderr.contains(named), "{flags:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{flags:?}: {stderr}");
    }
    assert_eq!(
        ok(nova(&url, &["stream", "list"], b"")),
        "",
        "a refused run leaves no streams behind"
    );
}

/// docs/cli.md holds every command's `--help`, as the binary prints it now.
#[test]
fn the_cli_reference_is_the_help_the_binary_prints() {
    let reference = std::fs::read_to_string(workspace_root().join("docs/cli.md")).unwrap();
    let help = |path: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_nova"))
            .args(path)
            .arg("--help")
            .env_remove("NOVA_SERVER")
            .env_remove("NOVA_TOKEN")
            .output()
            .unwrap();
        ok(output)
    };
    let commands: &[&[&str]] = &[
        &[],
        &["stream"],
        &["stream", "create"],
        &["stream", "reconfigure"],
        &["stream", "list"],
        &["stream", "describe"],
        &["stream", "delete"],
        &["append"],
        &["read"],
        &["tail"],
        &["status"],
        &["bench"],
        &["token"],
        &["token", "new"],
    ];
    for path in commands {
        let title = std::iter::once("nova")
            .chain(path.iter().copied())
            .collect::<Vec<_>>()
            .join(" ");
        let section = format!("## `{title}`\n\n```text\n{}```\n", help(path));
        assert!(
            reference.contains(&section),
            "docs/cli.md is missing or outdated for `{title}`; regenerate it with \
             scripts/cli-reference. Expected:\n{section}"
        );
    }
}

/// Each command's help lists its own flags first and the flags every command takes after them,
/// under a heading of their own; usage lines never show the defaulted --server as required; and
/// every flag's description sits under it, in every section.
#[test]
fn help_lists_a_commands_own_flags_before_the_global_ones() {
    let commands: &[&[&str]] = &[
        &[],
        &["stream", "create"],
        &["stream", "reconfigure"],
        &["stream", "list"],
        &["stream", "delete"],
        &["append"],
        &["read"],
        &["tail"],
        &["status"],
        &["bench"],
        &["token", "new"],
    ];
    for command in commands {
        for flag in ["-h", "--help"] {
            let mut args = command.to_vec();
            args.push(flag);
            let output = Command::new(workspace_binary("nova"))
                .args(&args)
                .output()
                .unwrap();
            let help = String::from_utf8(output.stdout).unwrap();
            let usage = help.lines().find(|l| l.starts_with("Usage:")).unwrap();
            assert!(!usage.contains("--server"), "{args:?}: {usage}");
            assert_eq!(
                nova_testkit::help::flag_lines_with_help(&help),
                Vec::<&str>::new(),
                "{args:?}"
            );
            let global = help
                .find("Global options:")
                .unwrap_or_else(|| panic!("{args:?}:\n{help}"));
            assert!(
                help[global..].contains("      --server <SERVER>"),
                "{args:?}:\n{help}"
            );
            // Every flag before the global heading is the command's own.
            for line in help[..global].lines() {
                for global_flag in ["--server", "--token", "--tls-ca", "--output"] {
                    assert!(
                        !line.trim_start().starts_with(global_flag),
                        "{args:?}: {global_flag} among the command's own flags:\n{help}"
                    );
                }
            }
        }
    }
}
