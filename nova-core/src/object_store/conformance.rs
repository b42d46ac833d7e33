//! The behaviour every `ObjectStore` backend must show, as one suite each backend's tests run.
//! The checks panic with a message naming what the backend got wrong.

use std::collections::BTreeSet;
use std::sync::Arc;

use bytes::Bytes;

use super::{
    ComposePart, CreateOutcome, GetRange, MIN_COMPOSE_PART, ObjectStore, PutPayload, StoreError,
};

/// Runs every check under `prefix`, which must be empty in the store.
pub async fn run_all(store: Arc<dyn ObjectStore>, prefix: &str) {
    round_trip(store.as_ref(), &format!("{prefix}rt/")).await;
    missing_objects(store.as_ref(), &format!("{prefix}missing/")).await;
    ranged_gets(store.as_ref(), &format!("{prefix}range/")).await;
    conditional_create(store.as_ref(), &format!("{prefix}cond/")).await;
    concurrent_conditional_creates(store.clone(), &format!("{prefix}race/")).await;
    listing_with_pagination(store.as_ref(), &format!("{prefix}list/")).await;
    deletes(store.as_ref(), &format!("{prefix}del/")).await;
    compose(store.as_ref(), &format!("{prefix}compose/")).await;
}

/// A composed object is its parts end to end, copied ranges included; parts that break the
/// multipart rules, or a copy from a missing object, are refused and write nothing.
pub async fn compose(store: &dyn ObjectStore, prefix: &str) {
    let min = MIN_COMPOSE_PART as usize;
    let (a, a_bytes) = multi_part(3, 2, min / 2 + 1000);
    let (b, b_bytes) = multi_part(4, 1, 4000);
    let (source_a, source_b) = (format!("{prefix}a"), format!("{prefix}b"));
    store.put(&source_a, a).await.expect("put a");
    store.put(&source_b, b).await.expect("put b");
    let (middle, middle_bytes) = multi_part(5, 3, min / 3 + 10);
    let key = format!("{prefix}composed");
    let parts = vec![
        ComposePart::Copy {
            source: source_a.clone(),
            range: 500..a_bytes.len() as u64,
        },
        ComposePart::Data(middle),
        ComposePart::Copy {
            source: source_b.clone(),
            range: 100..2100,
        },
    ];
    store.compose(&key, parts).await.expect("compose");
    let mut want = a_bytes.slice(500..).to_vec();
    want.extend_from_slice(&middle_bytes);
    want.extend_from_slice(&b_bytes[100..2100]);
    let got = store.get(&key, GetRange::All).await.expect("get composed");
    assert_eq!(got.object_size, want.len() as u64);
    assert!(
        got.bytes == want,
        "the composed object is its parts in order"
    );

    let small_first = vec![
        ComposePart::Data(Bytes::from_static(b"too small").into()),
        ComposePart::Copy {
            source: source_a.clone(),
            range: 0..10,
        },
    ];
    let refused = format!("{prefix}refused");
    let err = store.compose(&refused, small_first).await.unwrap_err();
    assert!(
        matches!(err, StoreError::Permanent { .. }),
        "a small part before the last is refused: {err}"
    );
    let missing = vec![ComposePart::Copy {
        source: format!("{prefix}missing"),
        range: 0..10,
    }];
    let err = store.compose(&refused, missing).await.unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::NotFound { .. } | StoreError::Permanent { .. }
        ),
        "a copy from a missing object fails: {err}"
    );
    assert!(
        matches!(store.head(&refused).await, Err(StoreError::NotFound { .. })),
        "a refused compose writes nothing"
    );
}

fn multi_part(seed: u8, parts: usize, part_len: usize) -> (PutPayload, Bytes) {
    let parts: Vec<Bytes> = (0..parts)
        .map(|p| {
            (0..part_len)
                .map(|i| seed.wrapping_add((p * 31 + i) as u8))
                .collect::<Vec<u8>>()
                .into()
        })
        .collect();
    let payload = PutPayload::from_parts(parts);
    let whole = payload.to_bytes();
    (payload, whole)
}

