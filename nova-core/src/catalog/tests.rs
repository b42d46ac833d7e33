use super::*;
use crate::metastore::EmbeddedMetastore;

/// The key table at the top of `catalog/mod.rs` names every prefix the catalog writes: a record
/// kind it leaves out is one a reader of the metastore (or a new prefix's author, who must
/// pick an unused letter) cannot learn about.
#[test]
fn the_key_table_names_every_prefix() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/catalog");
    let table: String = include_str!("mod.rs")
        .lines()
        .take_while(|line| line.starts_with("//!"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut prefixes = std::collections::BTreeSet::new();
    let mut dirs = vec![dir];
    let mut files = Vec::new();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                files.push(path);
            }
        }
    }
    for file in files {
        let source = std::fs::read_to_string(file).unwrap();
        for (at, _) in source.match_indices("b\"") {
            let literal = &source[at + 2..];
            let bytes = literal.as_bytes();
            if bytes.len() > 2 && bytes[0].is_ascii_lowercase() && bytes[1] == b'/' {
                prefixes.insert(literal[..2].to_owned());
            }
        }
    }
    assert!(prefixes.len() >= 10, "{prefixes:?}");
    for prefix in prefixes {
        assert!(
            table.contains(&format!("//! {prefix}")),
            "catalog prefix {prefix} is missing from the key table"
        );
    }
}

/// Stream "s", of the Standard class, created at 1 ms.
pub(super) async fn standard_stream(catalog: &Catalog) -> StreamMeta {
    catalog
        .create_stream("s", StorageClass::Standard, 1)
        .await
        .unwrap()
}

/// The chain of star "star" at epoch 1, nothing absorbed yet.
pub(super) async fn fresh_chain(catalog: &Catalog) -> VersionedChain {
    let fresh = ChainState {
        epoch: 1,
        checkpoint: None,
    };
    catalog.set_chain("star", None, fresh).await.unwrap()
}

pub(super) fn catalog() -> (tempfile::TempDir, Catalog) {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedMetastore::open(dir.path().join("m.redb")).unwrap();
    (dir, Catalog::new(Arc::new(store)))
}

/// A Standard stream `name` under a reserved id, as a create would insert it.
fn standard(name: &str, reserved: ReservedId) -> StreamMeta {
    StreamMeta {
        id: reserved.id,
        name: name.into(),
        created_at_ms: 1,
        class: StorageClass::Standard,
        retention: Retention::default(),
    }
}

/// A claim moves the chain's version without changing its state: a commit compared against
/// the version before fails, and a writer looking for its own lost commit does not take the
/// claim for it; an absorb after the claim is found again.
#[tokio::test]
async fn a_claim_fails_earlier_commits_and_is_nobodys_own() {
    let (_dir, catalog) = catalog();
    let state = ChainState {
        epoch: 3,
        checkpoint: Some(7),
    };
    let first = catalog.set_chain("s", None, state).await.unwrap();
    assert_eq!(catalog.chain_if_at("s", state).await.unwrap(), Some(first));
    let claimed = catalog.claim_chain("s", first).await.unwrap().unwrap();
    assert_eq!(claimed.state, state);
    assert!(claimed.version > first.version);
    assert_eq!(catalog.chain_if_at("s", state).await.unwrap(), None);
    let moved = ChainState {
        checkpoint: Some(8),
        ..state
    };
    let late = catalog.set_chain("s", Some(first.version), moved).await;
    assert!(matches!(late, Err(CatalogError::Conflict(_))), "{late:?}");
    assert_eq!(catalog.claim_chain("s", first).await.unwrap(), None);
    let next = catalog
        .set_chain("s", Some(claimed.version), moved)
        .await
        .unwrap();
    assert_eq!(catalog.chain_if_at("s", moved).await.unwrap(), Some(next));
}

/// Found by fleet seeds 31402 and 42568: a create whose insert was still queued at etcd
/// when its caller gave up, retried (under a fresh id) and then deleted, applied after the
/// delete and brought the name back as a stream nobody had created.
#[tokio::test]
async fn an_insert_applied_after_a_retried_create_and_a_delete_brings_nothing_back() {
    use crate::metastore::faulty::{CommitFault, FaultyMetastore};
    let (_dir, catalog) = catalog();
    let slow = FaultyMetastore::new(catalog.store().clone());
    let first = Catalog::new(Arc::new(slow.clone()));
    let reserved = first.reserve_stream_id("s").await.unwrap();
    let meta = standard("s", reserved);
    slow.inject(CommitFault::Hold, None);
    let queued = tokio::spawn(async move { first.insert_stream(&meta, reserved).await });
    slow.wait_held().await;
    // The caller gave up on it: created again, then deleted.
    let retried = catalog
        .create_stream("s", StorageClass::Standard, 2)
        .await
        .unwrap();
    assert_ne!(retried.id, reserved.id);
    catalog.delete_stream("s").await.unwrap();
    slow.clear();
    assert!(matches!(
        queued.await.unwrap(),
        Err(CatalogError::Conflict(_))
    ));
    assert!(catalog.stream("s").await.unwrap().is_none());
}

