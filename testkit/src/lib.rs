//! Real servers for tests: the S3-compatible server (moto) and novad, each started on a free
//! loopback port and stopped by PID when its handle drops.

mod moto;
mod novad;
mod process;

pub use moto::Moto;
pub use novad::{Novad, NovadBuilder};
pub use process::{free_port, wait_for_port, workspace_binary, workspace_root};
