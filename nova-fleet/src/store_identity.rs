//! One fleet, one object store. Stars hand streams to one another and take a dead star's chain
//! over by reading what it wrote, so stars on separate stores (each on a local directory of
//! its own, say) form a fleet that looks healthy until the first handoff or takeover, and then
//! loses reads. Each store carries an identity object, `store-id`, created once with a random
//! value; the fleet records the identity of the store its first star used
//! (`fleet/store` in the metastore), and a star whose store says otherwise is refused at start.

use nova_core::entropy::Entropy;
use nova_core::metastore::{Compare, Metastore, Txn, TxnOutcome};
use nova_core::object_store::{CreateOutcome, GetRange, ObjectStore};

use crate::error::JoinError;

/// The identity object in the store.
const STORE_ID_KEY: &str = "store-id";
/// The fleet's store identity in the metastore.
const FLEET_STORE_KEY: &[u8] = b"fleet/store";

/// The identity of `store`, created if it has none.
async fn store_identity(store: &dyn ObjectStore) -> Result<String, JoinError> {
    let fresh = format!(
        "{:016x}{:016x}",
        Entropy::from_os().next_u64(),
        Entropy::from_os().next_u64()
    );
    let failed = |source: nova_core::object_store::StoreError| JoinError::Store {
        what: "reading the object store's identity (store-id)",
        source,
    };
    match store
        .put_if_absent(STORE_ID_KEY, fresh.clone().into_bytes().into())
        .await
        .map_err(failed)?
    {
        CreateOutcome::Created => Ok(fresh),
        CreateOutcome::AlreadyExists => {
            let got = store
                .get(STORE_ID_KEY, GetRange::All)
                .await
                .map_err(failed)?;
            Ok(String::from_utf8_lossy(&got.bytes).trim().to_owned())
        }
    }
}

/// Refuses a star whose object store is not the fleet's; the first star records its store as
/// the fleet's.
pub async fn check_shared_store(
    metastore: &dyn Metastore,
    store: &dyn ObjectStore,
    star_id: &str,
) -> Result<(), JoinError> {
    let mine = store_identity(store).await?;
    let record = format!("{mine}\n{star_id}\n{}", store.describe());
    let failed = |source| JoinError::Metastore {
        what: "reading the fleet's store identity",
        source,
    };
    loop {
        match metastore.get(FLEET_STORE_KEY).await.map_err(failed)? {
            Some(kv) => {
                let text = String::from_utf8_lossy(&kv.value).into_owned();
                let mut lines = text.lines();
                let fleets = lines.next().unwrap_or_default();
                if fleets == mine {
                    return Ok(());
                }
                return Err(JoinError::StoreDiffers {
                    mine: store.describe(),
                    first_star: lines.next().unwrap_or("?").to_owned(),
                    theirs: lines.next().unwrap_or("?").to_owned(),
                });
            }
            None => {
                let claim = Txn::new()
                    .compare(Compare::Missing(FLEET_STORE_KEY.to_vec()))
                    .put(FLEET_STORE_KEY.to_vec(), record.clone().into_bytes());
                // Another star recorded the fleet's store meanwhile: compare with it.
                if let TxnOutcome::Committed { .. } =
                    metastore.commit(claim).await.map_err(failed)?
                {
                    return Ok(());
                }
            }
        }
    }
}