pub async fn round_trip(store: &dyn ObjectStore, prefix: &str) {
    let key = format!("{prefix}object");
    let (payload, whole) = multi_part(1, 5, 3000);
    store.put(&key, payload).await.expect("put");
    let got = store.get(&key, GetRange::All).await.expect("get");
    assert_eq!(got.bytes, whole, "get returns what put wrote");
    assert_eq!(got.object_size, whole.len() as u64);
    let meta = store.head(&key).await.expect("head");
    assert_eq!(meta.size, whole.len() as u64, "head reports the size");

    // A plain put replaces the object.
    store
        .put(&key, PutPayload::from("short"))
        .await
        .expect("overwrite");
    let got = store
        .get(&key, GetRange::All)
        .await
        .expect("get after overwrite");
    assert_eq!(&got.bytes[..], b"short");

    let empty = format!("{prefix}empty");
    store
        .put(&empty, PutPayload::default())
        .await
        .expect("put empty");
    let got = store.get(&empty, GetRange::All).await.expect("get empty");
    assert!(got.bytes.is_empty());
    assert_eq!(got.object_size, 0);
}

pub async fn missing_objects(store: &dyn ObjectStore, prefix: &str) {
    let key = format!("{prefix}nothing-here");
    assert!(
        matches!(
            store.get(&key, GetRange::All).await,
            Err(StoreError::NotFound { .. })
        ),
        "get of a missing key is NotFound"
    );
    assert!(
        matches!(store.head(&key).await, Err(StoreError::NotFound { .. })),
        "head of a missing key is NotFound"
    );
    assert!(
        matches!(
            store.get(&key, GetRange::Bounded(0..10)).await,
            Err(StoreError::NotFound { .. })
        ),
        "ranged get of a missing key is NotFound"
    );
}

pub async fn ranged_gets(store: &dyn ObjectStore, prefix: &str) {
    let key = format!("{prefix}object");
    let (payload, whole) = multi_part(7, 4, 1000);
    store.put(&key, payload).await.expect("put");
    let size = whole.len() as u64;

    let got = store
        .get(&key, GetRange::Bounded(100..1900))
        .await
        .expect("bounded");
    assert_eq!(
        got.bytes,
        whole.slice(100..1900),
        "bounded range across parts"
    );
    assert_eq!(
        got.object_size, size,
        "a ranged get still reports the object size"
    );

    let got = store
        .get(&key, GetRange::Bounded(3990..5000))
        .await
        .expect("clamped");
    assert_eq!(
        got.bytes,
        whole.slice(3990..),
        "an end past the object is clamped"
    );

    let got = store.get(&key, GetRange::Suffix(24)).await.expect("suffix");
    assert_eq!(got.bytes, whole.slice(whole.len() - 24..), "suffix");
    assert_eq!(got.object_size, size);

    let got = store
        .get(&key, GetRange::Suffix(10 * size))
        .await
        .expect("long suffix");
    assert_eq!(
        got.bytes, whole,
        "a suffix longer than the object returns all of it"
    );

    assert!(
        matches!(
            store.get(&key, GetRange::Bounded(size..size + 10)).await,
            Err(StoreError::InvalidRange { .. })
        ),
        "a range starting at the end is InvalidRange"
    );
}

pub async fn conditional_create(store: &dyn ObjectStore, prefix: &str) {
    let key = format!("{prefix}slot");
    let first = store
        .put_if_absent(&key, PutPayload::from("first"))
        .await
        .expect("first create");
    assert_eq!(first, CreateOutcome::Created);
    let second = store
        .put_if_absent(&key, PutPayload::from("second"))
        .await
        .expect("second create");
    assert_eq!(
        second,
        CreateOutcome::AlreadyExists,
        "a taken key is not overwritten"
    );
    let got = store.get(&key, GetRange::All).await.expect("get");
    assert_eq!(&got.bytes[..], b"first", "the first writer's bytes stay");

    let (payload, whole) = multi_part(3, 6, 777);
    let key = format!("{prefix}multi");
    assert_eq!(
        store
            .put_if_absent(&key, payload)
            .await
            .expect("multi-part create"),
        CreateOutcome::Created
    );
    assert_eq!(
        store.get(&key, GetRange::All).await.expect("get").bytes,
        whole
    );
}

