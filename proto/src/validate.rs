//! Turning wire requests into validated domain values. Every check here runs before anything is
//! charged, sequenced or written, so a refused request has applied nothing.

use crate::domain::Record;
use crate::error::RequestError;
use crate::v1;
use crate::wire::WireAppend;

/// The caps an append is checked against (the star's `--max-*` flags).
#[derive(Debug, Clone, Copy)]
pub struct AppendCaps {
    pub max_batch_bytes: u64,
    pub max_batch_records: u32,
    pub max_record_bytes: u64,
}

pub const MAX_STREAM_NAME_BYTES: usize = 512;

/// A stream name is 1 to 512 bytes of UTF-8 without control characters: names appear in logs,
/// metric labels and CLI output, where control characters would garble them.
pub fn validate_stream_name(name: &str) -> Result<(), RequestError> {
    let reason = if name.is_empty() {
        Some("is empty")
    } else if name.len() > MAX_STREAM_NAME_BYTES {
        Some("is longer than 512 bytes")
    } else if name.chars().any(char::is_control) {
        Some("contains control characters")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(RequestError::InvalidStreamName {
            name: name.chars().take(64).collect(),
            reason,
        }),
        None => Ok(()),
    }
}

/// An append request that passed every cap.
#[derive(Debug, Clone)]
pub struct ValidAppend {
    pub stream: String,
    pub records: Vec<Record>,
    pub match_seq_num: Option<u64>,
    /// Sum of the records' content bytes.
    pub content_bytes: u64,
    pub header_count: u64,
}

/// A batch's record count against the caps: at least one, at most `max_batch_records`.
pub fn check_record_count(records: u64, caps: &AppendCaps) -> Result<(), RequestError> {
    if records == 0 {
        return Err(RequestError::EmptyBatch);
    }
    if records > caps.max_batch_records as u64 {
        return Err(RequestError::TooManyRecords {
            records,
            cap: caps.max_batch_records,
        });
    }
    Ok(())
}

/// A batch's headers (at most as many as records may be) and content bytes against the caps.
pub fn check_batch_size(
    headers: u64,
    content_bytes: u64,
    caps: &AppendCaps,
) -> Result<(), RequestError> {
    if headers > caps.max_batch_records as u64 {
        return Err(RequestError::TooManyHeaders {
            headers,
            cap: caps.max_batch_records,
        });
    }
    if content_bytes > caps.max_batch_bytes {
        return Err(RequestError::BatchTooLarge {
            bytes: content_bytes,
            cap: caps.max_batch_bytes,
        });
    }
    Ok(())
}

/// Checks an append against the caps. Records without a timestamp get `now_ms`.
pub fn validate_append(
    request: v1::AppendRequest,
    caps: &AppendCaps,
    now_ms: u64,
) -> Result<ValidAppend, RequestError> {
    validate_stream_name(&request.stream)?;
    check_record_count(request.records.len() as u64, caps)?;
    let mut content_bytes = 0u64;
    let mut header_count = 0u64;
    for (index, record) in request.records.iter().enumerate() {
        let bytes = record.body.len() as u64
            + record
                .headers
                .iter()
                .map(|h| (h.name.len() + h.value.len()) as u64)
                .sum::<u64>();
        if bytes > caps.max_record_bytes {
            return Err(RequestError::RecordTooLarge {
                index: index as u64,
                bytes,
                cap: caps.max_record_bytes,
            });
        }
        content_bytes += bytes;
        header_count += record.headers.len() as u64;
    }
    check_batch_size(header_count, content_bytes, caps)?;
    let records = request
        .records
        .into_iter()
        .map(|r| r.into_domain(now_ms))
        .collect();
    Ok(ValidAppend {
        stream: request.stream,
        records,
        match_seq_num: request.match_seq_num,
        content_bytes,
        header_count,
    })
}

/// Checks an append as received (`WireAppend`) against the caps, without decoding its records.
/// Returns the stream name.
pub fn validate_wire<'a>(
    request: &'a WireAppend,
    caps: &AppendCaps,
) -> Result<&'a str, RequestError> {
    if let Some(problem) = request.problem() {
        return Err(RequestError::InvalidRequest(format!(
            "malformed append request: {problem}"
        )));
    }
    let stream = std::str::from_utf8(request.stream_bytes()).map_err(|_| {
        RequestError::InvalidStreamName {
            name: String::from_utf8_lossy(
                &request.stream_bytes()[..request.stream_bytes().len().min(64)],
            )
            .into_owned(),
            reason: "is not UTF-8",
        }
    })?;
    validate_stream_name(stream)?;
    check_record_count(request.record_count(), caps)?;
    // Headers are capped like records: each costs stored framing, and the cap keeps a batch's
    // encoded size within what its admission charge was sized for.
    if request.header_count() > caps.max_batch_records as u64 {
        return Err(RequestError::TooManyHeaders {
            headers: request.header_count(),
            cap: caps.max_batch_records,
        });
    }
    let (index, bytes) = request.largest_record();
    if bytes > caps.max_record_bytes {
        return Err(RequestError::RecordTooLarge {
            index,
            bytes,
            cap: caps.max_record_bytes,
        });
    }
    if request.content_bytes() > caps.max_batch_bytes {
        return Err(RequestError::BatchTooLarge {
            bytes: request.content_bytes(),
            cap: caps.max_batch_bytes,
        });
    }
    Ok(stream)
}

