//! novad: the Nova star.

mod advertise;
mod config;
mod express;
mod memory;
mod server;
mod service;
mod zone_spec;

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
        eprintln!("novad: {problem}");
        return ExitCode::from(2);
    }
    nova_server::process::run("novad", async move {
        server::run(config).await.map_err(|e| format!("{e:#}"))
    })
}
