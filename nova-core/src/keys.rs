//! Where things live in the object store.
//!
//! ```text
//! chain/{star}/{epoch:010}/{slot:020}     one flight (or a fence) per slot
//! streams/{star}/{id:020}                 a stream's manifest (name, settings, deleted)
//! probe/{star}/{nonce}                    a start-up probe, deleted right after
//! ```
//!
//! Numbers are zero-padded so that byte order, which listing uses, is numeric order.

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

/// The prefix holding every epoch of a star's chain.
pub fn chain_root(star: &str) -> String {
    format!("chain/{star}/")
}

/// The prefix holding every slot of one epoch of a star's chain.
pub fn chain_prefix(star: &str, epoch: u64) -> String {
    format!("{}{epoch:010}/", chain_root(star))
}

pub fn slot_key(star: &str, epoch: u64, slot: u64) -> String {
    format!("{}{slot:020}", chain_prefix(star, epoch))
}

/// The slot number out of a key under `chain_prefix`, or `None` for a key that is not a slot.
pub fn parse_slot(prefix: &str, key: &str) -> Option<u64> {
    let rest = key.strip_prefix(prefix)?;
    if rest.len() != 20 || !rest.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    rest.parse().ok()
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
    }
}
