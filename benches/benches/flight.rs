//! Flight encode and decode: the per-byte work every append and every cold read pays.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};

use nova_benches::{fragments, records};
use nova_core::flight::section::{RecordIter, encode_fragment};
use nova_core::flight::{
    FlightMeta, SectionInput, TailParse, assemble_flight, parse_tail, verify_section,
};

fn meta() -> FlightMeta {
    FlightMeta {
        star: "bench".into(),
        epoch: 1,
        slot: 1,
        created_at_ms: 0,
    }
}

fn bench(c: &mut Criterion) {
    let batch = records(1000, 1024);
    let content: u64 = batch.iter().map(|r| r.content_bytes()).sum();
    let mut group = c.benchmark_group("fragment");
    group.throughput(Throughput::Bytes(content));
    group.bench_function("encode 1000 × 1 KiB", |b| {
        b.iter(|| encode_fragment(black_box(&batch).iter()))
    });
    let fragment = encode_fragment(batch.iter());
    group.bench_function("decode 1000 × 1 KiB", |b| {
        b.iter(|| {
            RecordIter::new(black_box(fragment.bytes.clone()))
                .map(|r| r.map(|r| r.body.len()).unwrap_or(0))
                .sum::<usize>()
        })
    });
    group.finish();

    // An 8 MiB flight from 64 streams.
    let parts = fragments(64, 128, 1024);
    let flight_bytes: u64 = parts.iter().map(|f| f.bytes.len() as u64).sum();
    let inputs = |parts: &[nova_core::flight::section::Fragment]| -> Vec<SectionInput> {
        parts
            .iter()
            .enumerate()
            .map(|(i, f)| SectionInput {
                stream_id: i as u64,
                stream: format!("stream-{i}"),
                start_seq: 0,
                fragments: vec![f.clone()],
            })
            .collect()
    };
    let mut group = c.benchmark_group("flight");
    group.throughput(Throughput::Bytes(flight_bytes));
    group.bench_function("assemble 64 streams, 8 MiB", |b| {
        b.iter(|| assemble_flight(meta(), inputs(black_box(&parts))))
    });
    let (payload, footer) = assemble_flight(meta(), inputs(&parts));
    let object = payload.to_bytes();
    group.bench_function("verify every section, 8 MiB", |b| {
        b.iter(|| {
            for entry in &footer.sections {
                let start = entry.offset as usize;
                verify_section(&object[start..start + entry.len as usize], entry).unwrap();
            }
        })
    });
    group.finish();

    let tail = object.slice(object.len() - 64 * 1024..);
    c.bench_function("footer decode, 64 sections", |b| {
        b.iter(
            || match parse_tail(black_box(&tail), object.len() as u64).unwrap() {
                TailParse::Footer(footer) => footer,
                TailParse::NeedFrom(_) => unreachable!("64 KiB holds the footer"),
            },
        )
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
