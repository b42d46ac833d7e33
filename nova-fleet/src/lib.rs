//! The fleet: stars sharing one catalog in etcd. Each star registers under a lease, publishes
//! its load, and keeps a view of the others; each stream has a leader record naming the star
//! that leads it. A request for a stream reaches its leader: any other star answers with a
//! redirect naming it, and a stream without a leader is placed on the least-loaded star that
//! is neither saturated nor draining.
//!
//! One module per job: [`keys`] (the keys and the registration's codec), [`membership`] (the
//! lease, the view of the others), `placement` (placing streams, redirects), `leadership`
//! (taking streams up, creating and deleting them), `handoff` (moving leadership off a healthy
//! star), `takeover` (settling a departed star's chain) and `adoption` (looking after a chain
//! whose star left for good). `novad` wires it to a star and its gRPC service; `nova-sim`
//! drives it from a seed. docs/fleet.md states why no two stars ever acknowledge one stream's
//! records.

mod adoption;
mod error;
mod handoff;
pub mod keys;
mod leadership;
pub mod membership;
mod metrics;
mod placement;
mod store_identity;
mod takeover;

pub use error::{HandoffError, JoinError, TakeoverError};
pub use keys::{LeaderRecords, Member};
pub use membership::{Fleet, FleetConfig};
pub use metrics::FleetMetrics;
pub use store_identity::check_shared_store;
pub use takeover::TakeoverContext;

/// The cap a fleet-capacity refusal names: no star of the fleet is open to a new stream's
/// leadership (every one saturated, draining or full at `--max-streams`).
pub const FLEET_CAPACITY: &str = "fleet capacity";
