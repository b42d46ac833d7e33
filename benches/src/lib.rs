//! Inputs shared by the benchmarks in `benches/`.

use bytes::Bytes;
use nova_core::flight::section::{Fragment, encode_fragment};
use nova_core::record::Record;

/// `count` records of `body` bytes each, with one small header.
pub fn records(count: usize, body: usize) -> Vec<Record> {
    (0..count)
        .map(|i| Record {
            timestamp: 1_700_000_000_000 + i as u64,
            headers: vec![nova_core::record::Header {
                name: Bytes::from_static(b"trace"),
                value: Bytes::from(format!("{i:08}")),
            }],
            body: Bytes::from(vec![(i % 251) as u8; body]),
        })
        .collect()
}

/// One fragment per stream, `streams` streams of `per_stream` records of `body` bytes.
pub fn fragments(streams: usize, per_stream: usize, body: usize) -> Vec<Fragment> {
    (0..streams)
        .map(|_| encode_fragment(records(per_stream, body).iter()))
        .collect()
}

/// The number after `name` on the command line (`--cycles 1000`), or `default`.
pub fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
