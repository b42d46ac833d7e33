//! novad: the Nova star.

mod advertise;
mod config;
mod express;
mod kafka;
mod memory;
mod server;
mod service;
mod zone_spec;

use std::process::ExitCode;

fn main() -> ExitCode {
    nova_server::process::main::<config::Config, _, _, _>("novad", |config| async move {
        server::run(config).await.map_err(|e| format!("{e:#}"))
    })
}
