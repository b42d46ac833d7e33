//! The behaviour every `Metastore` backend must show, as one suite each backend's tests run (the
//! embedded store, etcd as a real server, the simulator's store). The checks panic with a
//! message naming what the backend got wrong.

use std::time::Duration;

use super::{Compare, KeyValue, Metastore, MetastoreError, Txn, TxnOutcome};
use crate::clock::Clock;

/// Runs every check under `prefix`, which must hold no keys.
pub async fn run_all(store: &dyn Metastore, prefix: &str) {
    let key = |name: &str| format!("{prefix}{name}").into_bytes();
    versions_grow(store, &key("versions/")).await;
    failed_compares_apply_nothing(store, &key("cas/")).await;
    one_revision_per_transaction(store, &key("revision/")).await;
    scans(store, &key("scan/")).await;
    many_gets(store, &key("many/")).await;
    binary_keys_scan_in_byte_order(store, &key("binary/")).await;
    transaction_size_limit(store, &key("size/")).await;
    leases(store, &key("lease/")).await;
}

fn join(prefix: &[u8], name: &str) -> Vec<u8> {
    let mut key = prefix.to_vec();
    key.extend_from_slice(name.as_bytes());
    key
}

fn committed(outcome: TxnOutcome) -> u64 {
    match outcome {
        TxnOutcome::Committed { revision } => revision,
        TxnOutcome::Conflict => panic!("a transaction with no failing compare conflicted"),
    }
}

/// A put is read back, and every write of a key gives it a higher, non-zero version.
pub async fn versions_grow(store: &dyn Metastore, prefix: &[u8]) {
    let a = join(prefix, "a");
    assert_eq!(
        store.get(&a).await.expect("get"),
        None,
        "a fresh key exists"
    );
    store
        .commit(Txn::new().put(a.clone(), b"1".to_vec()))
        .await
        .expect("put");
    let first = store
        .get(&a)
        .await
        .expect("get")
        .expect("a put key is missing");
    assert_eq!(first.value, b"1");
    assert!(first.version > 0, "an existing key has version 0");
    store
        .commit(Txn::new().put(a.clone(), b"2".to_vec()))
        .await
        .expect("put");
    let second = store.get(&a).await.expect("get").expect("key");
    assert_eq!(second.value, b"2");
    assert!(
        second.version > first.version,
        "a rewrite did not raise the version"
    );
    store
        .commit(Txn::new().delete(a.clone()))
        .await
        .expect("delete");
    assert_eq!(
        store.get(&a).await.expect("get"),
        None,
        "a deleted key is still there"
    );
}

/// A transaction with a failing compare changes nothing; one whose compares all hold applies
/// every mutation.
pub async fn failed_compares_apply_nothing(store: &dyn Metastore, prefix: &[u8]) {
    let (k, other, nothing) = (
        join(prefix, "k"),
        join(prefix, "other"),
        join(prefix, "none"),
    );
    store
        .commit(Txn::new().put(k.clone(), b"v".to_vec()))
        .await
        .expect("put");
    let kv = store.get(&k).await.expect("get").expect("key");
    let stale = Txn::new()
        .compare(Compare::Version(k.clone(), kv.version + 1))
        .put(k.clone(), b"changed".to_vec())
        .put(other.clone(), b"x".to_vec());
    assert_eq!(
        store.commit(stale).await.expect("commit"),
        TxnOutcome::Conflict
    );
    assert_eq!(store.get(&k).await.expect("get").expect("key").value, b"v");
    assert_eq!(
        store.get(&other).await.expect("get"),
        None,
        "a conflicted txn wrote"
    );

    let holds = Txn::new()
        .compare(Compare::Version(k.clone(), kv.version))
        .compare(Compare::Missing(other.clone()))
        .put(k.clone(), b"changed".to_vec())
        .delete(nothing);
    committed(store.commit(holds).await.expect("commit"));
    assert_eq!(
        store.get(&k).await.expect("get").expect("key").value,
        b"changed"
    );

    let missing = Txn::new()
        .compare(Compare::Missing(k.clone()))
        .delete(k.clone());
    assert_eq!(
        store.commit(missing).await.expect("commit"),
        TxnOutcome::Conflict
    );
    let absent = Txn::new()
        .compare(Compare::Version(other.clone(), 1))
        .put(other.clone(), b"x".to_vec());
    assert_eq!(
        store.commit(absent).await.expect("commit"),
        TxnOutcome::Conflict,
        "a version compare on a missing key held"
    );
}

