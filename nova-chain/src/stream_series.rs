//! Per-stream metrics in bounded series. Stream names are label values a client chooses, and a
//! star may hold tens of thousands of streams: a series per stream would make every scrape as
//! large as the catalog. Each stream counts its own appends (two atomics in its state, which
//! the stream cap already bounds); at a scrape, the `--metrics-top-streams` streams with the
//! most appended bytes are exported with a `stream` label, and the totals over every stream are
//! exported without one.

use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntCounterVec, Opts};

use crate::streams::StreamRegistry;

pub struct StreamSeries {
    streams: Weak<StreamRegistry>,
    top: usize,
    records: IntCounterVec,
    bytes: IntCounterVec,
    /// Held while the series are reset and refilled, so two scrapes do not interleave.
    exporting: Mutex<()>,
}

impl StreamSeries {
    /// Exports the `top` busiest streams of `streams` (0: none) for as long as it lives.
    pub fn new(streams: &Arc<StreamRegistry>, top: usize) -> Self {
        let vec = |name: &str, help: &str| {
            IntCounterVec::new(Opts::new(name, help), &["stream"]).expect("valid metric")
        };
        Self {
            streams: Arc::downgrade(streams),
            top,
            records: vec(
                "nova_stream_appended_records_total",
                "Records acknowledged since this star began leading the stream, for the \
                 --metrics-top-streams streams with the most appended bytes.",
            ),
            bytes: vec(
                "nova_stream_appended_bytes_total",
                "Content bytes acknowledged since this star began leading the stream, for the \
                 --metrics-top-streams streams with the most appended bytes.",
            ),
            exporting: Mutex::new(()),
        }
    }
}

impl Collector for StreamSeries {
    fn desc(&self) -> Vec<&Desc> {
        let mut descs = self.records.desc();
        descs.extend(self.bytes.desc());
        descs
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let _exporting = self.exporting.lock();
        self.records.reset();
        self.bytes.reset();
        if let Some(streams) = self.streams.upgrade() {
            for (name, records, bytes) in streams.busiest(self.top) {
                self.records.with_label_values(&[&name]).inc_by(records);
                self.bytes.with_label_values(&[&name]).inc_by(bytes);
            }
        }
        let mut families = self.records.collect();
        families.extend(self.bytes.collect());
        families
    }
}
