//! What an operator sees: every metric on the metrics endpoint from the first scrape, the
//! memory ceiling and its formula, a clear refusal of budgets that cannot fit, and a star that
//! keeps retrying (and accepts nothing) while its object store is down at start-up.

mod common;

use std::time::{Duration, Instant};

use common::*;
use nova_testkit::{Fault, FaultProxy, Moto};

#[tokio::test]
async fn every_metric_is_exported_from_the_first_scrape() {
    let novad = novad().args(["--memory-ceiling", "2GiB"]).start();
    let page = novad.metrics();
    for name in [
        // Each budget: capacity, use, waiters, wait time.
        "nova_admission_buffer_capacity_bytes",
        "nova_admission_buffer_used_bytes",
        "nova_admission_buffer_waiters",
        "nova_admission_buffer_wait_seconds_bucket",
        "nova_chain_backlog_capacity_flights",
        "nova_chain_backlog_used_flights",
        "nova_chain_backlog_waiters",
        "nova_chain_backlog_wait_seconds_bucket",
        "nova_tail_cache_capacity_bytes",
        "nova_tail_cache_used_bytes",
        "nova_producer_sessions_capacity",
        "nova_producer_sessions",
        // Sheds, rejections, stalls.
        "nova_sheds_total{cap=\"max_producer_sessions\"}",
        "nova_append_rejections_total{reason=\"max_batch_bytes\"}",
        "nova_stalls_total{budget=\"admission_buffer\",cause=\"object_store_unavailable\"}",
        "nova_stalls_total{budget=\"chain_backlog\",cause=\"metastore_slow\"}",
        "nova_stall_seconds_total{budget=\"chain_backlog\",cause=\"absorb_lag\"}",
        // Ages and flights.
        "nova_oldest_admitted_age_seconds",
        "nova_oldest_unabsorbed_flight_age_seconds",
        "nova_flights_in_flight",
        "nova_flights_in_flight_capacity",
        // The object store.
        "nova_object_store_requests_total{op=\"put_if_absent\",outcome=\"ok\"}",
        "nova_object_store_request_duration_seconds_bucket",
        "nova_object_store_bytes_total{op=\"get\"}",
        // Memory.
        "nova_memory_ceiling_bytes",
        "nova_memory_formula_bytes{term=\"admission\"}",
        "nova_memory_formula_bytes{term=\"express\"}",
        "nova_memory_formula_bytes{term=\"tail_cache\"}",
        "nova_memory_formula_bytes{term=\"transport\"}",
        "nova_memory_saturation_ratio",
        "nova_memory_saturated",
        // What the star is and how it is doing.
        "nova_build_info{version=",
        "nova_process_start_time_seconds",
        "nova_star_ready",
        "nova_star_fenced",
        "nova_star_epoch",
        "nova_streams",
        "nova_stored_bytes",
        "nova_metastore_size_bytes",
        "nova_object_store_failing_age_seconds",
        "nova_append_ack_seconds_bucket{class=\"standard\"",
        "nova_appended_records_total",
    ] {
        assert!(page.contains(name), "{name} missing from the metrics page");
    }
    // 2 GiB as given, or the container's limit when that is lower (the flag is capped to it).
    let ceiling = nova_server::memory::detect_ceiling(Some(2u64 << 30)).bytes;
    assert_eq!(
        novad.metric("nova_memory_ceiling_bytes"),
        Some(ceiling as f64)
    );
    assert_eq!(novad.metric("nova_flights_in_flight_capacity"), Some(8.0));
    assert_eq!(
        novad.metric("nova_memory_formula_bytes{term=\"admission\"}"),
        Some((256u64 << 20) as f64)
    );

    // Per-stream series appear with the stream's first append.
    let client = client(&novad).await;
    client.create_stream("orders").await.unwrap();
    let mut session = client.append_session().await.unwrap();
    session
        .append("orders", records("r", 3), None)
        .await
        .unwrap();
    assert_eq!(
        novad.metric("nova_stream_appended_records_total{stream=\"orders\"}"),
        Some(3.0)
    );
    assert!(
        novad
            .metric("nova_stream_appended_bytes_total{stream=\"orders\"}")
            .unwrap()
            > 0.0
    );
    // Every call is counted by method and code, and timed.
    let page = novad.metrics();
    assert!(
        page.contains("nova_rpc_requests_total{code=\"OK\",method=\"CreateStream\"} 1"),
        "{page}"
    );
    assert!(page.contains("nova_rpc_duration_seconds_bucket{method=\"CreateStream\""));
    // A budget's help names its unit.
    assert!(
        page.contains("# HELP nova_admission_buffer_used_bytes Bytes of the admission buffer"),
        "{page}"
    );
    assert!(
        page.contains("# HELP nova_chain_backlog_used_flights Flights of the chain backlog"),
        "{page}"
    );
    assert_eq!(novad.metric("nova_appended_records_total"), Some(3.0));
    assert!(novad.metric("nova_append_ack_seconds_count{class=\"standard\"}") >= Some(1.0));
    // An unknown stream is refused, and who asked is tallied.
    assert!(session.append("nope", records("r", 1), None).await.is_err());
    assert_eq!(
        novad.metric("nova_top_refused_streams{stream=\"nope\"}"),
        Some(1.0)
    );
    assert_eq!(
        novad.metric("nova_top_refused_peers{peer=\"127.0.0.1\"}"),
        Some(1.0)
    );
    // One open session is one stream window in the formula.
    assert_eq!(
        novad.metric("nova_memory_formula_bytes{term=\"transport\"}"),
        Some(65536.0)
    );
}

