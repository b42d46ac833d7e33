//! novagateway: Nova's stateless read tier.

mod admission;
mod config;
mod footers;
mod formula;
mod health;
mod metrics;
mod read;
mod read_ahead;
mod redirects;
mod server;
mod service;
mod tier;

use std::process::ExitCode;

/// Freed large buffers are kept for reuse up to `--recycle-buffer-mib` (set in `server::run`).
#[global_allocator]
static ALLOCATOR: nova_core::allocator::reuse::Reusing = nova_core::allocator::reuse::Reusing;

fn main() -> ExitCode {
    nova_server::process::main::<config::Config, _, _, _>("novagateway", |config| async move {
        server::run(config).await.map_err(|e| format!("{e:#}"))
    })
}
