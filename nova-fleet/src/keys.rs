//! The fleet's keys in the metastore, beside the catalog's, and the one value with a format of
//! its own: a star's registration.
//!
//! ```text
//! fleet/stars/{star id}        leased: advertise address, start time, load, Kafka address
//!                              (one line each)
//! fleet/leaders/{stream name}  the id of the star leading the stream
//! fleet/chains/{star id}       the star has a chain that may hold acknowledged records
//! fleet/takeover/{star id}     leased by the survivor taking that star's chain over
//! fleet/adopt/{star id}        leased by the star whose auditor looks after a departed chain
//! fleet/store                  the identity of the fleet's object store (`store_identity`)
//! ```
//!
//! These keys and the registration's lines are persisted: kept stable.

pub(crate) const STARS: &str = "fleet/stars/";
pub(crate) const LEADERS: &str = "fleet/leaders/";
pub(crate) const CHAINS: &str = "fleet/chains/";
pub(crate) const TAKEOVERS: &str = "fleet/takeover/";
pub(crate) const ADOPTIONS: &str = "fleet/adopt/";

pub(crate) fn star_key(id: &str) -> Vec<u8> {
    format!("{STARS}{id}").into_bytes()
}

/// The key of `stream`'s leader record.
pub fn leader_key(stream: &str) -> Vec<u8> {
    format!("{LEADERS}{stream}").into_bytes()
}

pub(crate) fn chain_key(id: &str) -> Vec<u8> {
    format!("{CHAINS}{id}").into_bytes()
}

pub(crate) fn takeover_key(id: &str) -> Vec<u8> {
    format!("{TAKEOVERS}{id}").into_bytes()
}

pub(crate) fn adopt_key(id: &str) -> Vec<u8> {
    format!("{ADOPTIONS}{id}").into_bytes()
}

/// The id a key under `prefix` names.
pub(crate) fn id_under(prefix: &str, key: &[u8]) -> String {
    String::from_utf8_lossy(key.get(prefix.len()..).unwrap_or_default()).into_owned()
}

/// The fleet's leader records, as recovery and takeover ask them (`nova_chain::Leaders`).
#[derive(Debug, Clone)]
pub struct LeaderRecords {
    metastore: std::sync::Arc<dyn nova_core::metastore::Metastore>,
}

impl LeaderRecords {
    pub fn new(metastore: std::sync::Arc<dyn nova_core::metastore::Metastore>) -> Self {
        Self { metastore }
    }
}

impl nova_chain::Leaders for LeaderRecords {
    fn leader<'a>(
        &'a self,
        stream: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<Option<String>, nova_core::metastore::MetastoreError>>
    {
        Box::pin(async move {
            Ok(self
                .metastore
                .get(&leader_key(stream))
                .await?
                .map(|kv| String::from_utf8_lossy(&kv.value).into_owned()))
        })
    }
}

/// What a star publishes about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: String,
    pub advertise: String,
    pub started_ms: u64,
    pub saturated: bool,
    pub draining: bool,
    pub streams_led: u64,
    /// Cannot take another stream up (`--max-streams`).
    pub full: bool,
    /// Registered and still recovering its chain: not serving yet, so nothing is placed here.
    pub starting: bool,
    /// HOST:PORT its Kafka listener is reached at (`--kafka-advertise-addr`); empty when it
    /// serves no Kafka clients.
    pub kafka: String,
}

impl Member {
    pub fn encode(&self) -> Vec<u8> {
        format!(
            "{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}",
            self.advertise,
            self.started_ms,
            u8::from(self.saturated),
            u8::from(self.draining),
            self.streams_led,
            u8::from(self.full),
            u8::from(self.starting),
            self.kafka
        )
        .into_bytes()
    }

    /// `None` for a value that is not a registration (the key is skipped, never trusted).
    pub fn decode(id: &str, value: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(value).ok()?;
        let mut lines = text.split('\n');
        Some(Self {
            id: id.to_owned(),
            advertise: lines.next()?.to_owned(),
            started_ms: lines.next()?.parse().ok()?,
            saturated: lines.next()? == "1",
            draining: lines.next()? == "1",
            streams_led: lines.next()?.parse().ok()?,
            // Added later: a registration without them is neither full nor starting.
            full: lines.next() == Some("1"),
            starting: lines.next() == Some("1"),
            // Added later still: a star registered without it serves no Kafka clients.
            kafka: lines.next().unwrap_or_default().to_owned(),
        })
    }

    /// Whether new leadership may be placed here.
    pub fn open(&self) -> bool {
        !self.saturated && !self.draining && !self.full && !self.starting
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_member_reads_back_as_written() {
        let member = Member {
            id: "a".into(),
            advertise: "http://127.0.0.1:7400".into(),
            started_ms: 17,
            saturated: true,
            draining: false,
            streams_led: 3,
            full: true,
            starting: false,
            kafka: "127.0.0.1:9092".into(),
        };
        assert_eq!(Member::decode("a", &member.encode()), Some(member));
        assert_eq!(Member::decode("a", b"garbage"), None);
        // A registration written before `full` and `starting` existed reads as neither.
        let older = Member::decode("a", b"http://x:1\n17\n0\n0\n3").unwrap();
        assert!(!older.full && !older.starting && older.open() && older.kafka.is_empty());
    }

    #[test]
    fn keys_name_their_ids() {
        assert_eq!(id_under(STARS, &star_key("star-1")), "star-1");
        assert_eq!(id_under(CHAINS, &chain_key("b")), "b");
        assert_eq!(leader_key("orders"), b"fleet/leaders/orders");
    }

    proptest! {
        /// Any registration a star can publish reads back the same (an advertise address is a
        /// URL: it never holds a line break).
        #[test]
        fn registrations_round_trip(
            advertise in "[a-z0-9:/.\\[\\]-]{0,40}",
            started_ms in any::<u64>(),
            saturated in any::<bool>(),
            draining in any::<bool>(),
            streams_led in any::<u64>(),
            full in any::<bool>(),
            starting in any::<bool>(),
            kafka in "[a-z0-9:.\\[\\]-]{0,40}",
        ) {
            let member = Member {
                id: "s".into(),
                advertise,
                started_ms,
                saturated,
                draining,
                streams_led,
                full,
                starting,
                kafka,
            };
            prop_assert_eq!(Member::decode("s", &member.encode()), Some(member));
        }

        /// Bytes that are not a registration never panic the decoder.
        #[test]
        fn garbage_never_panics(value in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Member::decode("s", &value);
        }
    }
}