#[test]
fn budgets_that_cannot_fit_the_ceiling_are_refused_unless_told_to_proceed() {
    let mut refused = novad()
        .args(["--memory-ceiling", "512MiB"])
        .start_detached();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = refused.try_exit_status() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "novad started with budgets over its ceiling"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success());
    let log = refused.log();
    for term in [
        "--s3-memory-buffer-mib",
        "--tail-window-cache-mib",
        "4096 sessions",
        "--allow-memory-overcommit",
    ] {
        assert!(
            log.contains(term),
            "{term} missing from the refusal:\n{log}"
        );
    }

    let told = novad()
        .args(["--memory-ceiling", "512MiB", "--allow-memory-overcommit"])
        .start();
    assert!(told.log().contains("starting anyway"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_star_whose_store_is_down_at_start_keeps_retrying_and_accepts_nothing() {
    let moto = Moto::start();
    moto.create_bucket("late");
    let proxy = FaultProxy::start(([127, 0, 0, 1], moto.port()).into());
    // Refuse, but only after a first start that leaves a chain to settle.
    let dir = tempfile::tempdir().unwrap();
    let s3 = |dir: &std::path::Path| {
        via_endpoint(novad().data_dir(dir), &proxy.endpoint(), "late").args([
            "--s3-request-timeout-ms",
            "500",
            "--s3-max-attempts",
            "1",
        ])
    };
    let mut first = s3(dir.path()).start();
    let before = client(&first).await;
    before.create_stream("s").await.unwrap();
    let mut session = before.append_session().await.unwrap();
    session
        .append("s", records("before", 2), None)
        .await
        .unwrap();
    drop(session);
    first.kill9();

    proxy.set(Fault::Refuse);
    let mut novad = s3(dir.path()).start_detached();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        novad.try_exit_status().is_none(),
        "novad does not crash:\n{}",
        novad.log()
    );
    assert!(
        !novad.is_listening(),
        "novad accepts nothing while it cannot recover"
    );
    let log = novad.log();
    assert!(
        log.contains("keeps retrying and accepts no appends until it succeeds"),
        "a clear message:\n{log}"
    );

    proxy.set(Fault::Pass);
    novad.wait_ready(Duration::from_secs(60));
    let after = client(&novad).await;
    let mut session = after.append_session().await.unwrap();
    let ack = session
        .append("s", records("after", 1), None)
        .await
        .unwrap();
    assert_eq!(
        ack.start_seq, 2,
        "it recovered the chain before accepting appends"
    );
    assert_eq!(
        read_all(&after, "s").await,
        ["before-0", "before-1", "after-0"]
    );
}

/// Every `nova_*` name the shipped alerts and dashboards query is one a star (or, for
/// `nova_gateway_*` names and the gateway's dashboard, a gateway) exports: a panel or an alert on
/// a misspelled or retired metric would show nothing, silently.
#[tokio::test]
async fn the_alerts_and_dashboards_query_only_exported_metrics() {
    let novad = novad().start();
    let gateway =
        nova_testkit::NovadBuilder::gateway(nova_testkit::workspace_binary("novagateway"))
            .args([
                "--star",
                &novad.url(),
                "--store-dir",
                novad.data_dir().join("store").to_str().unwrap(),
            ])
            .start();
    // Per-stream series exist once a stream has taken an append; the most-refused series once
    // something was refused (an append to a stream that does not exist).
    let client = client(&novad).await;
    client.create_stream("s").await.unwrap();
    let mut session = client.append_session().await.unwrap();
    session.append("s", records("r", 1), None).await.unwrap();
    assert!(
        session
            .append("missing", records("r", 1), None)
            .await
            .is_err()
    );
    // A read through the gateway, so its read and RPC series exist.
    let through_gateway = nova_client::Client::connect(&gateway.url()).await.unwrap();
    through_gateway.read("s", 0, 0).await.unwrap();
    let star_page = novad.metrics();
    let gateway_page = gateway.metrics();
    let exports = |page: &str, name: &str| {
        page.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.strip_prefix(name))
            .any(|rest| {
                // A histogram's series carry suffixes.
                let rest = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|suffix| rest.strip_prefix(suffix))
                    .unwrap_or(rest);
                rest.starts_with(['{', ' '])
            })
    };
    let root = nova_testkit::workspace_root();
    for (file, gateway_file) in [
        ("ops/alerts.yml", false),
        ("ops/grafana-dashboard.json", false),
        ("ops/grafana-gateway-dashboard.json", true),
    ] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        let mut names: Vec<&str> = text
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|word| word.starts_with("nova_"))
            .collect();
        names.sort_unstable();
        names.dedup();
        assert!(!names.is_empty(), "{file} queries no metric");
        for name in names {
            let (page, who) = if gateway_file || name.starts_with("nova_gateway_") {
                (&gateway_page, "novagateway")
            } else {
                (&star_page, "novad")
            };
            assert!(
                exports(page, name),
                "{file} queries {name}, which {who} does not export"
            );
        }
    }
}

