//! novagateway: Nova's stateless read tier.

mod config;
mod footers;
mod formula;
mod health;
mod metrics;
mod read;
mod redirects;
mod server;
mod service;
mod tier;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let config = config::Config::parse();
    if config.print_env_example {
        print!("{}", config::env_example());
        return ExitCode::SUCCESS;
    }
    nova_server::process::init_logging();
    if let Err(problem) = config.check() {
        eprintln!("novagateway: {problem}");
        return ExitCode::from(2);
    }
    nova_server::process::run("novagateway", async move {
        server::run(config).await.map_err(|e| format!("{e:#}"))
    })
}
