use super::*;

fn open() -> (tempfile::TempDir, EmbeddedMetastore) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = EmbeddedMetastore::open(dir.path().join("meta.redb")).expect("open");
    (dir, store)
}

#[tokio::test]
async fn puts_are_read_back_with_growing_versions() {
    let (_dir, store) = open();
    assert_eq!(store.get(b"a").await.unwrap(), None);
    store
        .commit(Txn::new().put(b"a".to_vec(), b"1".to_vec()))
        .await
        .unwrap();
    let first = store.get(b"a").await.unwrap().unwrap();
    assert_eq!(first.value, b"1");
    store
        .commit(Txn::new().put(b"a".to_vec(), b"2".to_vec()))
        .await
        .unwrap();
    let second = store.get(b"a").await.unwrap().unwrap();
    assert_eq!(second.value, b"2");
    assert!(second.version > first.version);
}

#[tokio::test]
async fn a_failed_compare_applies_nothing() {
    let (_dir, store) = open();
    store
        .commit(Txn::new().put(b"k".to_vec(), b"v".to_vec()))
        .await
        .unwrap();
    let kv = store.get(b"k").await.unwrap().unwrap();
    let outcome = store
        .commit(
            Txn::new()
                .compare(Compare::Version(b"k".to_vec(), kv.version + 1))
                .put(b"k".to_vec(), b"changed".to_vec())
                .put(b"other".to_vec(), b"x".to_vec()),
        )
        .await
        .unwrap();
    assert_eq!(outcome, TxnOutcome::Conflict);
    assert_eq!(store.get(b"k").await.unwrap().unwrap().value, b"v");
    assert_eq!(store.get(b"other").await.unwrap(), None);

    let outcome = store
        .commit(
            Txn::new()
                .compare(Compare::Version(b"k".to_vec(), kv.version))
                .compare(Compare::Missing(b"other".to_vec()))
                .put(b"k".to_vec(), b"changed".to_vec())
                .delete(b"nothing".to_vec()),
        )
        .await
        .unwrap();
    assert!(matches!(outcome, TxnOutcome::Committed { .. }));
    assert_eq!(store.get(b"k").await.unwrap().unwrap().value, b"changed");
    let outcome = store
        .commit(
            Txn::new()
                .compare(Compare::Missing(b"k".to_vec()))
                .delete(b"k".to_vec()),
        )
        .await
        .unwrap();
    assert_eq!(outcome, TxnOutcome::Conflict);
}

#[tokio::test]
async fn scans_respect_prefix_start_after_and_limit() {
    let (_dir, store) = open();
    let mut txn = Txn::new();
    for key in ["a/1", "a/2", "a/3", "a0", "b/1"] {
        txn = txn.put(key.as_bytes().to_vec(), key.as_bytes().to_vec());
    }
    store.commit(txn).await.unwrap();
    let keys = |kvs: Vec<KeyValue>| -> Vec<String> {
        kvs.into_iter()
            .map(|kv| String::from_utf8(kv.key).unwrap())
            .collect()
    };
    assert_eq!(
        keys(store.scan(b"a/", None, 100).await.unwrap()),
        ["a/1", "a/2", "a/3"]
    );
    assert_eq!(
        keys(store.scan(b"a/", Some(b"a/1"), 100).await.unwrap()),
        ["a/2", "a/3"]
    );
    assert_eq!(
        keys(store.scan(b"a/", None, 2).await.unwrap()),
        ["a/1", "a/2"]
    );
    assert_eq!(
        keys(store.scan(b"a/", Some(b"0"), 1).await.unwrap()),
        ["a/1"]
    );
    assert!(store.scan(b"c", None, 10).await.unwrap().is_empty());
}

#[tokio::test]
async fn data_survives_reopening_and_a_second_opener_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.redb");
    {
        let store = EmbeddedMetastore::open(&path).unwrap();
        store
            .commit(Txn::new().put(b"k".to_vec(), b"v".to_vec()))
            .await
            .unwrap();
        assert!(matches!(
            EmbeddedMetastore::open(&path),
            Err(MetastoreError::Unavailable(_))
        ));
    }
    let store = EmbeddedMetastore::open(&path).unwrap();
    assert_eq!(store.get(b"k").await.unwrap().unwrap().value, b"v");
    assert!(matches!(
        store.grant_lease(std::time::Duration::from_secs(1)).await,
        Err(MetastoreError::Unsupported("leases"))
    ));
}