/// Every link from ops/ (an alert's runbook, a dashboard's or the README's pointer) to a section
/// of docs/ lands on a heading that exists: a page that opens at the top of a long document
/// loses the on-call engineer the minutes the runbook was meant to save.
#[test]
fn every_runbook_link_in_ops_resolves_to_a_heading() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut links = Vec::new();
    for entry in std::fs::read_dir(root.join("ops")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        for (at, _) in text.match_indices("docs/") {
            let rest = &text[at..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || "/._-#".contains(c)))
                .unwrap_or(rest.len());
            if let Some((doc, anchor)) = rest[..end].split_once(".md#") {
                links.push((path.clone(), format!("{doc}.md"), anchor.to_owned()));
            }
        }
    }
    assert!(links.len() >= 10, "too few runbook links found: {links:?}");
    let mut broken = Vec::new();
    for (from, doc, anchor) in &links {
        let text = std::fs::read_to_string(root.join(doc))
            .unwrap_or_else(|err| panic!("{} links to {doc}: {err}", from.display()));
        let found = text
            .lines()
            .filter_map(|line| line.strip_prefix('#'))
            .map(|heading| github_slug(heading.trim_start_matches('#')))
            .any(|slug| slug == *anchor);
        if !found {
            broken.push(format!("{} -> {doc}#{anchor}", from.display()));
        }
    }
    assert!(broken.is_empty(), "links to no heading: {broken:#?}");
}

