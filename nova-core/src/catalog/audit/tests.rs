use super::*;
use crate::catalog::tests::{catalog, fresh_chain, standard_stream};

fn entry(id: u64, start: u64, end: u64, key: &str) -> IndexEntry {
    IndexEntry {
        created_at_ms: 0,
        stream_id: id,
        start_seq: start,
        end_seq: end,
        object_key: key.into(),
        offset: 16,
        len: end - start,
        crc32c: 1,
    }
}

/// A metastore that lands a delete of stream "s" right after the first read it serves,
/// between the two reads of `stream_liveness`.
#[derive(Debug)]
struct DeleteAfterFirstRead {
    inner: Arc<dyn Metastore>,
    armed: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl Metastore for DeleteAfterFirstRead {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn capabilities(&self) -> crate::metastore::Capabilities {
        self.inner.capabilities()
    }

    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>, MetastoreError> {
        let read = self.inner.get(key).await;
        if self.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
            Catalog::new(self.inner.clone())
                .delete_stream("s")
                .await
                .unwrap();
        }
        read
    }

    async fn scan(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<KeyValue>, MetastoreError> {
        self.inner.scan(prefix, start_after, limit).await
    }

    async fn commit(&self, txn: Txn) -> Result<TxnOutcome, MetastoreError> {
        self.inner.commit(txn).await
    }
}

/// A delete landing between liveness's two reads must not make a stream whose manifest is
/// still unmarked look deleted and marked (its sections would be skipped by the settle, and
/// a rebuild would bring the stream back without them).
#[tokio::test]
async fn liveness_sees_a_delete_landing_between_its_reads_as_unmarked() {
    let (_dir, plain) = catalog();
    let s = plain
        .create_stream("s", StorageClass::Standard, 1)
        .await
        .unwrap();
    let racing = Catalog::new(Arc::new(DeleteAfterFirstRead {
        inner: plain.store.clone(),
        armed: true.into(),
    }));
    let seen = racing.stream_liveness(s.id).await.unwrap();
    assert!(
        plain.store.get(&tail_key(s.id)).await.unwrap().is_none(),
        "the delete landed"
    );
    assert_ne!(
        seen,
        Liveness::Deleted,
        "an unmarked delete taken for a marked one"
    );
    assert_eq!(seen, Liveness::DeletedUnmarked);
}

#[tokio::test]
async fn garbage_pages_in_due_order_and_round_trips() {
    let (_dir, catalog) = catalog();
    let slots = Garbage::ChainSlots {
        star: "s".into(),
        epoch: 2,
        from: 3,
        to: 9,
        bytes: 70,
    };
    let object = Garbage::Object {
        key: "data/s/x".into(),
        bytes: 5,
    };
    catalog
        .queue_garbage(&[(200, object.clone()), (100, slots.clone())])
        .await
        .unwrap();
    let page = catalog.garbage_page(10).await.unwrap();
    let items: Vec<_> = page.iter().map(|g| (g.due_ms, g.item.clone())).collect();
    assert_eq!(items, [(100, slots), (200, object)]);
    catalog.forget_garbage(&page[0]).await.unwrap();
    assert_eq!(catalog.garbage_page(10).await.unwrap().len(), 1);
}

/// The collected mark follows the furthest run forgotten, whatever order collectors
/// forget runs in, and each forget takes its item off the queue.
#[tokio::test]
async fn a_chains_collected_mark_only_moves_forward() {
    let (_dir, catalog) = catalog();
    assert_eq!(catalog.chain_collected("s").await.unwrap(), None);
    let run = |epoch, to| Garbage::ChainSlots {
        star: "s".into(),
        epoch,
        from: 0,
        to,
        bytes: 0,
    };
    catalog
        .queue_garbage(&[(1, run(2, 9)), (2, run(3, 4)), (3, run(2, 20))])
        .await
        .unwrap();
    let page = catalog.garbage_page(10).await.unwrap();
    let expect = [(2, 9), (3, 4), (3, 4)];
    for (queued, mark) in page.iter().zip(expect) {
        let Garbage::ChainSlots { epoch, to, .. } = queued.item else {
            panic!("not a run: {queued:?}");
        };
        catalog
            .forget_chain_run(queued, "s", epoch, to)
            .await
            .unwrap();
        assert_eq!(catalog.chain_collected("s").await.unwrap(), Some(mark));
    }
    assert!(catalog.garbage_page(10).await.unwrap().is_empty());
    assert_eq!(catalog.chain_collected("other").await.unwrap(), None);
}

#[tokio::test]
async fn a_swap_replaces_unchanged_entries_and_refuses_changed_ones() {
    let (_dir, catalog) = catalog();
    let s = standard_stream(&catalog).await;
    let chain = fresh_chain(&catalog).await;
    let batch = AbsorbBatch {
        entries: vec![entry(s.id, 0, 5, "f0"), entry(s.id, 5, 9, "f1")],
        ..AbsorbBatch::default()
    };
    let next = ChainState {
        epoch: 1,
        checkpoint: Some(1),
    };
    catalog
        .absorb("star", Some(chain.version), next, batch)
        .await
        .unwrap();
    let a = catalog.index_entry(s.id, 5).await.unwrap().unwrap();
    let b = catalog.index_entry(s.id, 9).await.unwrap().unwrap();
    let merged = entry(s.id, 0, 9, "data/star/merged");
    let intent = catalog
        .queue_garbage(&[(
            50,
            Garbage::Object {
                key: merged.object_key.clone(),
                bytes: 9,
            },
        )])
        .await
        .unwrap();
    // An entry read at an older version refuses the swap.
    let stale = [(a.0.clone(), a.1 + 100), b.clone()];
    let merged = std::slice::from_ref(&merged);
    assert!(
        !catalog
            .swap_entries(&stale, merged, Some(&intent[0]), &[])
            .await
            .unwrap()
    );
    // An intent a collector has claimed refuses the swap too.
    let claimed = catalog.garbage_page(1).await.unwrap().remove(0);
    assert!(catalog.claim_garbage(&claimed).await.unwrap());
    assert!(
        !catalog.claim_garbage(&claimed).await.unwrap(),
        "claimed once"
    );
    assert!(
        !catalog
            .swap_entries(&[a.clone(), b.clone()], merged, Some(&intent[0]), &[])
            .await
            .unwrap()
    );
    let requeued = catalog.garbage_page(1).await.unwrap().remove(0);
    let intent = [(requeued.key, requeued.version)];
    assert!(
        catalog
            .swap_entries(&[a, b], merged, Some(&intent[0]), &[])
            .await
            .unwrap()
    );
    assert_eq!(catalog.index_entries(s.id, 0, 10).await.unwrap(), merged);
    assert!(
        catalog.garbage_page(10).await.unwrap().is_empty(),
        "intent cleared"
    );
    // Entries that do not tile the new one are refused outright.
    let c = catalog.index_entry(s.id, 9).await.unwrap().unwrap();
    assert!(
        catalog
            .swap_entries(&[c], &[entry(s.id, 1, 9, "x")], None, &[])
            .await
            .is_err()
    );
}

#[tokio::test]
async fn a_deleted_streams_entries_are_dropped_and_its_objects_queued() {
    let (_dir, catalog) = catalog();
    let s = standard_stream(&catalog).await;
    let entries: Vec<_> = (0..DROP_BATCH as u64 + 3)
        .map(|i| entry(s.id, i, i + 1, &format!("data/star/{i}")))
        .collect();
    catalog.restore_entries(&entries).await.unwrap();
    let dropping = Dropping {
        id: s.id,
        name: "s".into(),
    };
    assert!(
        catalog.drop_entries(&dropping, 7, |_| true).await.is_err(),
        "live"
    );
    assert!(catalog.dropping_streams(10).await.unwrap().is_empty());
    catalog.delete_stream("s").await.unwrap();
    // Until its manifest says deleted, the stream's records stay.
    assert_eq!(
        catalog.dropping_streams(10).await.unwrap(),
        [(dropping.clone(), false)]
    );
    assert_eq!(
        catalog.stream_liveness(s.id).await.unwrap(),
        Liveness::DeletedUnmarked
    );
    catalog.clear_tombstone(s.id).await.unwrap();
    assert_eq!(
        catalog.dropping_streams(10).await.unwrap(),
        [(dropping.clone(), true)]
    );
    assert_eq!(
        catalog.stream_liveness(s.id).await.unwrap(),
        Liveness::Deleted
    );
    // A new stream of the same name is another stream.
    catalog
        .create_stream("s", StorageClass::Standard, 2)
        .await
        .unwrap();
    let owned = |e: &IndexEntry| e.start_seq.is_multiple_of(2);
    assert_eq!(
        catalog.drop_entries(&dropping, 7, owned).await.unwrap(),
        DROP_BATCH
    );
    assert_eq!(catalog.drop_entries(&dropping, 7, owned).await.unwrap(), 3);
    assert_eq!(catalog.drop_entries(&dropping, 7, owned).await.unwrap(), 0);
    assert!(catalog.dropping_streams(10).await.unwrap().is_empty());
    assert!(
        catalog
            .index_entries(s.id, 0, 100)
            .await
            .unwrap()
            .is_empty()
    );
    let queued = catalog.garbage_page(1000).await.unwrap();
    assert_eq!(queued.len(), (DROP_BATCH + 3).div_ceil(2));
}

#[tokio::test]
async fn the_cursor_moves_only_from_the_version_it_was_read_at() {
    let (_dir, catalog) = catalog();
    assert_eq!(catalog.settle_cursor("star").await.unwrap(), None);
    let first = SettleCursor {
        epoch: 1,
        next_slot: 0,
        last_due_ms: 0,
    };
    assert!(
        catalog
            .advance_settle("star", None, first, &[])
            .await
            .unwrap()
    );
    assert!(
        !catalog
            .advance_settle("star", None, first, &[])
            .await
            .unwrap()
    );
    let at = catalog.settle_cursor("star").await.unwrap().unwrap();
    let next = SettleCursor {
        next_slot: 10,
        last_due_ms: 5,
        ..first
    };
    let run = Garbage::ChainSlots {
        star: "star".into(),
        epoch: 1,
        from: 0,
        to: 9,
        bytes: 0,
    };
    assert!(
        catalog
            .advance_settle("star", Some(at.version), next, &[(5, run.clone())])
            .await
            .unwrap()
    );
    assert_eq!(
        catalog.settle_cursor("star").await.unwrap().unwrap().cursor,
        next
    );
    assert_eq!(catalog.garbage_page(10).await.unwrap()[0].item, run);
}