/// Every key a transaction puts gets the revision the transaction committed at, so a caller can
/// compare-and-set any of them without reading them back.
pub async fn one_revision_per_transaction(store: &dyn Metastore, prefix: &[u8]) {
    let (a, b) = (join(prefix, "a"), join(prefix, "b"));
    let revision = committed(
        store
            .commit(
                Txn::new()
                    .put(a.clone(), b"1".to_vec())
                    .put(b.clone(), b"2".to_vec()),
            )
            .await
            .expect("commit"),
    );
    for key in [&a, &b] {
        let kv = store.get(key).await.expect("get").expect("key");
        assert_eq!(
            kv.version, revision,
            "a put's version is not its txn's revision"
        );
    }
    let next = Txn::new()
        .compare(Compare::Version(a.clone(), revision))
        .put(b.clone(), b"3".to_vec());
    assert!(committed(store.commit(next).await.expect("commit")) > revision);
}

fn names(kvs: Vec<KeyValue>, prefix: &[u8]) -> Vec<String> {
    kvs.into_iter()
        .map(|kv| String::from_utf8_lossy(&kv.key[prefix.len()..]).into_owned())
        .collect()
}

/// Scans stay inside their prefix, start strictly after `start_after`, and stop at `limit`.
pub async fn scans(store: &dyn Metastore, prefix: &[u8]) {
    let mut txn = Txn::new();
    for name in ["a/1", "a/2", "a/3", "a0", "b/1"] {
        txn = txn.put(join(prefix, name), name.as_bytes().to_vec());
    }
    store.commit(txn).await.expect("commit");
    let a = join(prefix, "a/");
    let scan = |after: Option<&'static str>, limit: usize| {
        let a = a.clone();
        async move {
            let after = after.map(|name| join(prefix, name));
            names(
                store.scan(&a, after.as_deref(), limit).await.expect("scan"),
                prefix,
            )
        }
    };
    assert_eq!(scan(None, 100).await, ["a/1", "a/2", "a/3"]);
    assert_eq!(scan(Some("a/1"), 100).await, ["a/2", "a/3"]);
    assert_eq!(scan(None, 2).await, ["a/1", "a/2"]);
    assert_eq!(
        scan(Some("0"), 1).await,
        ["a/1"],
        "a start before the prefix"
    );
    assert!(
        scan(Some("a/3"), 10).await.is_empty(),
        "a start at the last key"
    );
    assert!(
        scan(Some("z"), 10).await.is_empty(),
        "a start past the prefix"
    );
    assert!(
        store
            .scan(&join(prefix, "c"), None, 10)
            .await
            .expect("scan")
            .is_empty()
    );
}

/// Many keys read at once come back in the order asked, missing ones as `None`, across more
/// keys than one transaction may hold.
pub async fn many_gets(store: &dyn Metastore, prefix: &[u8]) {
    let count = store.capabilities().max_txn_ops + 3;
    let mut keys = Vec::new();
    for i in 0..count {
        keys.push(join(prefix, &format!("{i:04}")));
    }
    // Every other key exists, written in transactions the store accepts.
    let present: Vec<&Vec<u8>> = keys.iter().step_by(2).collect();
    for chunk in present.chunks(store.capabilities().max_txn_ops.max(1)) {
        let mut txn = Txn::new();
        for key in chunk {
            txn = txn.put(key.to_vec(), key.to_vec());
        }
        store.commit(txn).await.expect("commit");
    }
    let mut asked = keys.clone();
    asked.reverse();
    let got = store.get_many(&asked).await.expect("get_many");
    assert_eq!(got.len(), asked.len(), "one answer per key");
    for (key, answer) in asked.iter().zip(got) {
        let index = keys.iter().position(|k| k == key).unwrap_or(0);
        match answer {
            Some(kv) => {
                assert_eq!(index % 2, 0, "a key never written was found");
                assert_eq!(&kv.key, key, "answers in the order asked");
                assert_eq!(&kv.value, key);
                assert!(kv.version > 0);
            }
            None => assert_eq!(index % 2, 1, "a written key was not found"),
        }
    }
}

