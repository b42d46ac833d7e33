//! The Nova SDK: a client for a star's `nova.v1` API.
//!
//! ```no_run
//! # async fn demo() -> Result<(), nova_client::Error> {
//! use nova_client::{Client, Record};
//!
//! let client = Client::connect("http://127.0.0.1:7400").await?;
//! client.create_stream("orders").await?;
//! let mut session = client.append_session().await?;
//! let ack = session.append("orders", vec![Record::new("hello")], None).await?;
//! println!("stored at {}..{}", ack.start_seq, ack.end_seq);
//! let page = client.read("orders", 0, 100).await?;
//! # Ok(()) }
//! ```

mod client;
mod consumer;
mod error;
mod producer;
mod session;

pub use client::{Client, Page, ReadOptions, StreamInfo};
pub use consumer::Consumer;
pub use error::Error;
pub use nova_proto::domain::{Header, Record, SequencedRecord};
pub use producer::{AppendTicket, Producer, ProducerConfig};
pub use session::{Ack, AckReceiver, AppendSender, AppendSession};
