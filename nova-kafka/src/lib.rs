//! Kafka's wire format for Nova's Kafka listener, with no I/O: record batches parsed from a
//! produce request (`batch`) within a decompression limit (`decompress`), written for a fetch
//! (`encode`), and the mapping of topics, records (`mapping`) and refusals (`errors`) between
//! Kafka and Nova. The listener itself is novad's (`novad/src/kafka`); request and response
//! messages are kafka-protocol's.

pub mod batch;
#[cfg(feature = "codecs")]
pub mod decompress;
pub mod encode;
pub mod errors;
pub mod fetch_frame;
pub mod mapping;

pub use kafka_protocol;

#[cfg(test)]
mod tests;
