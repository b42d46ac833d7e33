//! The Nova SDK: a client for a star's `nova.v1` API.
//!
//! - [`Producer`] appends to one stream exactly once: batching by size and linger, a bound on
//!   unacknowledged bytes (`append` waits past it), and retries under a budget that honour the
//!   star's `retry-after-ms` hints and never write a record twice (see `producer`).
//! - [`Consumer`] reads pages from a sequence number, and in follow mode waits at the tail with
//!   a long-poll read instead of polling.
//! - [`Client`] holds the connection and the admin calls; [`AppendSession`] is the raw
//!   pipelined `Append` stream underneath the producer.
//! - [`Error`] says which failures are worth retrying ([`Error::is_retryable`]) and carries the
//!   server's retry hint and, for a `match_seq_num` mismatch, the stream's next sequence number.
//!
//! ```no_run
//! # async fn demo() -> Result<(), nova_client::Error> {
//! use nova_client::{Client, Consumer, Producer, ProducerConfig, Record};
//!
//! let client = Client::connect("http://127.0.0.1:7400").await?;
//! client.create_stream("orders").await?;
//! let producer = Producer::new(client.clone(), "orders", ProducerConfig::default()).await?;
//! let ticket = producer.append(Record::new("hello")).await?;
//! producer.flush().await?;
//! println!("stored at {}", ticket.wait().await?);
//! let page = Consumer::new(client, "orders", 0).next_page().await?;
//! # Ok(()) }
//! ```
//!
//! Runnable examples are in `examples/`: `produce`, `follow`, `errors`.

mod client;
mod config;
mod consumer;
mod error;
mod groups;
mod info;
mod jitter;
mod producer;
mod session;

pub use client::{
    Client, Page, ReadOptions, Retention, StorageClass, StreamConfig, StreamHandle, StreamInfo,
};
pub use config::{ClientConfig, RetryObserver, RetryPolicy, Retrying, TOKEN_ENV};
pub use consumer::Consumer;
pub use error::{Error, ErrorCode};
pub use groups::{GroupDescription, GroupMember, GroupOffset, GroupSummary};
pub use info::{FleetView, ServerInfo, ServerLimits, ServerRole};
pub use nova_proto::domain::{Header, Record, SequencedRecord};
pub use nova_proto::route::{ClientTls, InvalidToken};
pub use producer::{AppendTicket, DEFAULT_DELIVERY_TIMEOUT, Producer, ProducerConfig};
pub use session::{Ack, AckReceiver, AppendSender, AppendSession};
