//! Records as the star holds them. The types live in `nova_proto::domain`, beside the wire
//! schema they are validated from; this re-export keeps the core's paths short.

pub use nova_proto::domain::{Header, Record, SequencedRecord};
