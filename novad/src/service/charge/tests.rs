use super::*;
use futures::StreamExt;
use http_body_util::BodyExt;
use nova_chain::admission::received_charge;
use nova_chain::metrics::Metrics;

const LIMITS: TransportLimits = TransportLimits {
    max_message: 1 << 20,
    largest_fragment: u64::MAX,
};

fn session(admission: AdmissionBuffer, charges: Arc<Charges>) -> Session {
    let metrics = nova_server::net::SecurityMetrics::register(&prometheus::Registry::new(), "t");
    Session {
        receiving: Shares::of(admission.budget().capacity(), 25),
        admission,
        charges,
        limits: LIMITS,
        holder: Some("test".into()),
        principal: None,
        access: Access::new(&metrics),
        recycler: Recycler::new(
            4 << 20,
            nova_server::net::recycle::RecycleMetrics::register(&prometheus::Registry::new()),
        ),
    }
}

fn messages(charges: &Charges) -> Vec<Bytes> {
    charges
        .0
        .lock()
        .iter()
        .map(|charged| match charged {
            Charged::Message(_, message) => message.clone(),
            Charged::Refused { error, .. } => panic!("refused: {error}"),
        })
        .collect()
}

fn framed(messages: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for m in messages {
        out.push(0);
        out.extend_from_slice(&(m.len() as u32).to_be_bytes());
        out.extend_from_slice(m);
    }
    out
}

fn body(wire: &[u8], chunk: usize) -> tonic::body::Body {
    let chunks: Vec<Result<Frame<Bytes>, tonic::Status>> = wire
        .chunks(chunk)
        .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
        .collect();
    tonic::body::Body::new(http_body_util::StreamBody::new(futures::stream::iter(
        chunks,
    )))
}

/// Feeds `wire` in chunks of `chunk` bytes through a charged body; returns what tonic saw
/// and the messages queued for the handler.
async fn pass(wire: &[u8], chunk: usize, admission: AdmissionBuffer) -> (Vec<u8>, Vec<Bytes>) {
    let charges = Arc::new(Charges::default());
    let mode = session(admission.clone(), charges.clone());
    let mut body = ChargedBody::new(body(wire, chunk), mode);
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        out.extend_from_slice(&frame.unwrap().into_data().unwrap());
    }
    let charged: u64 = charges
        .0
        .lock()
        .iter()
        .map(|c| match c {
            Charged::Message(admitted, _) => admitted.charged(),
            Charged::Refused { .. } => 0,
        })
        .sum();
    assert_eq!(
        charged,
        admission.budget().in_use(),
        "the queue holds every charge taken"
    );
    (out, messages(&charges))
}

#[tokio::test]
async fn every_message_is_charged_and_assembled_in_order() {
    let messages: [&[u8]; 4] = [b"hello", b"", &[7u8; 100], b"x"];
    let wire = framed(&messages);
    for chunk in [1, 2, 3, 5, 7, 64, 1000] {
        let admission = AdmissionBuffer::new(
            1 << 20,
            Metrics::new().admission,
            nova_core::clock::Clock::system(),
        );
        let (out, queued) = pass(&wire, chunk, admission.clone()).await;
        assert_eq!(
            out,
            framed(&[b"", b"", b"", b""]),
            "tonic sees placeholders"
        );
        assert_eq!(queued, messages, "chunks of {chunk}");
        assert_eq!(admission.budget().in_use(), 0, "released with the session");
    }
}

