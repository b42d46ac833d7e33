//! Flight encode and decode: the per-byte work every append and every cold read pays.

use std::hint::black_box;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use prost::Message;

use nova_benches::{fragments, records};
use nova_core::flight::section::{
    RecordIter, encode_fragment, encode_wire_chunks, encode_wire_referenced,
};
use nova_core::flight::{
    FlightMeta, SectionInput, TailParse, assemble_flight, parse_tail, verify_section,
};
use nova_proto::{v1, wire::WireAppend};

/// An append request's wire bytes: `records` bodies of `body` bytes each, no headers.
fn append_message(records: usize, body: usize) -> Bytes {
    let request = v1::AppendRequest {
        stream: "bench".into(),
        records: (0..records)
            .map(|i| v1::Record {
                body: vec![i as u8; body].into(),
                headers: Vec::new(),
                timestamp: None,
            })
            .collect(),
        match_seq_num: None,
    };
    Bytes::from(request.encode_to_vec())
}

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
            RecordIter::new(black_box(fragment.to_bytes()))
                .map(|r| r.map(|r| r.body.len()).unwrap_or(0))
                .sum::<usize>()
        })
    });
    group.finish();

    // What the star does with each received append: copy it into a fragment, or reference its
    // bodies where the message holds them.
    let message = append_message(64, 8 * 1024);
    let wire = WireAppend::parse(message.clone());
    let mut group = c.benchmark_group("append");
    group.throughput(Throughput::Bytes(message.len() as u64));
    group.bench_function("copy 64 × 8 KiB", |b| {
        b.iter(|| encode_wire_chunks(black_box(&wire), 1, 1 << 20))
    });
    group.bench_function("reference 64 × 8 KiB", |b| {
        b.iter(|| encode_wire_referenced(black_box(&wire), 1, 1 << 20))
    });
    let copied = encode_wire_chunks(&wire, 1, 1 << 20).remove(0);
    let referenced =
        encode_wire_referenced(&wire, 1, 1 << 20).expect("8 KiB bodies are referenced");
    group.bench_function("decode copied 64 × 8 KiB", |b| {
        b.iter(|| black_box(&copied).iter().count())
    });
    group.bench_function("decode referenced 64 × 8 KiB", |b| {
        b.iter(|| black_box(&referenced).iter().count())
    });
    group.finish();

    // An 8 MiB flight from 64 streams.
    let parts = fragments(64, 128, 1024);
    let flight_bytes: u64 = parts.iter().map(|f| f.len()).sum();
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
