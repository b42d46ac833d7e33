//! What every Nova server process does the same way: logging, the async runtime, the signals
//! that stop it, and the Prometheus endpoint.

use std::future::Future;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

/// Logs to stderr, filtered by RUST_LOG (default `info`), in colour only on a terminal.
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// What a server's flags tell its `main` beyond their values.
pub trait ServerFlags: clap::Parser {
    /// The introduction of the example environment file (`ops/<binary>.env.example`).
    const ENV_INTRO: &'static str;

    /// Whether `--print-env-example` asked for the example environment file instead of a run.
    fn print_env_example(&self) -> bool;

    /// Refuses settings that cannot work together, naming the flag (what clap cannot check).
    fn check(&self) -> Result<(), String>;

    /// The example environment file: every setting, under its heading, with its default.
    fn env_example() -> String {
        crate::envdoc::env_example(&Self::command(), Self::ENV_INTRO)
    }
}

/// A server binary's whole `main`: parses the flags (exit 2 on bad ones, as clap does), prints
/// the example environment file when asked, starts logging, and runs `serve` on the runtime.
pub fn main<C, F, Fut, E>(name: &str, serve: F) -> ExitCode
where
    C: ServerFlags,
    F: FnOnce(C) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let config = C::parse();
    if config.print_env_example() {
        print!("{}", C::env_example());
        return ExitCode::SUCCESS;
    }
    init_logging();
    if let Err(problem) = config.check() {
        eprintln!("{name}: {problem}");
        return ExitCode::from(2);
    }
    run(name, serve(config))
}

/// Runs `main` on a multi-threaded runtime and turns its outcome into the exit code: 0, or 1
/// with the error logged.
pub fn run<E, F>(name: &str, main: F) -> ExitCode
where
    E: std::fmt::Display,
    F: Future<Output = Result<(), E>>,
{
    // Before the runtime's threads exist: the arena limit binds only arenas made after it.
    nova_core::allocator::tune();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("{name}: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(main) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{name} stopped: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Resolves on SIGTERM or ctrl-c.
pub async fn termination() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Renders the metrics page; called for every scrape.
pub type RenderMetrics = Arc<dyn Fn() -> String + Send + Sync>;

/// Binds the metrics address, failing at once when it is taken: a second process whose
/// metrics silently came from the first would mislead every dashboard.
pub async fn bind_metrics(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("cannot listen for metrics on {addr} (--metrics-addr): {e}"),
        )
    })
}

/// Serves GET /metrics on `listener` until `shutdown`.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    render: RenderMetrics,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let addr = listener.local_addr()?;
    let app = Router::new().route(
        "/metrics",
        get(move || {
            let render = render.clone();
            async move { ([("content-type", "text/plain; version=0.0.4")], render()) }
        }),
    );
    tracing::info!(%addr, "metrics listening");
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}
