//! The star's chain: how an append becomes durable and readable.
//!
//! ```text
//! session ─charge─▶ admission buffer ─▶ packer ─flight─▶ writers ─▶ resolver ─ack─▶ session
//!                                        (seq, slot)    (put if absent)  │ (slot order)
//!                                                                        ├─▶ tail cache
//!                                                                        └─▶ absorber ─▶ metastore
//! ```
//!
//! Every arrow is a bounded queue or a budget: the admission buffer bounds bytes from decode to
//! ack, `--flight-max-inflight` bounds flights being written, the backlog budget bounds flights
//! acknowledged but not absorbed, and the tail cache bounds what stays in memory after the ack.

pub mod admission;
pub mod config;
pub mod express;
pub mod metrics;
pub mod pending;
pub mod rebuild;
pub mod recovery;
pub mod stall;
pub mod streams;
pub mod tail_cache;
pub mod takeover;

mod absorber;
mod flight_build;
mod monitor;
mod packer;
mod reader;
mod resolver;
mod shared;
mod star;
mod stream_series;
mod stream_state;
mod writer;

pub use config::{Backoff, ChainConfig, Leaders, RetryPolicy};
pub use flight_build::{AckRange, AppendReply};
pub use reader::{Page, READ_PER_RECORD, ReadCharge};
pub use star::{ShutdownError, Star, StartError};
