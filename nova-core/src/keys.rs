//! Where things live in the object store.
//!
//! ```text
//! chain/{star}/{epoch:010}/{slot:020}     one flight (or a fence) per slot
//! chain/{star}/{epoch:010}/settled-{slot:020}   the auditor settled the epoch to this slot
//! data/{star}/{id:020}/{start:020}-{end:020}-{nonce:016x}   records start..end of one stream
//! streams/{star}/{id:020}                 a stream's manifest (name, settings, deleted)
//! probe/{star}/{nonce}                    a start-up probe, deleted right after
//! clock/{star}                            the auditor's clock probe: the store's time
//! store-id                                the store's identity, which a fleet's stars share
//! ```
//!
//! Numbers are zero-padded so that byte order, which listing uses, is numeric order.

/// The one object the auditor of `star` rewrites to read the object store's clock (its
/// Last-Modified): retention by age trims only what both the star's clock and the store's call
/// old.
pub fn clock_probe_key(star: &str) -> String {
    format!("clock/{star}")
}

/// Where the manifests of the streams a star's catalog holds live. Stream ids are handed out
/// by each catalog, so two stars sharing a bucket keep their manifests apart by star.
pub fn streams_prefix(star: &str) -> String {
    format!("streams/{star}/")
}

pub fn stream_manifest_key(star: &str, id: u64) -> String {
    format!("{}{id:020}", streams_prefix(star))
}

/// The stream id out of a manifest key under `streams_prefix(star)`.
pub fn parse_stream_manifest(prefix: &str, key: &str) -> Option<u64> {
    let rest = key.strip_prefix(prefix)?;
    if rest.len() != 20 || !rest.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    rest.parse().ok()
}

/// Where a star's streams' trim markers live:
/// `trims/{star}/{stream id}/{first seq after}-{committed first seq}`. A marker is written just
/// before a trim's transaction: it says the trim point was `committed` (the previous trim's,
/// known to have committed) and is about to move to `after`. So the bucket alone says where
/// each stream surely starts (the highest `committed`), and how far its sequence numbers surely
/// went (the highest `after`: those records existed), whatever became of the last trim.
pub fn trims_root(star: &str) -> String {
    format!("trims/{star}/")
}

pub fn trim_marker_prefix(star: &str, stream_id: u64) -> String {
    format!("{}{stream_id:020}/", trims_root(star))
}

pub fn trim_marker_key(star: &str, stream_id: u64, marker: TrimMarker) -> String {
    format!(
        "{}{:020}-{:020}",
        trim_marker_prefix(star, stream_id),
        marker.after,
        marker.committed
    )
}

/// What a trim marker says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrimMarker {
    /// Where the trim it was written for moves the trim point (if it commits).
    pub after: u64,
    /// The trim point before it, which had committed.
    pub committed: u64,
}

/// The stream id and marker out of a key under `trims_root(star)`.
pub fn parse_trim_marker(root: &str, key: &str) -> Option<(u64, TrimMarker)> {
    let (id, rest) = key.strip_prefix(root)?.split_once('/')?;
    let (after, committed) = rest.split_once('-')?;
    let digits = |s: &str| s.len() == 20 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(id) || !digits(after) || !digits(committed) {
        return None;
    }
    let marker = TrimMarker {
        after: after.parse().ok()?,
        committed: committed.parse().ok()?,
    };
    (marker.committed <= marker.after).then_some((id.parse().ok()?, marker))
}

/// The prefix holding every epoch of a star's chain.
pub fn chain_root(star: &str) -> String {
    format!("chain/{star}/")
}

/// The prefix holding every slot of one epoch of a star's chain.
pub fn chain_prefix(star: &str, epoch: u64) -> String {
    epoch_prefix(&chain_root(star), epoch)
}

pub fn slot_key(star: &str, epoch: u64, slot: u64) -> String {
    slot_under(&chain_prefix(star, epoch), slot)
}

/// One epoch's prefix under a chain's root: `parse_epoch` reads it back.
fn epoch_prefix(root: &str, epoch: u64) -> String {
    format!("{root}{epoch:010}/")
}

/// One slot's key under an epoch's prefix: `parse_slot` reads it back.
fn slot_under(prefix: &str, slot: u64) -> String {
    format!("{prefix}{slot:020}")
}

/// The prefix holding every epoch of a star's express chain, in each zone bucket.
pub fn express_root(star: &str) -> String {
    format!("express/{star}/")
}

/// The prefix of one epoch of a star's express chain; `parse_slot` reads its slots back.
pub fn express_prefix(star: &str, epoch: u64) -> String {
    epoch_prefix(&express_root(star), epoch)
}

/// The prefix, in the regional bucket, of the copies of how far a star's express chain has
/// been carried: what a rebuild of the catalog restores the express checkpoint from. Zone
/// copies are collected only behind it.
pub fn express_checkpoint_prefix(star: &str) -> String {
    format!("express-checkpoint/{star}/")
}

