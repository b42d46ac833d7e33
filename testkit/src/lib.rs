//! Real servers for tests: the S3-compatible server (moto), etcd and novad, each started on a free
//! loopback port and stopped by PID when its handle drops.

pub mod certs;
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

pub use etcd::{Etcd, EtcdCluster};
pub use moto::{LoggedRequest, Moto};
pub use novad::{
    Novad, NovadBuilder, formula_bytes, gateway_formula_bytes, scrape, scrape_at, series,
};
pub use process::{free_port, run_nova, wait_for_port, workspace_binary, workspace_root};
pub use proxy::{Fault, FaultProxy};
