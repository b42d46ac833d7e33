//! Nova's core: records, the flight object format, budgets, the catalog, the object store and
//! metastore traits with their backends, and metrics. Everything a star and a gateway share.

pub mod allocator;
pub mod budget;
pub mod catalog;
pub use nova_proto::clock;
pub mod entropy;
pub mod flight;
pub mod formula;
pub mod in_order;
pub mod keys;
pub mod limits;
pub mod manifest;
pub mod metastore;
pub mod metrics;
pub mod object_store;
pub mod prom;
pub mod rate;
pub mod record;
mod request_error;
pub use request_error::refusal;
pub mod supervisor;
pub mod top;