/// A message is not taken in until its charge is granted.
#[tokio::test]
async fn a_message_waits_for_its_charge() {
    let admission = AdmissionBuffer::new(
        received_charge(10),
        Metrics::new().admission,
        nova_core::clock::Clock::system(),
    );
    let hold = admission.admit(received_charge(10)).await;
    let wire = framed(&[&[1u8; 10]]);
    let passing = {
        let wire = wire.clone();
        let admission = admission.clone();
        tokio::spawn(async move { pass(&wire, 64, admission).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(!passing.is_finished(), "the message waits for its charge");
    drop(hold);
    let (_, queued) = passing.await.unwrap();
    assert_eq!(queued, [Bytes::from_static(&[1u8; 10])]);
}

/// A prefix over the transport's limit is not charged (tonic refuses the message), nor is
/// a compressed one accepted.
#[tokio::test]
async fn oversized_and_compressed_messages_are_not_charged() {
    let admission = AdmissionBuffer::new(
        1 << 30,
        Metrics::new().admission,
        nova_core::clock::Clock::system(),
    );
    let mut oversized = vec![0u8];
    oversized.extend_from_slice(&((2u32 << 20).to_be_bytes()));
    let charges = Arc::new(Charges::default());
    let mode = session(admission.clone(), charges.clone());
    let mut passing = ChargedBody::new(body(&oversized, 64), mode);
    let first = passing.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(
        first, oversized,
        "passed to tonic, which refuses it at its prefix"
    );
    assert!(charges.take().is_none(), "not charged");
    assert_eq!(admission.budget().in_use(), 0);

    let mut compressed = framed(&[b"abc"]);
    compressed[0] = 1;
    let mode = session(admission, Arc::default());
    let mut body = ChargedBody::new(body(&compressed, 64), mode);
    let error = body.frame().await.unwrap().unwrap_err();
    assert_eq!(error.code(), tonic::Code::InvalidArgument);
}

/// A producer that stops in the middle of a message whose charge it holds loses its
/// session at the message's deadline, and the charge with it.
#[tokio::test(start_paused = true)]
async fn a_stalled_message_times_out() {
    let admission = AdmissionBuffer::new(
        1 << 20,
        Metrics::new().admission,
        nova_core::clock::Clock::system(),
    );
    let mut wire = vec![0u8];
    wire.extend_from_slice(&100u32.to_be_bytes());
    wire.extend_from_slice(&[1u8; 10]);
    // The body yields the first 15 bytes, then never ends.
    let stalled =
        futures::stream::iter(vec![Ok::<_, tonic::Status>(Frame::data(Bytes::from(wire)))])
            .chain(futures::stream::pending());
    let inner = tonic::body::Body::new(http_body_util::StreamBody::new(stalled));
    let charges = Arc::new(Charges::default());
    let mode = session(admission.clone(), charges.clone());
    let mut body = ChargedBody::new(inner, mode);
    let mut passed = 0;
    let error = loop {
        match body.frame().await.unwrap() {
            Ok(frame) => passed += frame.into_data().unwrap().len(),
            Err(error) => break error,
        }
    };
    assert_eq!(
        passed, 0,
        "nothing of a message reaches tonic before it is whole"
    );
    assert_eq!(error.code(), tonic::Code::Unavailable);
    assert!(
        error.message().contains("did not arrive"),
        "{}",
        error.message()
    );
}

/// A stream that ends inside a message is an error, not a clean close: the message is not
/// applied, and the producer is told.
#[tokio::test]
async fn a_stream_ending_inside_a_message_is_an_error() {
    let admission = AdmissionBuffer::new(
        1 << 20,
        Metrics::new().admission,
        nova_core::clock::Clock::system(),
    );
    let whole = framed(&[b"whole"]);
    let mut wire = whole.clone();
    wire.extend_from_slice(&[0, 0, 0, 0, 50, 1, 2, 3]);
    let charges = Arc::new(Charges::default());
    let mode = session(admission, charges.clone());
    let mut body = ChargedBody::new(body(&wire, 4), mode);
    let mut passed = Vec::new();
    let error = loop {
        match body.frame().await {
            Some(Ok(frame)) => passed.extend_from_slice(&frame.into_data().unwrap()),
            Some(Err(error)) => break error,
            None => panic!("a clean end"),
        }
    };
    assert_eq!(passed, PLACEHOLDER, "the whole message was handed on first");
    assert_eq!(error.code(), tonic::Code::InvalidArgument);
    assert!(body.frame().await.is_none(), "nothing after the error");
}

/// The start of an append message for `stream`, padded to `len` bytes.
fn append_to(stream: &str, len: usize) -> Vec<u8> {
    let mut message = vec![0x0a, stream.len() as u8];
    message.extend_from_slice(stream.as_bytes());
    message.resize(len, 0x42);
    message
}

#[test]
fn the_stream_name_is_read_from_the_start_of_a_message() {
    let message = append_to("logs/a", 100);
    assert!(matches!(naming(&message[..3], 100), Naming::More));
    assert!(matches!(naming(&message, 100), Naming::Name(n) if n == "logs/a"));
    // Another field first, or a name longer than a stream's may be: not told early.
    assert!(matches!(naming(&[0x12, 1, 0], 100), Naming::Unknown));
    assert!(matches!(naming(&[0x0a, 0x80, 0x08], 2000), Naming::Unknown));
    // A name running past the message's end.
    assert!(matches!(naming(&message, 5), Naming::Unknown));
}

/// A message for a stream the session's token may not append to is refused before it is
/// charged, and skipped; the next message, for a stream it may, is charged as usual.
#[tokio::test]
async fn a_message_outside_the_tokens_grants_is_refused_before_it_is_charged() {
    use nova_server::net::auth::Grant;
    let admission = AdmissionBuffer::new(
        1 << 20,
        Metrics::new().admission,
        nova_core::clock::Clock::system(),
    );
    let charges = Arc::new(Charges::default());
    let mut mode = session(admission.clone(), charges.clone());
    mode.principal = Some(Arc::new(Principal {
        name: "ingest".into(),
        grants: vec![Grant {
            scope: Scope::Append,
            prefix: "ok/".into(),
        }],
    }));
    let denied = append_to("secret/x", 5000);
    let allowed = append_to("ok/x", 300);
    let wire = framed(&[&denied, &allowed]);
    let mut body = ChargedBody::new(body(&wire, 7), mode);
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        out.extend_from_slice(&frame.unwrap().into_data().unwrap());
    }
    assert_eq!(out, framed(&[b"", b""]), "a placeholder for each, in order");
    let mut queued = charges.0.lock();
    match queued.pop_front() {
        Some(Charged::Refused { error, stream }) => {
            assert!(
                matches!(error, RequestError::PermissionDenied(_)),
                "{error}"
            );
            assert_eq!(stream, "secret/x");
        }
        other => panic!("{other:?}"),
    }
    match queued.pop_front() {
        Some(Charged::Message(admitted, message)) => {
            assert_eq!(message, allowed);
            assert_eq!(admitted.charged(), admission.budget().in_use());
        }
        other => panic!("{other:?}"),
    }
}

/// A token's messages still arriving hold at most its share of the buffer: a session that
/// sends a prefix and stalls keeps that much, and the token's next message waits on the
/// token's own share (charging nothing of the buffer), while other tokens are charged as
/// usual.
#[tokio::test]
async fn messages_still_arriving_hold_at_most_their_tokens_share() {
    let admission = AdmissionBuffer::new(
        16 << 20,
        Metrics::new().admission,
        nova_core::clock::Clock::system(),
    );
    let receiving = Shares::of(admission.budget().capacity(), 25);
    let stalled = |holder: &str| {
        let mut mode = session(admission.clone(), Arc::default());
        mode.receiving = receiving.clone();
        mode.holder = Some(holder.into());
        let mut wire = vec![0u8];
        wire.extend_from_slice(&(900_000u32).to_be_bytes());
        wire.extend_from_slice(&append_to("s", 600));
        let stream =
            futures::stream::iter(vec![Ok::<_, tonic::Status>(Frame::data(Bytes::from(wire)))])
                .chain(futures::stream::pending());
        ChargedBody::new(
            tonic::body::Body::new(http_body_util::StreamBody::new(stream)),
            mode,
        )
    };
    let poll_once = |body: &mut ChargedBody| {
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        Pin::new(body).poll_frame(&mut cx)
    };
    let mut first = stalled("a");
    assert!(
        poll_once(&mut first).is_pending(),
        "charged, waiting for the rest"
    );
    let held = admission.budget().in_use();
    assert!(held > 900_000, "{held}");
    let mut second = stalled("a");
    assert!(
        poll_once(&mut second).is_pending(),
        "waiting on its token's share"
    );
    assert_eq!(admission.budget().in_use(), held, "nothing more charged");
    let mut other = stalled("b");
    assert!(poll_once(&mut other).is_pending());
    assert!(
        admission.budget().in_use() > held,
        "another token has its own share"
    );
    drop(first);
    assert!(poll_once(&mut second).is_pending());
    assert_eq!(
        receiving.held("a"),
        held,
        "the waiting message took the share the first let go of"
    );
}