/// The catalog's keys carry big-endian numbers, so bytes up to 0xff must sort and bound scans
/// by byte value.
pub async fn binary_keys_scan_in_byte_order(store: &dyn Metastore, prefix: &[u8]) {
    let id = |n: u64| {
        let mut key = prefix.to_vec();
        key.extend_from_slice(&n.to_be_bytes());
        key
    };
    let ids = [0u64, 1, 0x7f, 0x80, 0xff, 0x1ff, u64::MAX - 1, u64::MAX];
    let mut txn = Txn::new();
    for n in ids {
        txn = txn.put(id(n), n.to_be_bytes().to_vec());
    }
    store.commit(txn).await.expect("commit");
    let all = store.scan(prefix, None, 100).await.expect("scan");
    let read: Vec<u64> = all
        .iter()
        .map(|kv| u64::from_be_bytes(kv.value.as_slice().try_into().expect("8 bytes")))
        .collect();
    assert_eq!(read, ids, "binary keys out of byte order");
    let after = store
        .scan(prefix, Some(&id(0xff)), 100)
        .await
        .expect("scan");
    assert_eq!(after.len(), 3, "a scan after 0xff");
    // A prefix ending in 0xff bounds its range correctly too.
    let mut high = id(u64::MAX);
    high.truncate(prefix.len() + 7);
    let tail = store.scan(&high, None, 100).await.expect("scan");
    assert_eq!(tail.len(), 2, "a prefix of 0xff bytes");
}

/// A transaction at the declared limit commits; one past it is refused whole.
pub async fn transaction_size_limit(store: &dyn Metastore, prefix: &[u8]) {
    let limit = store.capabilities().max_txn_ops;
    assert!(
        limit >= 100,
        "the catalog writes up to 100 keys per restore transaction"
    );
    let mut full = Txn::new();
    for n in 0..limit {
        full = full.put(join(prefix, &format!("a{n:05}")), vec![1]);
    }
    committed(store.commit(full).await.expect("a txn at the limit"));
    let mut over = Txn::new();
    for n in 0..=limit {
        over = over.put(join(prefix, &format!("b{n:05}")), vec![1]);
    }
    match store.commit(over).await {
        Err(MetastoreError::TooLarge { ops, limit: said }) => {
            assert_eq!((ops, said), (limit + 1, limit));
        }
        other => panic!("a txn past the limit answered {other:?}"),
    }
    assert!(
        store
            .scan(&join(prefix, "b"), None, 1)
            .await
            .expect("scan")
            .is_empty(),
        "a refused txn wrote"
    );
}

/// Leased keys live while the lease is kept alive and vanish when it is revoked or expires; a
/// backend without leases says so instead of pretending.
pub async fn leases(store: &dyn Metastore, prefix: &[u8]) {
    if !store.capabilities().leases {
        assert!(matches!(
            store.grant_lease(Duration::from_secs(5)).await,
            Err(MetastoreError::Unsupported(_))
        ));
        let leased = Txn::new().put_leased(join(prefix, "k"), vec![1], 1);
        assert!(
            matches!(
                store.commit(leased).await,
                Err(MetastoreError::Unsupported(_))
            ),
            "a leased put on a backend without leases"
        );
        return;
    }
    let revoked = join(prefix, "revoked");
    let lease = store
        .grant_lease(Duration::from_secs(30))
        .await
        .expect("grant");
    committed(
        store
            .commit(
                Txn::new()
                    .compare(Compare::Missing(revoked.clone()))
                    .put_leased(revoked.clone(), vec![1], lease),
            )
            .await
            .expect("leased put"),
    );
    let ttl = store.keep_alive(lease).await.expect("keep alive");
    assert!(
        ttl.is_some_and(|t| t > Duration::from_secs(20)),
        "a live lease kept alive: {ttl:?}"
    );
    store.revoke_lease(lease).await.expect("revoke");
    assert_eq!(
        store.get(&revoked).await.expect("get"),
        None,
        "a revoked lease's key stayed"
    );
    assert_eq!(
        store.keep_alive(lease).await.expect("keep alive"),
        None,
        "a revoked lease lives"
    );

    // Expiry: a short lease left alone takes its key with it.
    let expiring = join(prefix, "expiring");
    let lease = store
        .grant_lease(Duration::from_secs(2))
        .await
        .expect("grant");
    committed(
        store
            .commit(Txn::new().put_leased(expiring.clone(), vec![1], lease))
            .await
            .expect("put"),
    );
    assert!(store.get(&expiring).await.expect("get").is_some());
    let clock = Clock::system();
    let started = clock.now();
    while store.get(&expiring).await.expect("get").is_some() {
        assert!(
            clock.since(started) < Duration::from_secs(15),
            "an expired lease's key stayed"
        );
        clock.sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(store.keep_alive(lease).await.expect("keep alive"), None);
}