/// The anchor GitHub gives a heading: lower case, spaces to hyphens, and everything but
/// letters, digits, hyphens and underscores left out.
fn github_slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// A SIGTERM with a follower waiting at a stream's tail (`nova tail -f`) stops at once: the
/// waiting read is answered (an empty page) instead of holding the server's shutdown until
/// its wait ends, which made every such stop wait out the server's 5 s limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_at_the_tail_does_not_hold_a_shutdown() {
    let mut novad = novad().start();
    let client = client(&novad).await;
    client.create_stream("followed").await.unwrap();
    let mut follower = std::process::Command::new(nova_testkit::workspace_binary("nova"))
        .args(["--server", &novad.url(), "tail", "-f", "followed"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Until its read waits at the tail.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let asked = Instant::now();
    let status = novad.terminate(Duration::from_secs(30));
    let took = asked.elapsed();
    let _ = follower.kill();
    let _ = follower.wait();
    assert!(status.success(), "{}", novad.log());
    // The server's limit for calls still open is 5 s: a stop that waited it out was held.
    assert!(took < Duration::from_millis(4500), "the stop took {took:?}");
    assert!(
        novad.log().contains("novad stopped cleanly"),
        "{}",
        novad.log()
    );
}

/// An etcd that does not answer at start is waited out, as a store outage is, saying which
/// endpoint it waits for; the star starts once etcd answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_star_waits_for_etcd_at_start_naming_it() {
    let etcd = nova_testkit::Etcd::start();
    let upstream: std::net::SocketAddr = etcd.endpoint().parse().unwrap();
    let proxy = FaultProxy::start(upstream);
    proxy.set(Fault::Refuse);
    let endpoint = format!("127.0.0.1:{}", proxy.port());
    let mut novad = novad()
        .args([
            "--metastore",
            &format!("etcd://{endpoint}"),
            "--star-id",
            "waits",
        ])
        .start_detached();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        novad.try_exit_status().is_none(),
        "novad does not stop:\n{}",
        novad.log()
    );
    assert!(!novad.is_listening(), "it accepts nothing meanwhile");
    let log = novad.log();
    assert!(
        log.contains(&format!("{endpoint} does not answer")) && log.contains("start etcd"),
        "the log names the endpoint and what to do:\n{log}"
    );
    proxy.set(Fault::Pass);
    novad.wait_serving();
    client(&novad).await.create_stream("after").await.unwrap();
}

/// Stars of one fleet must share one object store: a second star on a local directory store of
/// its own is refused at start, naming its store and the fleet's, instead of joining a fleet
/// whose handoffs and takeovers would lose its reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_star_on_another_store_than_the_fleets_is_refused() {
    let etcd = nova_testkit::Etcd::start();
    let fleet = |id: &str| {
        novad().args([
            "--metastore",
            &etcd.url(),
            "--star-id",
            id,
            "--lease-ttl-secs",
            "3",
        ])
    };
    let first = fleet("star-0").start();
    client(&first).await.create_stream("s").await.unwrap();
    let mut second = fleet("star-1").start_detached();
    let mut exited = None;
    for _ in 0..300 {
        exited = second.try_exit_status();
        if exited.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = second.log();
    let status = exited.unwrap_or_else(|| panic!("star-1 kept running:\n{log}"));
    assert!(!status.success(), "{log}");
    assert!(log.contains("is not the fleet's"), "{log}");
    assert!(log.contains("star \"star-0\" joined the fleet on"), "{log}");
    assert!(
        log.contains(&second.data_dir().display().to_string()),
        "{log}"
    );
    // The first star is unaffected.
    client(&first).await.describe_stream("s").await.unwrap();
}