/// The fence is the name's: creates of other names between a reservation and its insert
/// (through other stars) do not make it fail.
#[tokio::test]
async fn creates_of_other_names_do_not_fence_an_insert() {
    let (_dir, catalog) = catalog();
    let reserved = catalog.reserve_stream_id("s").await.unwrap();
    catalog
        .create_stream("other", StorageClass::Standard, 1)
        .await
        .unwrap();
    let meta = standard("s", reserved);
    catalog.insert_stream(&meta, reserved).await.unwrap();
    assert_eq!(catalog.stream("s").await.unwrap(), Some(meta));
    // Settled: no reservation is left behind.
    assert!(
        catalog
            .store()
            .get(&creating_key("s"))
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn streams_get_fresh_ids_and_names_are_unique() {
    let (_dir, catalog) = catalog();
    let a = catalog
        .create_stream("a", StorageClass::Standard, 1)
        .await
        .unwrap();
    let b = catalog
        .create_stream("b", StorageClass::Standard, 2)
        .await
        .unwrap();
    assert_ne!(a.id, b.id);
    assert!(matches!(
        catalog.create_stream("a", StorageClass::Standard, 3).await,
        Err(CatalogError::AlreadyExists(_))
    ));
    catalog.delete_stream("a").await.unwrap();
    let again = catalog
        .create_stream("a", StorageClass::Standard, 4)
        .await
        .unwrap();
    assert!(again.id > b.id, "ids are never reused");
    let loaded = catalog.load_streams().await.unwrap();
    let names: Vec<_> = loaded.iter().map(|(m, _)| m.name.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
    assert!(matches!(
        catalog.delete_stream("nope").await,
        Err(CatalogError::NotFound(_))
    ));
}

#[tokio::test]
async fn absorb_records_entries_and_fences_stale_writers() {
    let (_dir, catalog) = catalog();
    let s = standard_stream(&catalog).await;
    let chain = fresh_chain(&catalog).await;
    let entry = |start, end| IndexEntry {
        stream_id: s.id,
        start_seq: start,
        end_seq: end,
        object_key: format!("obj-{start}"),
        offset: 16,
        len: 100,
        crc32c: 7,
        created_at_ms: 0,
    };
    let batch = AbsorbBatch {
        entries: vec![entry(0, 10), entry(10, 25)],
        tails: vec![(
            s.id,
            StreamTail {
                tail_seq: 25,
                stored_bytes: 200,
            },
        )],
        ..AbsorbBatch::default()
    };
    let next = ChainState {
        epoch: 1,
        checkpoint: Some(1),
    };
    let chain2 = catalog
        .absorb("star", Some(chain.version), next, batch)
        .await
        .unwrap();
    assert_eq!(catalog.chain("star").await.unwrap(), Some(chain2));
    // A writer still holding the old version is refused.
    assert!(matches!(
        catalog
            .absorb("star", Some(chain.version), next, AbsorbBatch::default())
            .await,
        Err(CatalogError::Conflict(_))
    ));
    assert_eq!(
        catalog.index_entries(s.id, 0, 10).await.unwrap(),
        [entry(0, 10), entry(10, 25)]
    );
    assert_eq!(
        catalog.index_entries(s.id, 9, 10).await.unwrap(),
        [entry(0, 10), entry(10, 25)]
    );
    assert_eq!(
        catalog.index_entries(s.id, 10, 10).await.unwrap(),
        [entry(10, 25)]
    );
    assert!(
        catalog
            .index_entries(s.id, 25, 10)
            .await
            .unwrap()
            .is_empty()
    );
    let loaded = catalog.load_streams().await.unwrap();
    assert_eq!(
        loaded[0].1,
        StreamTail {
            tail_seq: 25,
            stored_bytes: 200
        }
    );
}

#[tokio::test]
async fn the_express_checkpoint_moves_with_the_absorb_and_counts_toward_the_limit() {
    let (_dir, catalog) = catalog();
    let limit = catalog.store().capabilities().max_txn_ops as u64;
    let chain = fresh_chain(&catalog).await;
    assert_eq!(catalog.express_checkpoint("star").await.unwrap(), None);
    let carried = ExpressCheckpoint {
        epoch: 3,
        through: Some(9),
    };
    let next = ChainState {
        epoch: 1,
        checkpoint: Some(0),
    };
    let batch = AbsorbBatch {
        express: Some(carried),
        ..AbsorbBatch::default()
    };
    let moved = catalog
        .absorb("star", Some(chain.version), next, batch.clone())
        .await
        .unwrap();
    assert_eq!(
        catalog.express_checkpoint("star").await.unwrap(),
        Some(carried)
    );
    // A writer that lost the chain moves neither.
    let stale = ExpressCheckpoint {
        epoch: 3,
        through: Some(10),
    };
    let refused = catalog
        .absorb(
            "star",
            Some(chain.version),
            next,
            AbsorbBatch {
                express: Some(stale),
                ..AbsorbBatch::default()
            },
        )
        .await;
    assert!(matches!(refused, Err(CatalogError::Conflict(_))));
    assert_eq!(
        catalog.express_checkpoint("star").await.unwrap(),
        Some(carried)
    );
    // Tails filling the transaction beside the chain move alone no longer fit beside the
    // checkpoint too.
    let tails: Vec<(u64, StreamTail)> = (0..limit - 1)
        .map(|id| {
            (
                id,
                StreamTail {
                    tail_seq: 1,
                    stored_bytes: 0,
                },
            )
        })
        .collect();
    let full = AbsorbBatch {
        tails,
        express: Some(stale),
        ..AbsorbBatch::default()
    };
    assert!(matches!(
        catalog
            .absorb("star", Some(moved.version), next, full)
            .await,
        Err(CatalogError::Metastore(MetastoreError::TooLarge { .. }))
    ));
    assert!(decode_express(&encode_express(&stale)).is_ok_and(|x| x == stale));
    // Under a prefix of its own: the drop duty's scan of deleted streams does not see it.
    assert!(catalog.dropping_streams(16).await.unwrap().is_empty());
    assert!(decode_express(&[FORMAT, 1, 2]).is_err());
}

/// An absorb larger than the metastore's transaction limit (a flight from before sections
/// were capped) lands whole: its entries spill into transactions of their own ahead of the
/// one moving the chain.
#[tokio::test]
async fn an_absorb_past_the_transaction_limit_spills_its_entries() {
    let (_dir, catalog) = catalog();
    let limit = catalog.store().capabilities().max_txn_ops as u64;
    let s = standard_stream(&catalog).await;
    let chain = fresh_chain(&catalog).await;
    let count = 3 * limit + 7;
    let entries: Vec<IndexEntry> = (0..count)
        .map(|n| IndexEntry {
            stream_id: s.id,
            start_seq: n,
            end_seq: n + 1,
            object_key: "flight".into(),
            offset: n * 10,
            len: 10,
            crc32c: 0,
            created_at_ms: 0,
        })
        .collect();
    let batch = AbsorbBatch {
        entries: entries.clone(),
        tails: vec![(
            s.id,
            StreamTail {
                tail_seq: count,
                stored_bytes: count * 10,
            },
        )],
        forget: (1000..1000 + limit).collect(),
        spill_tails: false,
        express: None,
        guards: Vec::new(),
    };
    let next = ChainState {
        epoch: 1,
        checkpoint: Some(0),
    };
    catalog
        .absorb("star", Some(chain.version), next, batch)
        .await
        .unwrap();
    assert_eq!(catalog.chain("star").await.unwrap().unwrap().state, next);
    let read = catalog.index_entries(s.id, 0, 10_000).await.unwrap();
    assert_eq!(read, entries);
    assert_eq!(catalog.stream_tail(s.id).await.unwrap().tail_seq, count);

    // More streams than one transaction holds: only a chain's sole writer may spill tails.
    let many = |spill_tails| AbsorbBatch {
        tails: (0..2 * limit)
            .map(|id| {
                (
                    10_000 + id,
                    StreamTail {
                        tail_seq: id,
                        stored_bytes: 0,
                    },
                )
            })
            .collect(),
        spill_tails,
        ..AbsorbBatch::default()
    };
    let chain = catalog.chain("star").await.unwrap().unwrap();
    let later = ChainState {
        epoch: 1,
        checkpoint: Some(1),
    };
    assert!(matches!(
        catalog
            .absorb("star", Some(chain.version), later, many(false))
            .await,
        Err(CatalogError::Metastore(MetastoreError::TooLarge { .. }))
    ));
    catalog
        .absorb("star", Some(chain.version), later, many(true))
        .await
        .unwrap();
    assert_eq!(catalog.chain("star").await.unwrap().unwrap().state, later);
    assert_eq!(
        catalog
            .stream_tail(10_000 + 2 * limit - 1)
            .await
            .unwrap()
            .tail_seq,
        2 * limit - 1
    );
}
