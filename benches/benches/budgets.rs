//! The per-batch bookkeeping on the write path: charging and releasing the admission buffer,
//! and the tail window cache taking acknowledged flights and evicting old ones.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};

use nova_benches::fragments;
use nova_chain::admission::{AdmissionBuffer, encoded_charge};
use nova_chain::metrics::Metrics;
use nova_chain::tail_cache::{CachedRun, TailCache};
use nova_core::clock::Clock;

fn admission(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let buffer = AdmissionBuffer::new(256 << 20, Metrics::new().admission, Clock::system());
    let charge = encoded_charge(64, 0, 64 * 1024);
    c.bench_function("admission charge and release (uncontended)", |b| {
        b.iter(|| {
            let admitted = runtime.block_on(buffer.admit(black_box(charge)));
            drop(admitted);
        })
    });
    c.bench_function("admission try_admit and release", |b| {
        b.iter(|| drop(buffer.try_admit(black_box(charge))))
    });
}

fn tail_cache(c: &mut Criterion) {
    // A 16 MiB cache fed 1 MiB flights of 16 streams: every insert past the first 16 evicts.
    let cache = TailCache::new(16 << 20, Metrics::new().tail_cache);
    let parts = fragments(16, 64, 1024);
    let mut slot = 0u64;
    c.bench_function(
        "tail cache insert with eviction, 16 streams per flight",
        |b| {
            b.iter(|| {
                let runs = parts
                    .iter()
                    .enumerate()
                    .map(|(stream, fragment)| CachedRun {
                        stream_id: stream as u64,
                        start_seq: slot * 64,
                        end_seq: slot * 64 + 64,
                        fragments: vec![(slot * 64, fragment.clone())],
                    })
                    .collect();
                cache.insert(slot, runs);
                slot += 1;
            })
        },
    );
    c.bench_function("tail cache lookup", |b| {
        let at = slot.saturating_sub(4) * 64 + 10;
        b.iter(|| cache.lookup(black_box(3), black_box(at)))
    });
}

criterion_group!(benches, admission, tail_cache);
criterion_main!(benches);
