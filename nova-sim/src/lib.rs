//! Nova's deterministic simulation: the real star (recovery, packer, writers, resolver,
//! absorber) run against an object store and a metastore that fail as the seed decides, with
//! simulated producers and consumers, crashed and restarted, and checked by an oracle after
//! every run. See docs/testing.md.

pub mod fleet;
pub mod metastore;
pub mod oracle;
pub mod plan;
pub mod run;
pub mod store;

pub use fleet::{FleetReport, run_fleet_seed};
pub use run::{Audited, Failure, Report, replay_command, run_seed};