/// An express bundle's slot, the same key in every zone bucket.
pub fn express_slot_key(star: &str, epoch: u64, slot: u64) -> String {
    slot_under(&express_prefix(star, epoch), slot)
}

/// The epoch out of any key under `chain_root(star)` (a slot, a fence, a settle marker).
pub fn parse_epoch(root: &str, key: &str) -> Option<u64> {
    let epoch = key.strip_prefix(root)?.split('/').next()?;
    if epoch.len() != 10 || !epoch.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    epoch.parse().ok()
}

/// The slot number out of a key under `chain_prefix`, or `None` for a key that is not a slot.
pub fn parse_slot(prefix: &str, key: &str) -> Option<u64> {
    let rest = key.strip_prefix(prefix)?;
    if rest.len() != 20 || !rest.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    rest.parse().ok()
}

/// The prefix of an epoch's settle markers. Not slot keys (`parse_slot` skips them), so they
/// live beside the slots they describe.
pub fn settle_marker_prefix(star: &str, epoch: u64) -> String {
    format!("{}settled-", chain_prefix(star, epoch))
}

/// The marker saying slots up to `through` of `epoch` are settled. Each value has its own key,
/// so a marker written late (a slow PUT, a paused process) can only add a lower one: the
/// highest present is the truth.
pub fn settle_marker_key(star: &str, epoch: u64, through: u64) -> String {
    format!("{}{through:020}", settle_marker_prefix(star, epoch))
}

/// The slot a settle marker key names, under `settle_marker_prefix`.
pub fn parse_settle_marker(prefix: &str, key: &str) -> Option<u64> {
    let rest = key.strip_prefix(prefix)?;
    if rest.len() != 20 || !rest.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    rest.parse().ok()
}

/// The prefix of every settled object of a star's streams.
pub fn data_root(star: &str) -> String {
    format!("data/{star}/")
}

/// The prefix of one stream's settled objects.
pub fn data_prefix(star: &str, stream_id: u64) -> String {
    format!("{}{stream_id:020}/", data_root(star))
}

/// A settled object holding records `start..end` of one stream. Every write gets a fresh
/// `nonce`, so a key is written once and never reused: a settle redone after a crash writes a
/// new object instead of one an older attempt's garbage record still names, and caches keyed by
/// object never go stale. The one index entry that may reference it is the stream's entry
/// ending at `end`.
pub fn data_key(star: &str, stream_id: u64, start: u64, end: u64, nonce: u64) -> String {
    format!(
        "{}{start:020}-{end:020}-{nonce:016x}",
        data_prefix(star, stream_id)
    )
}

/// The suffix of an object the rewrite made by merging settled ones: it is never merged again,
/// which bounds what the rewrite writes to once per record.
const REWRITTEN: &str = "r";

/// A data object the rewrite made from settled objects: like `data_key`, marked as rewritten.
pub fn rewritten_key(star: &str, stream_id: u64, start: u64, end: u64, nonce: u64) -> String {
    format!(
        "{}-{REWRITTEN}",
        data_key(star, stream_id, start, end, nonce)
    )
}

/// A data object's star, from its key under `data/` (star ids hold no `/`).
pub fn data_key_star(key: &str) -> Option<&str> {
    key.strip_prefix("data/")?
        .split_once('/')
        .map(|(star, _)| star)
}

/// Whether `key` names an object that holds records, and so one a read may name: a data object,
/// or a flight's slot in a star's chain (`chain/{star}/{epoch}/{slot}`; not a settle marker).
/// What a gateway serves its peers is held to these, so a peer fetch cannot read manifests,
/// markers or anything else under the store's prefix.
pub fn is_record_object(key: &str) -> bool {
    if parse_any_data_key(key).is_some() {
        return true;
    }
    let Some(rest) = key.strip_prefix("chain/") else {
        return false;
    };
    let Some((star, _)) = rest.split_once('/') else {
        return false;
    };
    let root = chain_root(star);
    parse_epoch(&root, key)
        .is_some_and(|epoch| parse_slot(&chain_prefix(star, epoch), key).is_some())
}

/// A data object's stream and record range, whichever star's prefix holds it.
pub fn parse_any_data_key(key: &str) -> Option<DataKey> {
    parse_data_key(&data_root(data_key_star(key)?), key)
}

/// A data object's stream and record range, from a key under `data_root(star)`.
pub fn parse_data_key(root: &str, key: &str) -> Option<DataKey> {
    let rest = key.strip_prefix(root)?;
    let (id, range) = rest.split_once('/')?;
    let mut parts = range.split('-');
    let (start, end, nonce) = (parts.next()?, parts.next()?, parts.next()?);
    let rewritten = match parts.next() {
        None => false,
        Some(REWRITTEN) => true,
        Some(_) => return None,
    };
    let digits = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit());
    let hex = nonce.len() == 16 && nonce.bytes().all(|b| b.is_ascii_hexdigit());
    if parts.next().is_some() || !digits(id, 20) || !digits(start, 20) || !digits(end, 20) || !hex {
        return None;
    }
    let parsed = DataKey {
        stream_id: id.parse().ok()?,
        start: start.parse().ok()?,
        end: end.parse().ok()?,
        rewritten,
    };
    (parsed.start < parsed.end).then_some(parsed)
}

