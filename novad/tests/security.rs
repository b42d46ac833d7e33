//! TLS, mutual TLS and scoped tokens on a real star, from the SDK, the CLI and Python grpcio;
//! certificates and tokens reloaded without a restart; tokens in no log line, even at trace.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;
use nova_client::{Client, ClientConfig, ClientTls, ErrorCode, Record, RetryPolicy};
use nova_server::net::auth::{Scope, file_line};
use nova_testkit::certs::{Certs, Identity};
use nova_testkit::{Novad, python, run_nova, run_nova_as, workspace_binary};

fn tls_star(certs: &Certs) -> nova_testkit::NovadBuilder {
    let server = certs.server();
    novad().args([
        "--tls-cert",
        server.cert.to_str().unwrap(),
        "--tls-key",
        server.key.to_str().unwrap(),
    ])
}

fn https(novad: &Novad) -> String {
    novad.url().replace("http://", "https://")
}

fn trusting(ca: &Path) -> ClientTls {
    ClientTls::from_files(Some(ca), None, None).unwrap()
}

async fn connect(
    url: &str,
    tls: ClientTls,
    token: Option<&str>,
) -> Result<Client, nova_client::Error> {
    let mut config = ClientConfig::new([url])
        .with_retry(RetryPolicy::none())
        .with_tls(tls);
    if let Some(token) = token {
        config = config.with_token(token).unwrap();
    }
    Client::connect_with(config).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_round_trip_from_the_sdk_the_cli_and_python_and_no_plain_text() {
    let certs = Certs::new();
    let novad = tls_star(&certs).start();
    let url = https(&novad);

    // The SDK, trusting the test CA.
    let client = connect(&url, trusting(&certs.ca()), None).await.unwrap();
    client.create_stream("secret").await.unwrap();
    let mut session = client.append_session().await.unwrap();
    session
        .append("secret", records("s", 3), None)
        .await
        .unwrap();
    assert_eq!(read_all(&client, "secret").await, ["s-0", "s-1", "s-2"]);

    // The CLI.
    let ca = certs.ca();
    let ca = ca.to_str().unwrap();
    let appended = run_nova(
        &["--server", &url, "--tls-ca", ca, "append", "secret"],
        b"cli\n",
    );
    assert!(
        appended.status.success(),
        "{}",
        String::from_utf8_lossy(&appended.stderr)
    );
    let read = run_nova(
        &[
            "--server", &url, "--tls-ca", ca, "read", "secret", "--from", "3",
        ],
        b"",
    );
    assert_eq!(String::from_utf8_lossy(&read.stdout), "cli\n");
    // Without the CA the server's certificate is not trusted, and nova says which flag helps.
    let untrusted = run_nova(&["--server", &url, "stream", "list"], b"");
    assert!(!untrusted.status.success());
    let stderr = String::from_utf8_lossy(&untrusted.stderr);
    assert!(stderr.contains("--tls-ca"), "{stderr}");

    // Python grpcio, through reflection, verifying the certificate for localhost.
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/generic_client.py");
    let output = Command::new(python())
        .arg(&script)
        .arg(format!("localhost:{}", novad.port()))
        .arg("from-python")
        .env("NOVA_TEST_CA", certs.ca())
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("speaking TLS") && stdout.contains("read back 2 records"));

    // A plain-text client gets nothing from a TLS listener: no fallback either way.
    let plain = Client::connect(&novad.url()).await;
    let refused = match plain {
        Ok(client) => client.list_streams("", "", 10).await.map(|_| ()),
        Err(error) => Err(error),
    };
    assert!(refused.is_err(), "plain text reached a TLS listener");
    assert!(
        novad
            .metric("nova_connections_refused_total{reason=\"tls_handshake\"}")
            .unwrap()
            >= 1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_refuses_a_client_without_a_certificate() {
    let certs = Certs::new();
    let ca = certs.ca();
    let novad = tls_star(&certs)
        .args(["--tls-client-ca", ca.to_str().unwrap()])
        .start();
    let url = https(&novad);
    let anonymous = match connect(&url, trusting(&ca), None).await {
        Ok(client) => client.list_streams("", "", 10).await.map(|_| ()),
        Err(error) => Err(error),
    };
    assert!(
        anonymous.is_err(),
        "a client without a certificate was served"
    );
    assert!(
        novad
            .metric("nova_connections_refused_total{reason=\"tls_handshake\"}")
            .unwrap()
            >= 1.0,
        "the handshake without a certificate was refused"
    );

    let Identity { cert, key } = certs.client("producer");
    let tls = ClientTls::from_files(Some(&ca), Some((&cert, &key)), None).unwrap();
    let client = connect(&url, tls, None).await.unwrap();
    client.create_stream("m").await.unwrap();
    assert_eq!(client.list_streams("", "", 10).await.unwrap().0.len(), 1);
}

/// A tokens file and the tokens it lists.
struct TokenFile {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

const ADMIN: &str = "admin-token-0123456789abcdef";
const INGEST: &str = "ingest-token-0123456789abcdef";
const READER: &str = "reader-token-0123456789abcdef";

fn token_file() -> TokenFile {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens");
    write_tokens(
        &path,
        &[
            (
                "ops",
                &[
                    grant(Scope::Admin, ""),
                    grant(Scope::Append, ""),
                    grant(Scope::Read, ""),
                ],
                ADMIN,
            ),
            (
                "ingest",
                &[grant(Scope::Append, "logs/"), grant(Scope::Read, "logs/")],
                INGEST,
            ),
            ("analytics", &[grant(Scope::Read, "")], READER),
        ],
    );
    TokenFile { path, _dir: dir }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_checked_by_scope_and_prefix_and_never_logged() {
    let tokens = token_file();
    let novad = novad()
        .args(["--auth-tokens", tokens.path.to_str().unwrap()])
        .env("RUST_LOG", "trace")
        .start();
    let url = novad.url();
    let as_ = |token: Option<&'static str>| {
        let url = url.clone();
        async move { connect(&url, ClientTls::default(), token).await.unwrap() }
    };
    let admin = as_(Some(ADMIN)).await;
    admin.create_stream("logs/app").await.unwrap();
    admin.create_stream("billing/x").await.unwrap();

    // No token, or one the star does not know: UNAUTHENTICATED, whatever the call.
    for client in [as_(None).await, as_(Some("not-a-known-token")).await] {
        let err = client.describe_stream("logs/app").await.unwrap_err();
        assert_eq!(err.kind(), ErrorCode::Unauthenticated, "{err}");
        assert!(!err.to_string().contains("not-a-known-token"));
        let err = client.create_stream("logs/new").await.unwrap_err();
        assert_eq!(err.kind(), ErrorCode::Unauthenticated, "{err}");
    }

    // A token for logs/ appends and reads there, and nowhere else.
    let ingest = as_(Some(INGEST)).await;
    let mut session = ingest.append_session().await.unwrap();
    session
        .append("logs/app", records("l", 2), None)
        .await
        .unwrap();
    let denied = session
        .append("billing/x", records("b", 1), None)
        .await
        .unwrap_err();
    assert_eq!(denied.kind(), ErrorCode::PermissionDenied, "{denied}");
    assert!(denied.to_string().contains("no append scope"), "{denied}");
    // The session goes on after a refused append.
    session
        .append("logs/app", records("m", 1), None)
        .await
        .unwrap();
    assert_eq!(read_all(&ingest, "logs/app").await.len(), 3);
    let err = ingest.read("billing/x", 0, 0).await.unwrap_err();
    assert_eq!(err.kind(), ErrorCode::PermissionDenied, "{err}");
    assert!(
        err.to_string()
            .contains("no read scope for stream \"billing/x\""),
        "{err}"
    );
    // A listing is a read of every stream under its prefix: within the grant, or refused.
    assert_eq!(
        ingest.list_streams("logs/", "", 10).await.unwrap().0.len(),
        1
    );
    let err = ingest.list_streams("", "", 10).await.unwrap_err();
    assert_eq!(err.kind(), ErrorCode::PermissionDenied, "{err}");
    // ... saying to list under a prefix, without naming the token's.
    assert!(err.to_string().contains("under a prefix"), "{err}");
    assert!(!err.to_string().contains("logs/"), "{err}");
    // Describing needs any scope on the stream (a producer learns its tail this way), and a
    // refusal names every scope that would have done, not the first one tried.
    assert!(ingest.describe_stream("logs/app").await.is_ok());
    let err = ingest.describe_stream("billing/x").await.unwrap_err();
    assert_eq!(err.kind(), ErrorCode::PermissionDenied, "{err}");
    assert!(
        err.to_string()
            .contains("none of the read, append or admin scopes"),
        "{err}"
    );
    for err in [
        ingest.create_stream("logs/other").await.unwrap_err(),
        ingest.delete_stream("logs/app").await.unwrap_err(),
    ] {
        assert_eq!(err.kind(), ErrorCode::PermissionDenied, "{err}");
        assert!(err.to_string().contains("no admin scope"), "{err}");
    }

    // A read token reads everything and changes nothing.
    let reader = as_(Some(READER)).await;
    assert_eq!(read_all(&reader, "logs/app").await.len(), 3);
    assert!(reader.read("billing/x", 0, 0).await.is_ok());
    // A token that may append nowhere is refused its session (it would hold a session place).
    let err = match reader.append_session().await {
        Ok(mut session) => session
            .append("logs/app", vec![Record::new("x")], None)
            .await
            .unwrap_err(),
        Err(err) => err,
    };
    assert_eq!(err.kind(), ErrorCode::PermissionDenied, "{err}");
    assert!(err.to_string().contains("no append scope"), "{err}");
    for err in [
        reader.create_stream("z").await.unwrap_err(),
        reader.delete_stream("billing/x").await.unwrap_err(),
    ] {
        assert_eq!(err.kind(), ErrorCode::PermissionDenied, "{err}");
    }

    assert!(
        novad
            .metric("nova_auth_refusals_total{reason=\"unauthenticated\"}")
            .unwrap()
            >= 4.0
    );
    assert!(
        novad
            .metric("nova_auth_refusals_total{reason=\"permission_denied\"}")
            .unwrap()
            >= 6.0
    );
    // The ingest token's append to billing/ (the read token was refused its whole session,
    // counted above with the other refusals).
    assert_eq!(
        novad.metric("nova_append_rejections_total{reason=\"permission_denied\"}"),
        Some(1.0)
    );
    // Every call went through a trace-level log: no token is in it.
    let log = novad.log();
    assert!(log.contains("TRACE"), "the star logged at trace");
    for token in [ADMIN, INGEST, READER, "not-a-known-token"] {
        assert!(!log.contains(token), "a token reached the log");
    }
    let metrics = novad.metrics();
    for token in [ADMIN, INGEST, READER] {
        assert!(!metrics.contains(token));
    }
}

/// Polls `check` for up to ten seconds (a reload follows a changed file within two).
async fn within_ten_seconds(what: &str, mut check: impl AsyncFnMut() -> bool) {
    for _ in 0..100 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("not within ten seconds: {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_and_tokens_reload_without_a_restart() {
    let first = Certs::new();
    let second = Certs::new();
    // The star reads its certificate from files that will be replaced.
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("star.pem"), dir.path().join("star.key"));
    std::fs::copy(first.server().cert, &cert).unwrap();
    std::fs::copy(first.server().key, &key).unwrap();
    let tokens = token_file();
    let mut novad = novad()
        .args([
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--auth-tokens",
            tokens.path.to_str().unwrap(),
        ])
        .start();
    let url = https(&novad);
    let served = async |ca: &Path, token: &str| match connect(&url, trusting(ca), Some(token)).await
    {
        Ok(client) => client.list_streams("", "", 10).await.is_ok(),
        Err(_) => false,
    };
    assert!(served(&first.ca(), ADMIN).await);
    assert!(!served(&second.ca(), ADMIN).await);

    // A new certificate, from another CA: new connections get it.
    std::fs::copy(second.server().key, &key).unwrap();
    std::fs::copy(second.server().cert, &cert).unwrap();
    within_ten_seconds("the second CA's certificate is served", async || {
        served(&second.ca(), ADMIN).await
    })
    .await;
    assert!(!served(&first.ca(), ADMIN).await);

    // A new token list on SIGHUP: the old admin token goes, a new one comes. The file keeps
    // its modification time, so only the signal can make the star read it again.
    let stamp = std::fs::metadata(&tokens.path).unwrap().modified().unwrap();
    let write_fresh = || {
        write_tokens(
            &tokens.path,
            &[(
                "ops2",
                &[grant(Scope::Admin, ""), grant(Scope::Read, "")],
                "fresh-admin-token",
            )],
        )
    };
    write_fresh();
    std::fs::File::options()
        .write(true)
        .open(&tokens.path)
        .unwrap()
        .set_modified(stamp)
        .unwrap();
    let pid = novad.pid().unwrap().to_string();
    assert!(
        Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success()
    );
    within_ten_seconds("the new token is accepted", async || {
        served(&second.ca(), "fresh-admin-token").await
    })
    .await;
    assert!(!served(&second.ca(), ADMIN).await);
    assert!(novad.log().contains("--auth-tokens reloaded (SIGHUP)"));
    // A broken file is refused, and fails closed: no token is accepted until it is fixed (a
    // revocation written badly must not leave the revoked token working).
    std::fs::write(&tokens.path, "ops admin: plaintext-token\n").unwrap();
    within_ten_seconds("the broken file is refused", async || {
        novad.log().contains("--auth-tokens not reloaded")
    })
    .await;
    assert!(novad.log().contains("NO TOKEN IS ACCEPTED"));
    assert!(!served(&second.ca(), "fresh-admin-token").await);
    // Fixed, the file's tokens are accepted again.
    write_fresh();
    within_ten_seconds("the fixed file's token is accepted", async || {
        served(&second.ca(), "fresh-admin-token").await
    })
    .await;
    assert!(
        novad
            .metric("nova_tls_reloads_total{outcome=\"ok\"}")
            .unwrap()
            >= 1.0
    );
    novad.kill9();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_from_nova_token_new_works_from_nova_token_in_the_environment() {
    let made = run_nova(
        &["token", "new", "--name", "ci", "--grant", "append:ci/"],
        b"",
    );
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    // Text output: the token, then the line for the file.
    let made = String::from_utf8(made.stdout).unwrap();
    let lines: Vec<&str> = made.lines().collect();
    let token = lines[0].strip_prefix("token: ").unwrap().to_owned();
    assert_eq!(lines[1], "line for --auth-tokens:");
    let line = lines[2].to_owned();
    assert!(line.starts_with("ci append:ci/ sha256:"), "{line}");
    assert_eq!(token.len(), 64, "32 random bytes in hex");
    assert!(
        !line.contains(&token),
        "the line holds a digest, not the token"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens");
    // An operator's token beside it, to create the stream: the new one may only append.
    std::fs::write(
        &path,
        format!(
            "# made by nova token new\n{line}\n{}\n",
            file_line("ops", &[grant(Scope::Admin, "")], ADMIN)
        ),
    )
    .unwrap();
    let novad = novad()
        .args(["--auth-tokens", path.to_str().unwrap()])
        .start();
    let url = novad.url();

    let created = run_nova_as(
        Some(ADMIN),
        &["--server", &url, "stream", "create", "ci/a"],
        b"",
    );
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    let appended = run_nova_as(
        Some(&token),
        &["--server", &url, "append", "ci/a"],
        b"one\ntwo\n",
    );
    assert!(
        appended.status.success(),
        "{}",
        String::from_utf8_lossy(&appended.stderr)
    );
    // The token grants no read: the CLI says which scope is missing, and never the token.
    let read = run_nova_as(Some(&token), &["--server", &url, "read", "ci/a"], b"");
    assert!(!read.status.success());
    let stderr = String::from_utf8_lossy(&read.stderr);
    assert!(stderr.contains("no read scope"), "{stderr}");
    assert!(!stderr.contains(&token), "{stderr}");
    // Without any token the star answers UNAUTHENTICATED, and nova says how to give one.
    let anonymous = run_nova(&["--server", &url, "stream", "list"], b"");
    assert!(!anonymous.status.success());
    let stderr = String::from_utf8_lossy(&anonymous.stderr);
    assert!(stderr.contains("NOVA_TOKEN"), "{stderr}");
    assert!(!novad.log().contains(&token));

    // The SDK takes the same variable when asked to.
    // SAFETY: nextest runs each test in a process of its own, and nothing else in this one
    // reads the environment while it is set.
    unsafe { std::env::set_var(nova_client::TOKEN_ENV, &token) };
    let config = ClientConfig::new([url.as_str()])
        .with_token_from_env()
        .unwrap();
    unsafe { std::env::remove_var(nova_client::TOKEN_ENV) };
    let client = Client::connect_with(config).await.unwrap();
    assert_eq!(client.describe_stream("ci/a").await.unwrap().tail_seq, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_to_a_star_without_tls_or_tokens_does_not_stop_it() {
    let novad = novad().start();
    let pid = novad.pid().unwrap().to_string();
    assert!(
        Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success()
    );
    within_ten_seconds("the SIGHUP is logged", async || {
        novad.log().contains("SIGHUP: nothing to reload")
    })
    .await;
    let client = client(&novad).await;
    client.create_stream("after-hup").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_checks_its_clients_tokens_and_calls_its_star_over_tls_with_its_own() {
    let certs = Certs::new();
    let tokens = token_file();
    let server = certs.server();
    let tls_args = [
        "--tls-cert",
        server.cert.to_str().unwrap(),
        "--tls-key",
        server.key.to_str().unwrap(),
        "--auth-tokens",
        tokens.path.to_str().unwrap(),
    ];
    let star = novad().args(tls_args).start();
    let ca = certs.ca();
    let admin = connect(&https(&star), trusting(&ca), Some(ADMIN))
        .await
        .unwrap();
    admin.create_stream("logs/app").await.unwrap();
    admin.create_stream("billing/x").await.unwrap();
    let mut session = admin.append_session().await.unwrap();
    for stream in ["logs/app", "billing/x"] {
        session.append(stream, records("r", 4), None).await.unwrap();
    }

    // The gateway reads from the star with the analytics token (read on every stream).
    let store_dir = star.data_dir().join("store");
    let gateway = nova_testkit::NovadBuilder::gateway(workspace_binary("novagateway"))
        .args(tls_args)
        .args([
            "--star",
            &https(&star),
            "--upstream-ca",
            ca.to_str().unwrap(),
            "--upstream-token",
            READER,
            "--store-dir",
            store_dir.to_str().unwrap(),
        ])
        .start();
    let url = https(&gateway);

    // Its clients' tokens are checked by the gateway itself: the gateway's own broader token
    // reaches no further than each client's grants.
    let ingest = connect(&url, trusting(&ca), Some(INGEST)).await.unwrap();
    assert_eq!(read_all(&ingest, "logs/app").await.len(), 4);
    let err = ingest.read("billing/x", 0, 0).await.unwrap_err();
    assert_eq!(err.kind(), ErrorCode::PermissionDenied, "{err}");
    let anonymous = connect(&url, trusting(&ca), None).await.unwrap();
    let err = anonymous.read("logs/app", 0, 0).await.unwrap_err();
    assert_eq!(err.kind(), ErrorCode::Unauthenticated, "{err}");
    let reader = connect(&url, trusting(&ca), Some(READER)).await.unwrap();
    assert_eq!(read_all(&reader, "billing/x").await.len(), 4);
    assert!(
        gateway
            .metric("nova_gateway_auth_refusals_total{reason=\"unauthenticated\"}")
            .unwrap()
            >= 1.0
    );
    for token in [ADMIN, INGEST, READER] {
        assert!(!gateway.log().contains(token), "a token reached the log");
    }
}
