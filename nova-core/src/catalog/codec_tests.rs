//! Round trips of every catalog value codec over arbitrary values, as the flight formats have:
//! what a star writes, the next star (or a rebuilt catalog) reads back unchanged.

use proptest::prelude::*;

use super::audit::{decode_cursor, decode_garbage, decode_mark, encode_cursor, encode_garbage};
use super::retention::{decode_trim, encode_trim};
use super::*;

fn class() -> impl Strategy<Value = StorageClass> {
    prop_oneof![Just(StorageClass::Standard), Just(StorageClass::Express)]
}

fn garbage() -> impl Strategy<Value = Garbage> {
    prop_oneof![
        (".{0,40}", any::<u64>()).prop_map(|(key, bytes)| Garbage::Object { key, bytes }),
        (
            ".{0,20}",
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>()
        )
            .prop_map(|(star, epoch, a, b, bytes)| Garbage::ChainSlots {
                star,
                epoch,
                from: a.min(b),
                to: a.max(b),
                bytes,
            }),
        ".{0,40}".prop_map(|key| Garbage::Again { key }),
    ]
}

proptest! {
    #[test]
    fn stream_records_round_trip(
        id in any::<u64>(),
        name in ".{0,30}",
        created_at_ms in any::<u64>(),
        class in class(),
        age_ms in any::<Option<u64>>(),
        bytes in any::<Option<u64>>(),
    ) {
        let meta = StreamMeta {
            id,
            name: name.clone(),
            created_at_ms,
            class,
            retention: Retention { age_ms, bytes },
        };
        prop_assert_eq!(decode_meta(&name, &encode_meta(&meta)).unwrap(), meta);
    }

    #[test]
    fn tails_trims_and_cursors_round_trip(a in any::<u64>(), b in any::<u64>(), c in any::<u64>()) {
        let tail = StreamTail { tail_seq: a, stored_bytes: b };
        prop_assert_eq!(decode_tail(&encode_tail(&tail)).unwrap(), tail);
        let trim = Trim { first_seq: a, trimmed_bytes: b };
        prop_assert_eq!(decode_trim(&encode_trim(&trim)).unwrap(), trim);
        let cursor = SettleCursor { epoch: a, next_slot: b, last_due_ms: c };
        prop_assert_eq!(decode_cursor(&encode_cursor(&cursor)).unwrap(), cursor);
    }

    #[test]
    fn index_entries_round_trip(
        stream_id in any::<u64>(),
        start_seq in any::<u64>(),
        end_seq in any::<u64>(),
        object_key in ".{0,60}",
        offset in any::<u64>(),
        len in any::<u64>(),
        crc32c in any::<u32>(),
        created_at_ms in any::<u64>(),
    ) {
        let entry = IndexEntry {
            stream_id,
            start_seq,
            end_seq,
            object_key,
            offset,
            len,
            crc32c,
            created_at_ms,
        };
        let key = index_key(stream_id, end_seq);
        prop_assert_eq!(decode_entry(&key, &encode_entry(&entry)).unwrap(), entry);
    }

    /// The chain's checkpoint, the Express checkpoint and the collected mark share one codec.
    #[test]
    fn epochs_and_slots_round_trip(epoch in any::<u64>(), slot in any::<Option<u64>>()) {
        let chain = ChainState { epoch, checkpoint: slot };
        prop_assert_eq!(decode_chain(&encode_chain(&chain)).unwrap(), chain);
        let express = ExpressCheckpoint { epoch, through: slot };
        prop_assert_eq!(ExpressCheckpoint::decode(&express.encode()).unwrap(), express);
        let mark = decode_mark(&encode_epoch_slot(epoch, slot));
        match slot {
            Some(slot) => prop_assert_eq!(mark.unwrap(), (epoch, slot)),
            None => prop_assert!(mark.is_err(), "a mark names its slot"),
        }
    }

    #[test]
    fn queued_garbage_round_trips(due_ms in any::<u64>(), item in garbage()) {
        let key = audit::garbage_key(due_ms, &item);
        let queued = decode_garbage(&key, &encode_garbage(&item)).unwrap();
        prop_assert_eq!(queued.due_ms, due_ms);
        prop_assert_eq!(queued.item, item);
        prop_assert_eq!(queued.key, key);
    }
}
