//! Adoption: a star that left (taken over, or gone cleanly) may never come back, yet its chain
//! can still hold absorbed flights its auditor had not settled, and its settled objects can
//! still need sweeping. One star with an auditor adopts it, elected by creating the adopt key:
//! its auditor settles that chain's leftovers into objects of its own and sweeps the departed
//! star's prefix (`nova_auditor::Adoptions`). The adoption ends when the star rejoins, and
//! passes to another star when the adopter's lease lapses.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use nova_chain::Star;
use nova_core::metastore::{Compare, KeyValue, Txn, TxnOutcome};

use crate::Fleet;
use crate::error::TakeoverError;
use crate::keys::{ADOPTIONS, adopt_key, chain_key, star_key};
use crate::takeover::MAX_CHAINS_SCANNED;

/// Departed stars' chains one star adopts at most (each costs its auditor two metastore reads
/// per idle turn once settled); past it the others are left to other stars.
const MAX_ADOPTED: usize = 16;

impl Fleet {
    /// Elects this star to adopt departed stars' chains (in the catalog, with no live star and
    /// nothing left to take over), up to `MAX_ADOPTED`, releases the adoptions of stars that
    /// rejoined, and hands the auditor the result.
    pub(crate) async fn adopt_departed(
        &self,
        star: &Star,
        adoptions: &nova_auditor::Adoptions,
        registered: &[KeyValue],
    ) -> Result<(), TakeoverError> {
        let chains = star
            .streams()
            .catalog()
            .chain_stars(MAX_CHAINS_SCANNED)
            .await?;
        let pending: HashSet<&[u8]> = registered.iter().map(|kv| kv.key.as_slice()).collect();
        let held: BTreeMap<Vec<u8>, KeyValue> = self
            .metastore
            .scan(ADOPTIONS.as_bytes(), None, MAX_CHAINS_SCANNED)
            .await?
            .into_iter()
            .map(|kv| (kv.key.clone(), kv))
            .collect();
        let me = self.config.star_id.as_bytes();
        let live: HashSet<String> = self.members.read().keys().cloned().collect();
        let departed = |id: &str| {
            id != self.config.star_id
                && !live.contains(id)
                && !pending.contains(chain_key(id).as_slice())
        };
        // Adoptions held already come first, so a new election never pushes one out.
        let mut mine = Vec::new();
        let mut released = Vec::new();
        for id in &chains {
            if let Some(kv) = held.get(&adopt_key(id))
                && kv.value == me
            {
                if departed(id) && mine.len() < MAX_ADOPTED {
                    mine.push(id.clone());
                } else {
                    // It rejoined (its registration recorded its chain), has a chain to take
                    // over first, or is past this star's share: let it go.
                    released.push((id.clone(), kv.version));
                }
            }
        }
        for id in chains {
            if self.lost.is_cancelled() || mine.len() >= MAX_ADOPTED {
                break;
            }
            let key = adopt_key(&id);
            if held.contains_key(&key) || !departed(&id) {
                continue;
            }
            let elect = Txn::new()
                .compare(Compare::Missing(star_key(&id)))
                .compare(Compare::Missing(chain_key(&id)))
                .compare(Compare::Missing(key.clone()))
                .put_leased(key, me.to_vec(), self.lease);
            if let TxnOutcome::Committed { .. } = self.metastore.commit(elect).await? {
                tracing::info!(star = %id, "adopted the chain of a departed star");
                mine.push(id);
            }
        }
        // The auditor stops starting jobs on released stars first; the key goes once the jobs
        // already running on them are done, so a rejoining star (which waits for the key) never
        // has its chain settled by two auditors at once.
        // Dropping a star from the set cuts its running job off (jobs are safe to cut anywhere),
        // so the wait is short.
        adoptions.set(mine);
        for (id, version) in released {
            adoptions
                .wait_idle(&id, &self.clock, Duration::from_millis(50))
                .await;
            let release = Txn::new()
                .compare(Compare::Version(adopt_key(&id), version))
                .delete(adopt_key(&id));
            self.metastore.commit(release).await?;
            tracing::info!(star = %id, "released the adopted chain of a star");
        }
        Ok(())
    }
}
