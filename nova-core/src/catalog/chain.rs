//! The chain's records in the catalog: its checkpoint and epoch, the claim a starting star or a
//! takeover makes of it, and the absorb that moves a flight's sections into the index in the
//! same transaction as the checkpoint, refused once another writer moved the chain.

use super::*;

impl Catalog {
    pub async fn chain(&self, star: &str) -> Result<Option<VersionedChain>, CatalogError> {
        match self.store.get(&chain_key(star)).await? {
            Some(kv) => Ok(Some(VersionedChain {
                state: decode_chain(&kv.value)?,
                version: kv.version,
            })),
            None => Ok(None),
        }
    }

    /// The chain, if it is at exactly `state` now and was last written by an absorb. A commit
    /// whose answer was lost (an error after the metastore applied it) makes its retry meet a
    /// version conflict; this tells that apart from another writer having moved the chain.
    /// Only this star's incarnation absorbs into its epoch (recovery moves every restart to a
    /// fresh one), so finding `state` means the earlier attempt landed, unless a claim
    /// (`claim_chain`) wrote the same state since: then the chain is another process's.
    pub async fn chain_if_at(
        &self,
        star: &str,
        state: ChainState,
    ) -> Result<Option<VersionedChain>, CatalogError> {
        let Some(chain) = self.chain(star).await?.filter(|chain| chain.state == state) else {
            return Ok(None);
        };
        let claim = self.store.get(&claim_key(star)).await?;
        Ok(claim
            .is_none_or(|kv| kv.version != chain.version)
            .then_some(chain))
    }

    /// Writes the chain again as it is, at `version`, with its claim: every commit compared
    /// against an earlier version fails from here on, and none can take this write for its own
    /// (`chain_if_at`). `None` if the chain moved since it was read at `version`.
    pub async fn claim_chain(
        &self,
        star: &str,
        chain: VersionedChain,
    ) -> Result<Option<VersionedChain>, CatalogError> {
        let key = chain_key(star);
        let txn = Txn::new()
            .compare(Compare::Version(key.clone(), chain.version))
            .put(key, encode_chain(&chain.state))
            .put(claim_key(star), vec![FORMAT]);
        Ok(match self.store.commit(txn).await? {
            TxnOutcome::Committed { revision } => Some(VersionedChain {
                state: chain.state,
                version: revision,
            }),
            TxnOutcome::Conflict => None,
        })
    }

    /// Moves the chain to `state` if it is still at `expected` (`None`: it must not exist yet).
    pub async fn set_chain(
        &self,
        star: &str,
        expected: Option<u64>,
        state: ChainState,
    ) -> Result<VersionedChain, CatalogError> {
        self.absorb(star, expected, state, AbsorbBatch::default())
            .await
    }

    /// Records index entries and tails and moves the chain's checkpoint, atomically, if the
    /// chain is still at the version the caller last saw.
    pub async fn absorb(
        &self,
        star: &str,
        expected: Option<u64>,
        state: ChainState,
        batch: AbsorbBatch,
    ) -> Result<VersionedChain, CatalogError> {
        let key = chain_key(star);
        let compare = match expected {
            Some(version) => Compare::Version(key.clone(), version),
            None => Compare::Missing(key.clone()),
        };
        let batch = self.spill(batch, &compare, star).await?;
        let mut txn = Txn::new()
            .compare(compare.clone())
            .put(key, encode_chain(&state));
        for (_, guard) in &batch.guards {
            txn = txn.compare(guard.clone());
        }
        if let Some(express) = &batch.express {
            txn = txn.put(express_key(star), encode_express(express));
        }
        for entry in &batch.entries {
            txn = txn.put(
                index_key(entry.stream_id, entry.end_seq),
                encode_entry(entry),
            );
        }
        for (id, tail) in &batch.tails {
            txn = txn.put(tail_key(*id), encode_tail(tail));
        }
        for id in &batch.forget {
            txn = txn.delete(tail_key(*id));
        }
        match self.store.commit(txn).await? {
            TxnOutcome::Committed { revision } => Ok(VersionedChain {
                state,
                version: revision,
            }),
            TxnOutcome::Conflict => Err(self.why_conflict(star, &compare, &batch.guards).await),
        }
    }

