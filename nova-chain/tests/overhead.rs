//! Measures what an admitted batch really costs in memory beyond its content bytes, with a
//! counting allocator, and checks the admission buffer charges at least that much. The figures
//! it prints are the ones docs/budgets.md quotes.
//!
//! The measured window covers a batch's whole retained life on the star: the transport's
//! receive buffer, the request read out of it (`WireAppend`), the encoded fragment (both alive
//! at once while encoding), the reply channel and the admission ticket. Each step's charge must
//! cover what is held at that step: the charge on the length prefix covers the peak whatever the
//! message holds, the exact charge once the request is read covers the peak too, and the encoded
//! charge covers what stays.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use prost::Message;

use nova_chain::admission::{AdmissionBuffer, held_charge, received_charge, receiving_charge};
use nova_chain::metrics::Metrics;
use nova_core::flight::section::{encode_received, wire_encoded_bytes};
use nova_core::limits::MAX_SECTION_BYTES;
use nova_proto::v1;
use nova_proto::validate::{AppendCaps, validate_wire};
use nova_proto::wire::WireAppend;

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let now = CURRENT.fetch_add(layout.size(), Ordering::SeqCst) + layout.size();
        PEAK.fetch_max(now, Ordering::SeqCst);
        // SAFETY: forwarding to the system allocator with the caller's layout.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        CURRENT.fetch_sub(layout.size(), Ordering::SeqCst);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const CAPS: AppendCaps = AppendCaps {
    max_batch_bytes: 100 << 20,
    max_batch_records: 65536,
    max_record_bytes: 1 << 20,
};

fn request(records: usize, body: usize, headers: usize) -> Bytes {
    let request = v1::AppendRequest {
        stream: "overhead".into(),
        records: (0..records)
            .map(|i| v1::Record {
                body: Bytes::from(vec![i as u8; body]),
                headers: (0..headers)
                    .map(|_| v1::Header {
                        name: Bytes::from_static(b"key"),
                        value: Bytes::from_static(b"value"),
                    })
                    .collect(),
                timestamp: None,
            })
            .collect(),
        match_seq_num: None,
    };
    Bytes::from(request.encode_to_vec())
}

struct Measured {
    content: u64,
    /// Most bytes held at once, from the receive buffer to the encoded fragment.
    peak: u64,
    /// Bytes held once the received bytes are gone.
    retained: u64,
    received_charge: u64,
    receiving_charge: u64,
    held_charge: u64,
    /// Whether the fragment references the message's bodies rather than copying them.
    referenced: bool,
}

/// One batch from its wire bytes to a charged, encoded fragment with its reply channel.
fn measure(buffer: &AdmissionBuffer, records: usize, body: usize, headers: usize) -> Measured {
    let wire = request(records, body, headers);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let base = CURRENT.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    let wire_len = wire.len() as u64;
    // Charged on the length prefix, before the body is buffered.
    let mut admitted = runtime.block_on(buffer.admit(received_charge(wire_len)));
    // The transport's receive buffer holds the message; reading it allocates nothing more.
    let received = Bytes::copy_from_slice(&wire);
    let request = WireAppend::parse(received);
    validate_wire(&request, &CAPS).unwrap();
    let content = request.content_bytes();
    let receiving = receiving_charge(wire_len, wire_encoded_bytes(&request));
    admitted.shrink_to(receiving);
    let (reply, waiter) = tokio::sync::oneshot::channel::<Result<(u64, u64), String>>();
    // The received buffer is exactly the message's size, as the charging layer makes it.
    let fragments = encode_received(&request, 1, MAX_SECTION_BYTES as usize, true);
    drop(request);
    let held = held_charge(&fragments);
    let referenced = fragments.iter().any(|f| f.parts().len() > 1);
    admitted.shrink_to(held);
    let peak = (PEAK.load(Ordering::SeqCst) - base) as u64;
    let retained = (CURRENT.load(Ordering::SeqCst) - base) as u64;
    drop((fragments, admitted, reply, waiter));
    Measured {
        content,
        peak,
        retained,
        received_charge: received_charge(wire_len),
        receiving_charge: receiving,
        held_charge: held,
        referenced,
    }
}

#[test]
fn the_admission_charge_covers_what_a_batch_holds() {
    let buffer = AdmissionBuffer::new(
        1 << 30,
        Metrics::new().admission,
        nova_core::clock::Clock::system(),
    );
    // Warm up lazily allocated state (the tracker map, the runtime's internals).
    let _ = measure(&buffer, 1, 1, 0);
    let shapes = [
        (1, 1024, 0),
        (1, 0, 0),
        (1000, 10, 0),
        (1000, 0, 0),
        (100, 100, 2),
        (10_000, 1, 1),
        (3, 300_000, 0),
        (20_000, 0, 0),
        (200, 0, 30),
        (64, 8192, 0),
        (100, 5000, 1),
        (10, 4095, 0),
    ];
    let mut referenced = 0;
    for (records, body, headers) in shapes {
        let m = measure(&buffer, records, body, headers);
        println!(
            "{records:>6} records × {body:>6} B, {headers} headers: content {:>8} B | peak {:>8} B, \
             charged {:>8} B on the prefix, {:>8} B once read | retained {:>8} B, charged {:>8} B{}",
            m.content,
            m.peak,
            m.received_charge,
            m.receiving_charge,
            m.retained,
            m.held_charge,
            if m.referenced {
                " (bodies referenced)"
            } else {
                ""
            },
        );
        referenced += usize::from(m.referenced);
        assert!(
            m.peak <= m.receiving_charge && m.receiving_charge <= m.received_charge,
            "{records} records: held {} B at the peak, charged {} B once read and {} B on the prefix",
            m.peak,
            m.receiving_charge,
            m.received_charge
        );
        assert!(
            m.retained <= m.held_charge,
            "{records} records: hold {} B once encoded but are charged {} B",
            m.retained,
            m.held_charge
        );
    }
    // Both ways of encoding were measured.
    assert!(referenced > 0 && referenced < shapes.len());
}