/// A fleet star checks that its store is the fleet's before it joins: a store that does not
/// answer yet is waited out there, as recovery waits it out, and the star starts once it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_star_whose_store_is_down_at_start_waits_for_it() {
    let etcd = nova_testkit::Etcd::start();
    let moto = Moto::start();
    moto.create_bucket("fleet");
    let proxy = FaultProxy::start(([127, 0, 0, 1], moto.port()).into());
    proxy.set(Fault::Refuse);
    let mut novad = via_endpoint(novad(), &proxy.endpoint(), "fleet")
        .args([
            "--s3-request-timeout-ms",
            "500",
            "--s3-max-attempts",
            "1",
            "--metastore",
            &etcd.url(),
            "--star-id",
            "waits-for-store",
        ])
        .start_detached();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        novad.try_exit_status().is_none(),
        "novad does not stop:\n{}",
        novad.log()
    );
    assert!(!novad.is_listening(), "it accepts nothing meanwhile");
    let log = novad.log();
    assert!(log.contains("waits for the object store"), "{log}");
    proxy.set(Fault::Pass);
    novad.wait_serving();
    client(&novad).await.create_stream("after").await.unwrap();
}

/// A star given S3 flags but no credentials says so in one line per attempt (not the SDK's
/// kilobyte naming every provider it tried), keeps waiting for the store, and does not join
/// its fleet meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_star_without_aws_credentials_says_so_in_one_line_and_does_not_join() {
    let etcd = nova_testkit::Etcd::start();
    let moto = Moto::start();
    moto.create_bucket("fleet");
    let home = tempfile::tempdir().unwrap();
    let mut builder = novad()
        .args([
            "--s3-bucket",
            "fleet",
            "--s3-endpoint",
            &moto.endpoint(),
            "--s3-path-style",
            "--metastore",
            &etcd.url(),
            "--star-id",
            "no-credentials",
        ])
        .env("HOME", home.path().display().to_string())
        .env("AWS_EC2_METADATA_DISABLED", "true");
    for ambient in [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_CONFIG_FILE",
        "AWS_SHARED_CREDENTIALS_FILE",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    ] {
        builder = builder.env_remove(ambient);
    }
    let mut novad = builder.start_detached();
    eventually(Duration::from_secs(20), "the credentials message", || {
        novad.log().contains("no AWS credentials found")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        novad.try_exit_status().is_none(),
        "it waits:\n{}",
        novad.log()
    );
    assert!(!novad.is_listening(), "it accepts nothing meanwhile");
    let log = novad.log();
    for line in log.lines().filter(|l| l.contains("credentials")) {
        assert!(line.len() < 600, "one short line per attempt: {line}");
        assert!(!line.contains("ProviderChainError"), "{line}");
    }
    assert!(!log.contains("joined the fleet"), "{log}");
    // Another star sees no member: the credential-less one never registered.
    let other = novad_in_fleet_with_credentials(&etcd, &moto);
    let seen = other.metric("nova_fleet_stars");
    assert_eq!(seen, Some(1.0), "{}", other.log());
}

fn novad_in_fleet_with_credentials(etcd: &nova_testkit::Etcd, moto: &Moto) -> nova_testkit::Novad {
    with_s3(novad(), moto, "fleet")
        .args(["--metastore", &etcd.url(), "--star-id", "with-credentials"])
        .start()
}