    /// What made an absorb's compares fail: the chain moved (another process owns it), or the
    /// leadership of some of its streams did. Asked only after a conflict, so an absorb costs
    /// no reads while nothing is wrong.
    async fn why_conflict(
        &self,
        star: &str,
        chain: &Compare,
        guards: &[(u64, Compare)],
    ) -> CatalogError {
        if guards.is_empty() {
            return chain_moved(star);
        }
        match self.holds(chain).await {
            Ok(true) => {}
            Ok(false) => return chain_moved(star),
            Err(err) => return CatalogError::Metastore(err),
        }
        let mut deposed = Vec::new();
        for (stream, guard) in guards {
            match self.holds(guard).await {
                Ok(true) => {}
                Ok(false) => deposed.push((*stream, guard.clone())),
                Err(err) => return CatalogError::Metastore(err),
            }
        }
        if deposed.is_empty() {
            // Every compare holds now: something moved and moved back. Retried, it tells.
            return CatalogError::Metastore(MetastoreError::Unavailable(
                "an absorb conflicted and nothing it compares has changed; retrying".into(),
            ));
        }
        CatalogError::Deposed(deposed)
    }

    async fn holds(&self, compare: &Compare) -> Result<bool, MetastoreError> {
        Ok(match compare {
            Compare::Missing(key) => self.store.get(key).await?.is_none(),
            Compare::Version(key, version) => self
                .store
                .get(key)
                .await?
                .is_some_and(|kv| kv.version == *version),
        })
    }
}

/// What a writer meets when another process moved the chain it was writing.
fn chain_moved(star: &str) -> CatalogError {
    CatalogError::Conflict(format!("chain of {star} moved: another process owns it"))
}

impl Catalog {
    /// Writes ahead, in transactions of their own, what of an absorb would not fit the
    /// metastore's transaction limit beside the chain move, and returns the rest: the removal
    /// of deleted streams' tails, index entries (keyed by their own position, so settling the
    /// flight again writes the same keys) and, when `spill_tails` allows, tails. Live absorbs
    /// are sized to fit (the packer caps a flight's sections, the absorber groups by
    /// operations), so this serves flights written before that cap, met again by recovery.
    async fn spill(
        &self,
        mut batch: AbsorbBatch,
        chain: &Compare,
        star: &str,
    ) -> Result<AbsorbBatch, CatalogError> {
        // Each spilled write holds only while the chain is still where the caller saw it (and
        // the streams' leadership where it was), so a writer that lost either meanwhile writes
        // nothing.
        let guards = batch.guards.clone();
        let guarded = |txn: Txn| {
            guards
                .iter()
                .fold(txn.compare(chain.clone()), |txn, (_, guard)| {
                    txn.compare(guard.clone())
                })
        };
        let limit = self.store.capabilities().max_txn_ops;
        // What never spills: the chain move, and the express checkpoint beside it.
        let moves = 1 + usize::from(batch.express.is_some());
        if moves + batch.tails.len() > limit {
            if !batch.spill_tails {
                return Err(CatalogError::Metastore(MetastoreError::TooLarge {
                    ops: moves + batch.tails.len(),
                    limit,
                }));
            }
            // Tails ahead first, then the entries below: each tail is the flight's own value.
            while moves + batch.tails.len() > limit {
                let n = (batch.tails.len() + moves - limit).min(limit);
                let txn = batch.tails.drain(..n).fold(Txn::new(), |txn, (id, tail)| {
                    txn.put(tail_key(id), encode_tail(&tail))
                });
                if self.store.commit(guarded(txn)).await? == TxnOutcome::Conflict {
                    return Err(self.why_conflict(star, chain, &guards).await);
                }
            }
        }
        let fixed = moves + batch.tails.len();
        while fixed + batch.entries.len() + batch.forget.len() > limit {
            let txn = if !batch.forget.is_empty() {
                let n = batch.forget.len().min(limit);
                batch
                    .forget
                    .drain(..n)
                    .fold(Txn::new(), |txn, id| txn.delete(tail_key(id)))
            } else {
                let over = fixed + batch.entries.len() - limit;
                let n = over.min(limit);
                batch.entries.drain(..n).fold(Txn::new(), |txn, entry| {
                    txn.put(
                        index_key(entry.stream_id, entry.end_seq),
                        encode_entry(&entry),
                    )
                })
            };
            if self.store.commit(guarded(txn)).await? == TxnOutcome::Conflict {
                return Err(self.why_conflict(star, chain, &guards).await);
            }
        }
        Ok(batch)
    }
}