/// What a settled object's key says it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataKey {
    pub stream_id: u64,
    pub start: u64,
    pub end: u64,
    /// Made by the rewrite (`rewritten_key`), not by the settle.
    pub rewritten: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_keys_sort_numerically_and_parse_back() {
        let a = slot_key("s", 1, 9);
        let b = slot_key("s", 1, 10);
        assert!(a < b);
        assert_eq!(parse_slot(&chain_prefix("s", 1), &b), Some(10));
        assert_eq!(
            parse_slot(&chain_prefix("s", 1), "chain/s/0000000001/junk"),
            None
        );
        assert_eq!(parse_slot(&chain_prefix("s", 2), &b), None);
        assert_eq!(parse_epoch(&chain_root("s"), &b), Some(1));
        assert_eq!(parse_epoch(&chain_root("s"), "chain/s/x/1"), None);
        assert_eq!(
            parse_slot(&chain_prefix("s", 1), &settle_marker_key("s", 1, 7)),
            None
        );
        assert_eq!(
            parse_settle_marker(&settle_marker_prefix("s", 1), &settle_marker_key("s", 1, 7)),
            Some(7)
        );
    }

    #[test]
    fn trim_markers_sort_by_stream_then_seq_and_parse_back() {
        let m = |after, committed| TrimMarker { after, committed };
        let a = trim_marker_key("s", 7, m(9, 0));
        let b = trim_marker_key("s", 7, m(10, 9));
        let c = trim_marker_key("s", 8, m(0, 0));
        assert!(a < b && b < c);
        assert_eq!(parse_trim_marker(&trims_root("s"), &b), Some((7, m(10, 9))));
        assert_eq!(
            parse_trim_marker(&trims_root("s"), &trim_marker_key("s", 7, m(3, 4))),
            None
        );
        assert_eq!(parse_trim_marker(&trims_root("s"), "trims/s/junk"), None);
        assert!(b.starts_with(&trim_marker_prefix("s", 7)));
    }

    #[test]
    fn data_keys_sort_by_stream_then_start_and_parse_back() {
        let a = data_key("s", 7, 10, 20, u64::MAX);
        let b = data_key("s", 7, 10, 300, 0);
        let c = data_key("s", 7, 20, 30, 1);
        let d = data_key("s", 8, 0, 5, 2);
        assert!(a < b && b < c && c < d);
        let root = data_root("s");
        assert_eq!(
            parse_data_key(&root, &b),
            Some(DataKey {
                stream_id: 7,
                start: 10,
                end: 300,
                rewritten: false,
            })
        );
        assert_eq!(parse_data_key(&root, "data/s/junk"), None);
        assert_eq!(parse_data_key(&data_root("t"), &a), None);
        assert_eq!(
            parse_slot(&express_prefix("s", 3), &express_slot_key("s", 3, 42)),
            Some(42)
        );
        assert_eq!(
            parse_epoch(&express_root("s"), &express_slot_key("s", 3, 42)),
            Some(3)
        );
        assert_eq!(
            parse_slot(&express_prefix("s", 3), &slot_key("s", 3, 42)),
            None
        );
        assert_eq!(data_key_star(&a), Some("s"));
        assert_eq!(parse_any_data_key(&a), parse_data_key(&root, &a));
        assert!(parse_any_data_key(&a).is_some());
        assert_eq!(parse_any_data_key("chain/s/1/2"), None);
        assert_eq!(parse_any_data_key("data/s"), None);
        assert_eq!(parse_data_key(&root, &data_key("s", 7, 5, 5, 0)), None);
        assert_eq!(parse_data_key(&root, &format!("{a}-0")), None);
        assert_eq!(parse_data_key(&root, &format!("{a}-r-r")), None);
        let merged = rewritten_key("s", 7, 10, 300, 3);
        assert!(b < merged && merged < c);
        assert_eq!(
            parse_data_key(&root, &merged),
            Some(DataKey {
                stream_id: 7,
                start: 10,
                end: 300,
                rewritten: true,
            })
        );
    }

    #[test]
    fn record_objects_are_data_objects_and_chain_slots() {
        assert!(is_record_object(&data_key("s1", 7, 0, 10, 3)));
        assert!(is_record_object(&slot_key("s1", 2, 5)));
        assert!(is_record_object(&rewritten_key("s1", 7, 0, 10, 3)));
        assert!(!is_record_object(&settle_marker_key("s1", 2, 5)));
        assert!(!is_record_object(&stream_manifest_key("s1", 7)));
        assert!(!is_record_object("chain/s1/0000000002/../../streams/x"));
        assert!(!is_record_object("other-app/secrets.txt"));
    }
}
