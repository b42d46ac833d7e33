//! Kafka producer ids (`InitProducerId`), handed out in blocks from one counter at
//! `m/next_producer_id`, so no two stars of a fleet, and no two starts of a star, ever hand
//! out the same id. An idempotent producer's batches are recognised by their id: two
//! producers sharing one would see each other's batches answered as already written.

use super::*;

const NEXT_PRODUCER_ID_KEY: &[u8] = b"m/next_producer_id";

/// Attempts at taking a block while other stars take theirs.
const RESERVE_ATTEMPTS: usize = 64;

/// Where a counter missing from the catalog starts: the wall clock in milliseconds, shifted so
/// a catalog rebuilt from the object store (which has no counter) starts past every id handed
/// out before it, unless over 2^20 ids a millisecond were.
fn first_id(now_ms: u64) -> u64 {
    (now_ms << 20).min(i64::MAX as u64 / 2)
}

impl Catalog {
    /// Takes `count` producer ids no one has had, as a range.
    pub async fn reserve_producer_ids(
        &self,
        count: u64,
        now_ms: u64,
    ) -> Result<std::ops::Range<u64>, CatalogError> {
        for _ in 0..RESERVE_ATTEMPTS {
            let counter = self.store.get(NEXT_PRODUCER_ID_KEY).await?;
            let (first, compare) = match &counter {
                Some(kv) => (
                    Reader::start(&kv.value)?.u64()?,
                    Compare::Version(NEXT_PRODUCER_ID_KEY.to_vec(), kv.version),
                ),
                None => (
                    first_id(now_ms),
                    Compare::Missing(NEXT_PRODUCER_ID_KEY.to_vec()),
                ),
            };
            let end = first
                .checked_add(count)
                .filter(|end| *end <= i64::MAX as u64)
                .ok_or_else(|| {
                    CatalogError::Corrupt(format!("producer ids are used up (next {first})"))
                })?;
            let txn = Txn::new()
                .compare(compare)
                .put(NEXT_PRODUCER_ID_KEY.to_vec(), encode_next_id(end));
            if let TxnOutcome::Committed { .. } = self.store.commit(txn).await? {
                return Ok(first..end);
            }
        }
        Err(CatalogError::Conflict(
            "other stars kept taking producer ids; retry".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn blocks_never_overlap_and_start_past_the_clock() {
        let (_dir, catalog) = crate::catalog::tests::catalog();
        let a = catalog.reserve_producer_ids(1024, 5).await.unwrap();
        assert_eq!(a.start, 5 << 20);
        let b = catalog.reserve_producer_ids(1024, 0).await.unwrap();
        assert_eq!(b.start, a.end);
        let (c, d) = tokio::join!(
            catalog.reserve_producer_ids(10, 0),
            catalog.reserve_producer_ids(10, 0)
        );
        let (c, d) = (c.unwrap(), d.unwrap());
        assert!(c.end <= d.start || d.end <= c.start);
    }
}
