//! What Nova's server processes (novad and novagateway) share at their edge, kept out of
//! nova-core so the crates every other one builds on carry no web server, flag parser or TLS:
//! the network edge (`net`: TLS, tokens, connection and request limits), the object-store
//! flags (`store_args`), logging, signals and the metrics endpoint (`process`), the example
//! environment files (`envdoc`), rate-limited shed logs (`shed`), and the process's memory
//! ceiling and resource metrics (`memory`).

pub mod envdoc;
pub mod memory;
pub mod net;
pub mod process;
pub mod shed;
mod store_args;

pub use store_args::StoreArgs;
