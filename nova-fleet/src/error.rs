//! What the fleet's own jobs fail with. A client's request that the fleet routes fails with a
//! `RequestError` instead (a redirect, an unavailable metastore, the fleet's capacity): that is
//! what the client is told.

use nova_core::catalog::CatalogError;
use nova_core::metastore::MetastoreError;

/// Why a star could not join the fleet.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error(
        "a fleet needs a shared metastore with leases (--metastore etcd://…); {metastore} has none"
    )]
    NoLeases { metastore: String },
    #[error("{what}: {source}")]
    Metastore {
        what: &'static str,
        source: MetastoreError,
    },
    #[error(
        "another live star is registered with --star-id {star_id:?} (at {holder}) and keeps its \
         lease alive: give each star its own --star-id"
    )]
    DuplicateId { star_id: String, holder: String },
    #[error("this star's fleet lease expired while it {while_doing}")]
    LeaseExpired { while_doing: &'static str },
    #[error("{what}: {source}")]
    Store {
        what: &'static str,
        source: nova_core::object_store::StoreError,
    },
    #[error(
        "this star's object store ({mine}) is not the fleet's: star {first_star:?} joined the \
         fleet on {theirs}. The stars of a fleet read one another's chains and objects, so \
         they must share one bucket: give every star the same --s3-bucket (and --s3-prefix) \
         and --s3-endpoint (a local --data-dir store is one star's alone)"
    )]
    StoreDiffers {
        mine: String,
        first_star: String,
        theirs: String,
    },
    #[error(
        "star {other:?} already advertises {advertise}: redirects meant for this star would \
         reach it. Give each star the address clients reach it at (--advertise-addr, or \
         --listen when it is reachable as given)"
    )]
    AdvertiseTaken { other: String, advertise: String },
}

/// Why a stream could not be handed to another star. The stream stays led here (taking
/// appends again) unless the error says it moved.
#[derive(Debug, thiserror::Error)]
pub enum HandoffError {
    #[error("no other star is open to leadership")]
    NoTarget,
    #[error("this star no longer leads {0:?}")]
    NotLed(String),
    #[error("stream {0:?} is not here")]
    NotHere(String),
    #[error("readying the stream for its next leader: {0}")]
    Release(String),
    #[error("moving the leader record of {stream:?} failed: {source}")]
    Move {
        stream: String,
        source: MetastoreError,
    },
    #[error("the leader record of {0:?} moved while this star handed it off")]
    Moved(String),
    #[error("this star's lease was lost while it handed {0:?} off")]
    LeaseLost(String),
    #[error("reading the leader record: {0}")]
    Metastore(#[from] MetastoreError),
}

/// Why settling a departed star's chain, or adopting one, failed. Each is tried again in a
/// later round.
#[derive(Debug, thiserror::Error)]
pub enum TakeoverError {
    #[error("settling the chain: {0}")]
    Settle(#[from] nova_chain::StartError),
    #[error(transparent)]
    Metastore(#[from] MetastoreError),
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error("lost the election for {0:?} before clearing its chain")]
    LostElection(String),
    #[error("this star's lease was lost")]
    LeaseLost,
}
