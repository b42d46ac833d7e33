//! docs/fleet.md, followed as a newcomer would: its `novad` command for three stars, taken from
//! the page itself with only the ports, directories and the S3 endpoint adapted, and its `nova`
//! commands; then a stream read back after its leader drains (SIGTERM) and after the next one
//! is killed (kill -9). If the page changes so that its commands no longer make a working
//! fleet, this test fails.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use nova_testkit::{Etcd, Moto, Novad, free_port, nova_at, workspace_root};

use common::{client, novad};

/// The flags docs/fleet.md gives each star, star `i` of its loop, as written there: `$i` and
/// `${i}` put in, continuation lines joined.
fn documented_star_flags(i: usize) -> Vec<String> {
    let page = std::fs::read_to_string(workspace_root().join("docs/fleet.md")).unwrap();
    let block = page
        .split("```sh")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("docs/fleet.md opens with a shell block");
    let joined = block.replace("\\\n", " ");
    let line = joined
        .lines()
        .map(str::trim)
        .find(|line| line.starts_with("novad "))
        .expect("the shell block starts novad");
    line.replace("${i}", &i.to_string())
        .replace("$i", &i.to_string())
        .trim_end_matches('&')
        .split_whitespace()
        .skip(1)
        .map(str::to_owned)
        .collect()
}

/// The value the documented flags give `flag`.
fn value<'a>(flags: &'a [String], flag: &str) -> &'a str {
    let at = flags
        .iter()
        .position(|f| f == flag)
        .unwrap_or_else(|| panic!("docs/fleet.md gives no {flag}: {flags:?}"));
    &flags[at + 1]
}

/// The documented flags with this machine's adaptations: the testkit picks the ports, the data
/// directory and the metrics address (and passes them itself); etcd and S3 are the test's.
fn adapted(flags: &[String], etcd: &Etcd, moto: &Moto, port: u16) -> Vec<String> {
    let listen = value(flags, "--listen").to_owned();
    let mut out = Vec::new();
    let mut rest = flags.iter();
    while let Some(flag) = rest.next() {
        match flag.as_str() {
            "--listen" | "--metrics-addr" | "--data-dir" => {
                rest.next();
            }
            "--metastore" => {
                rest.next();
                out.extend(["--metastore".to_owned(), etcd.url()]);
            }
            "--s3-endpoint" => {
                rest.next();
                out.extend(["--s3-endpoint".to_owned(), moto.endpoint()]);
            }
            "--advertise-addr" => {
                let documented = rest.next().expect("a value");
                // The page advertises the address it listens on; so does the adapted star.
                assert!(documented.ends_with(&listen), "{documented} vs {listen}");
                out.extend([
                    "--advertise-addr".to_owned(),
                    format!("http://127.0.0.1:{port}"),
                ]);
            }
            other => out.push(other.to_owned()),
        }
    }
    out
}

/// `nova --server SERVER ARGS…`, its stdout on success.
fn nova(server: &str, args: &[&str], stdin: &[u8]) -> Result<String, String> {
    let output = nova_at(server, args, stdin);
    if output.status.success() {
        Ok(String::from_utf8(output.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// `nova read STREAM` through `server` until it answers (a takeover takes a lease ttl or so).
fn read_back(server: &str, stream: &str) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        match nova(server, &["read", stream, "--format", "lines"], b"") {
            Ok(out) => return out.lines().map(str::to_owned).collect(),
            Err(err) if Instant::now() < deadline => {
                eprintln!("reading {stream} through {server}: {err}");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(err) => panic!("reading {stream} through {server}: {err}"),
        }
    }
}

fn lines(prefix: &str, n: usize) -> String {
    (0..n).map(|i| format!("{prefix}-{i}\n")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_page_makes_a_fleet_that_keeps_its_records_through_a_drain_and_a_kill() {
    let etcd = Etcd::start();
    let moto = Moto::start();
    let first = documented_star_flags(0);
    moto.create_bucket(value(&first, "--s3-bucket"));
    assert!(
        Path::new(value(&first, "--data-dir")).is_absolute(),
        "{first:?}"
    );
    let mut stars: Vec<Novad> = (0..3)
        .map(|i| {
            let flags = documented_star_flags(i);
            assert_eq!(value(&flags, "--star-id"), format!("star-{i}"));
            let port = free_port();
            novad()
                .port(port)
                .args(adapted(&flags, &etcd, &moto, port))
                .env("AWS_ACCESS_KEY_ID", "test")
                .env("AWS_SECRET_ACCESS_KEY", "testtest")
                .env("AWS_EC2_METADATA_DISABLED", "true")
                .start()
        })
        .collect();

    // "Clients connect to any star": create through the first, append and read through any.
    let entry = stars[0].url();
    nova(&entry, &["stream", "create", "orders"], b"").expect("stream create");
    nova(
        &stars[1].url(),
        &["append", "orders"],
        lines("a", 50).as_bytes(),
    )
    .expect("append");
    for star in &stars {
        assert_eq!(read_back(&star.url(), "orders").len(), 50);
    }

    // Its leader drains (SIGTERM); the others take the stream on.
    let id = client(&stars[0])
        .await
        .describe_stream("orders")
        .await
        .unwrap()
        .leader_id;
    let drained = leader_of(id);
    let status = stars[drained].terminate(Duration::from_secs(60));
    assert!(status.success(), "{}", stars[drained].log());
    let survivors: Vec<usize> = (0..3).filter(|&i| i != drained).collect();
    let through = stars[survivors[0]].url();
    nova(&through, &["append", "orders"], lines("b", 50).as_bytes()).expect("append after drain");
    let expected: Vec<String> = lines("a", 50)
        .lines()
        .chain(lines("b", 50).lines())
        .map(str::to_owned)
        .collect();
    assert_eq!(read_back(&through, "orders"), expected);

    // The next leader is killed outright; the last star takes its chain over.
    let id = client(&stars[survivors[0]])
        .await
        .describe_stream("orders")
        .await
        .unwrap()
        .leader_id;
    let killed = leader_of(id);
    assert_ne!(killed, drained);
    stars[killed].kill9();
    let last = survivors.into_iter().find(|&i| i != killed).unwrap();
    assert_eq!(read_back(&stars[last].url(), "orders"), expected);
    nova(&stars[last].url(), &["append", "orders"], b"c-0\n").expect("append after the kill");
    assert_eq!(read_back(&stars[last].url(), "orders").len(), 101);
}

/// The index of the star the documented loop named `id` (`star-$i`).
fn leader_of(id: String) -> usize {
    id.strip_prefix("star-")
        .and_then(|i| i.parse().ok())
        .unwrap_or_else(|| panic!("leader {id:?}"))
}
