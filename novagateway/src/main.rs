//! novagateway: Nova's stateless read tier.

mod config;
mod footers;
mod metrics;
mod metrics_http;
mod read;
mod server;
mod service;
mod tier;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let config = config::Config::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if let Err(problem) = config.check() {
        eprintln!("novagateway: {problem}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("novagateway: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(server::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("novagateway stopped: {e:#}");
            ExitCode::FAILURE
        }
    }
}
