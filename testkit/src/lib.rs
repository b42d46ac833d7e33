//! Real servers for tests: the S3-compatible server (moto), etcd and novad, each started on a free
//! loopback port and stopped by PID when its handle drops; a star on local storage behind fault
//! injectors (`chain`); and the helpers several test crates share (running the `nova` CLI,
//! finding the test virtualenv's Python, waiting for a condition).

pub mod certs;
pub mod chain;
pub mod cold_readers;
pub mod crash_loop;
mod etcd;
pub mod help;
pub mod history;
mod moto;
pub mod netns;
mod novad;
pub mod outage;
mod process;
mod proxy;
pub mod raw_h2;
mod wait;

pub use etcd::{Etcd, EtcdCluster};
pub use moto::{LoggedRequest, Moto};
pub use novad::{
    Novad, NovadBuilder, formula_bytes, gateway_formula_bytes, scrape, scrape_at, series,
};
pub use process::{
    free_port, nova_at, python, run_nova, run_nova_as, succeeded, wait_for_port, workspace_binary,
    workspace_root,
};
pub use proxy::{Fault, FaultProxy};
pub use wait::{eventually, eventually_every};