/// A fleet star's advertised address must lead to it. Written without a scheme (as `nova
/// --server` takes it), it is a URL redirects can follow; naming another star's address, the
/// star waits, saying so, and is refused; naming another server, it stops once it finds out;
/// naming nothing, it warns. None of these leaves a fleet that looks healthy while its
/// redirects fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_advertised_address_that_does_not_lead_to_the_star_is_not_silent() {
    let etcd = nova_testkit::Etcd::start();
    let moto = Moto::start();
    moto.create_bucket("fleet");
    let star = |id: &str| {
        with_s3(novad(), &moto, "fleet").args([
            "--metastore",
            &etcd.url(),
            "--star-id",
            id,
            "--lease-ttl-secs",
            "3",
        ])
    };
    let exits = |novad: &mut nova_testkit::Novad, within: Duration| {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(status) = novad.try_exit_status() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    };

    // Scheme-less, and right: a redirect through another star reaches it.
    let port = nova_testkit::free_port();
    let first = star("star-0")
        .port(port)
        .args(["--advertise-addr", &format!("127.0.0.1:{port}")])
        .start();
    let entry = client(&first).await;
    entry.create_stream("s").await.unwrap();
    let mut session = entry.append_session().await.unwrap();
    session.append("s", records("r", 3), None).await.unwrap();
    drop(session);
    assert!(
        !first.log().contains("cannot reach itself"),
        "{}",
        first.log()
    );

    // Another star's address: refused, naming that star.
    let mut copied = star("star-1")
        .args(["--advertise-addr", &format!("127.0.0.1:{port}")])
        .start_detached();
    // It says so at once, and is refused once star-0 could have stopped or lapsed.
    eventually(Duration::from_secs(15), "the wait for the address", || {
        copied
            .log()
            .contains("another star is registered with this star's address")
    })
    .await;
    let status = exits(&mut copied, Duration::from_secs(70))
        .unwrap_or_else(|| panic!("star-1 kept running:\n{}", copied.log()));
    assert!(!status.success());
    assert!(
        copied.log().contains("star \"star-0\" already advertises"),
        "{}",
        copied.log()
    );

    // Another server's address (a single star, in no fleet): stops once it finds out.
    let outsider = novad().start();
    let mut elsewhere = star("star-2")
        .args(["--advertise-addr", &outsider.url()])
        .start_detached();
    let status = exits(&mut elsewhere, Duration::from_secs(60))
        .unwrap_or_else(|| panic!("star-2 kept running:\n{}", elsewhere.log()));
    assert!(!status.success());
    assert!(
        elsewhere
            .log()
            .contains("reaches star \"nova\", not this star"),
        "{}",
        elsewhere.log()
    );

    // Nothing there: a warning naming the flag.
    let nowhere = nova_testkit::free_port();
    let lost = star("star-3")
        .args(["--advertise-addr", &format!("127.0.0.1:{nowhere}")])
        .start();
    eventually(Duration::from_secs(30), "the unreachable warning", || {
        lost.log()
            .contains("cannot reach itself at its advertised address")
    })
    .await;
    assert!(lost.log().contains("WARN"), "{}", lost.log());
    assert!(
        lost.log().contains("check --advertise-addr"),
        "{}",
        lost.log()
    );

    // The first star served throughout, through the fleet's redirects.
    let other = client(&lost).await;
    assert_eq!(read_all(&other, "s").await, ["r-0", "r-1", "r-2"]);
}

/// Every critical task is watched: one that dies (here by the debug builds' fault hook,
/// `NOVA_FAULT_KILL_TASK`) shuts novad down with a non-zero exit, its log naming the task and
/// why, instead of leaving a process that looks alive and does nothing. One task each of the
/// chain, the auditor, the servers and (on etcd) the fleet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_critical_task_that_dies_stops_novad_naming_it() {
    let etcd = nova_testkit::Etcd::start();
    for (task, fleet) in [
        ("chain absorber", false),
        ("auditor settle", false),
        ("metastore size", false),
        ("fleet takeovers", true),
    ] {
        let mut builder = novad().env("NOVA_FAULT_KILL_TASK", task);
        if fleet {
            builder = builder.args(["--metastore", &etcd.url(), "--star-id", "killed"]);
        }
        let mut star = builder.start_detached();
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = star.try_exit_status() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "{task}: novad kept running:\n{}",
                star.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let log = star.log();
        assert!(!status.success(), "{task}: {log}");
        assert!(
            log.contains(&format!("task {task} panicked")),
            "{task}: the log names it:\n{log}"
        );
        assert!(log.contains("shutting down"), "{task}: {log}");
    }
}