/// A read's effective caps: what the request asked for, within the server's caps; zero asks for
/// the server's.
pub fn read_caps(request: &v1::ReadRequest, max_records: u32, max_bytes: u64) -> (u32, u64) {
    let records = match request.max_records {
        0 => max_records,
        n => n.min(max_records),
    };
    let bytes = match request.max_bytes {
        0 => max_bytes,
        n => n.min(max_bytes),
    };
    (records, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    const CAPS: AppendCaps = AppendCaps {
        max_batch_bytes: 100,
        max_batch_records: 3,
        max_record_bytes: 40,
    };

    fn record(len: usize) -> v1::Record {
        v1::Record {
            body: Bytes::from(vec![b'x'; len]),
            headers: vec![],
            timestamp: None,
        }
    }

    fn request(records: Vec<v1::Record>) -> v1::AppendRequest {
        v1::AppendRequest {
            stream: "s".into(),
            records,
            match_seq_num: None,
        }
    }

    #[test]
    fn each_cap_is_enforced_and_named() {
        let err = validate_append(request(vec![]), &CAPS, 0).unwrap_err();
        assert!(matches!(err, RequestError::EmptyBatch));

        let err = validate_append(request(vec![record(1); 4]), &CAPS, 0).unwrap_err();
        assert!(err.to_string().contains("--max-batch-records=3"), "{err}");

        let err = validate_append(request(vec![record(41)]), &CAPS, 0).unwrap_err();
        assert!(err.to_string().contains("--max-record-bytes=40"), "{err}");

        let err = validate_append(request(vec![record(40), record(40), record(40)]), &CAPS, 0)
            .unwrap_err();
        assert!(err.to_string().contains("--max-batch-bytes=100"), "{err}");

        let mut with_header = record(30);
        with_header.headers.push(v1::Header {
            name: Bytes::from_static(b"0123456789"),
            value: Bytes::from_static(b"x"),
        });
        let err = validate_append(request(vec![with_header]), &CAPS, 0).unwrap_err();
        assert!(
            matches!(err, RequestError::RecordTooLarge { bytes: 41, .. }),
            "headers count"
        );
    }

    #[test]
    fn a_valid_batch_is_stamped_and_measured() {
        let mut stamped = record(5);
        stamped.timestamp = Some(7);
        let valid = validate_append(request(vec![record(10), stamped]), &CAPS, 99).unwrap();
        assert_eq!(valid.content_bytes, 15);
        assert_eq!(valid.records[0].timestamp, 99);
        assert_eq!(valid.records[1].timestamp, 7);
    }

    fn wire(records: Vec<v1::Record>) -> WireAppend {
        use prost::Message;
        WireAppend::parse(Bytes::from(request(records).encode_to_vec()))
    }

    /// The checks on the received bytes agree with the checks on a decoded request.
    #[test]
    fn wire_requests_meet_the_same_caps() {
        let cases = [
            vec![],
            vec![record(1); 4],
            vec![record(41)],
            vec![record(40), record(40), record(40)],
            vec![record(10), record(5)],
        ];
        for records in cases {
            let decoded = validate_append(request(records.clone()), &CAPS, 0).map(|_| ());
            let received = validate_wire(&wire(records), &CAPS).map(|_| ());
            assert_eq!(decoded, received);
        }
        let malformed = WireAppend::parse(Bytes::from_static(&[0x12, 0x05, 0x0a]));
        let err = validate_wire(&malformed, &CAPS).unwrap_err();
        assert!(
            err.to_string().contains("malformed append request"),
            "{err}"
        );
    }

    #[test]
    fn stream_names_are_checked() {
        assert!(validate_stream_name("orders-2026/eu").is_ok());
        assert!(validate_stream_name("").is_err());
        assert!(validate_stream_name("a\nb").is_err());
        assert!(validate_stream_name(&"x".repeat(513)).is_err());
    }
}