/// Sixteen writers race for each of several keys; exactly one wins each, and the object holds
/// the winner's bytes.
pub async fn concurrent_conditional_creates(store: Arc<dyn ObjectStore>, prefix: &str) {
    const WRITERS: usize = 16;
    for round in 0..4 {
        let key = format!("{prefix}slot-{round}");
        let tasks: Vec<_> = (0..WRITERS)
            .map(|writer| {
                let store = store.clone();
                let key = key.clone();
                tokio::spawn(async move {
                    let body = format!("writer-{writer}-{}", "x".repeat(writer * 100));
                    let outcome = store
                        .put_if_absent(&key, PutPayload::from(body.into_bytes()))
                        .await;
                    (writer, outcome)
                })
            })
            .collect();
        let mut winners = Vec::new();
        for task in tasks {
            let (writer, outcome) = task.await.expect("task");
            match outcome {
                Ok(CreateOutcome::Created) => winners.push(writer),
                Ok(CreateOutcome::AlreadyExists) => {}
                // A server may answer a racing conditional write with a retryable conflict;
                // that writer did not win.
                Err(e) if e.is_retryable() => {}
                Err(e) => panic!("conditional create failed: {e}"),
            }
        }
        assert_eq!(
            winners.len(),
            1,
            "exactly one winner among {WRITERS}, got {winners:?}"
        );
        let got = store.get(&key, GetRange::All).await.expect("get");
        let want = format!("writer-{}-{}", winners[0], "x".repeat(winners[0] * 100));
        assert_eq!(
            got.bytes,
            Bytes::from(want),
            "the winner's bytes are stored"
        );
    }
}

pub async fn listing_with_pagination(store: &dyn ObjectStore, prefix: &str) {
    // Names chosen so that byte order differs from a naive directory walk: '-' sorts before '/'.
    let mut keys = BTreeSet::new();
    for i in 0..12 {
        keys.insert(format!("{prefix}a/{i:03}"));
    }
    keys.insert(format!("{prefix}a-b"));
    keys.insert(format!("{prefix}a0"));
    keys.insert(format!("{prefix}a/sub/deep"));
    keys.insert(format!("{prefix}b"));
    for key in &keys {
        store
            .put(key, PutPayload::from(key.clone().into_bytes()))
            .await
            .expect("put");
    }

    let all = list_all(store, prefix, None, 4).await;
    assert_eq!(
        all,
        keys.iter().cloned().collect::<Vec<_>>(),
        "paged listing in byte order"
    );

    let under_a = list_all(store, &format!("{prefix}a/"), None, 5).await;
    let want: Vec<_> = keys
        .iter()
        .filter(|k| k.starts_with(&format!("{prefix}a/")))
        .cloned()
        .collect();
    assert_eq!(under_a, want, "a directory-like prefix");

    let partial = list_all(store, &format!("{prefix}a"), None, 3).await;
    let want: Vec<_> = keys
        .iter()
        .filter(|k| k.starts_with(&format!("{prefix}a")))
        .cloned()
        .collect();
    assert_eq!(partial, want, "a prefix that ends mid-name");

    let after = format!("{prefix}a/005");
    let tail = list_all(store, prefix, Some(&after), 100).await;
    let want: Vec<_> = keys.iter().filter(|k| **k > after).cloned().collect();
    assert_eq!(
        tail, want,
        "start_after skips everything up to and including it"
    );

    let page = store.list(prefix, None, 1).await.expect("one-key page");
    assert_eq!(page.objects.len(), 1);
    assert_eq!(
        page.objects[0].size,
        page.objects[0].key.len() as u64,
        "listed sizes"
    );
    assert!(
        page.next_start_after.is_some(),
        "a full page says where to go on"
    );

    let nothing = store
        .list(&format!("{prefix}zzz"), None, 10)
        .await
        .expect("empty");
    assert!(nothing.objects.is_empty() && nothing.next_start_after.is_none());
}

async fn list_all(
    store: &dyn ObjectStore,
    prefix: &str,
    start_after: Option<&str>,
    page_size: usize,
) -> Vec<String> {
    let mut out = Vec::new();
    let mut cursor = start_after.map(str::to_owned);
    loop {
        let page = store
            .list(prefix, cursor.as_deref(), page_size)
            .await
            .expect("list");
        assert!(
            page.objects.len() <= page_size,
            "a page never exceeds max_keys"
        );
        out.extend(page.objects.into_iter().map(|o| o.key));
        match page.next_start_after {
            Some(next) => cursor = Some(next),
            None => return out,
        }
    }
}

pub async fn deletes(store: &dyn ObjectStore, prefix: &str) {
    let key = format!("{prefix}gone");
    store.put(&key, PutPayload::from("x")).await.expect("put");
    store.delete(&key).await.expect("delete");
    assert!(matches!(
        store.head(&key).await,
        Err(StoreError::NotFound { .. })
    ));
    store
        .delete(&key)
        .await
        .expect("deleting a missing key succeeds");
    // A deleted key can be conditionally created again.
    assert_eq!(
        store
            .put_if_absent(&key, PutPayload::from("y"))
            .await
            .expect("recreate"),
        CreateOutcome::Created
    );
}
