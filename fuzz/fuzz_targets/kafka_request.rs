//! A Kafka request as the listener decodes it (header, then the message at its version), for
//! every API key and version: malformed input is an error, never a panic or an allocation
//! sized by a count the bytes declare (libFuzzer's -rss_limit_mb catches those).
#![no_main]

use bytes::{Buf, Bytes};
use libfuzzer_sys::fuzz_target;
use nova_kafka::kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind};
use nova_kafka::kafka_protocol::protocol::Decodable;

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let mut frame = Bytes::copy_from_slice(data);
    let key = (&frame[..2]).get_i16();
    let version = (&frame[2..4]).get_i16();
    let Ok(api) = ApiKey::try_from(key) else {
        return;
    };
    let range = api.valid_versions();
    if version < range.min || version > range.max {
        return;
    }
    if RequestHeader::decode(&mut frame, api.request_header_version(version)).is_ok() {
        let _ = RequestKind::decode(api, &mut frame, version);
    }
});
