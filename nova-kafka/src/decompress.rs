//! Decompressing a batch's records within a limit, and within the room the caller's charge
//! allows, as the bytes come out.
//!
//! A few kilobytes of gzip or zstd can inflate to gigabytes. The codecs' own one-call
//! decompressors (and kafka-protocol's) grow their output until the input ends; here output
//! grows `STEP` bytes at a time, and before each step the caller is asked for room (its
//! admission charge grows by as much, or the batch is refused). Output past `limit` (the
//! caps' worth of records) is refused as the step that crosses it is read, so nothing
//! larger than `limit + STEP` is ever held.

use std::io::Read;

use bytes::Bytes;

use crate::batch::Codec;

/// How much output is added, and asked room for, at a time.
pub const STEP: usize = 64 * 1024;

/// The largest zstd window accepted (2^23 bytes), asked room for before decoding.
const ZSTD_WINDOW_LOG: u32 = 23;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecompressError {
    #[error("the batch decompresses to more than {limit} bytes")]
    TooLarge { limit: u64 },
    /// The caller could not find room for more output (its budget is full): retriable.
    #[error("no room in the admission buffer for the decompressed batch")]
    NoRoom,
    #[error("the batch's {codec:?} data is corrupt: {detail}")]
    Corrupt { codec: Codec, detail: String },
}

/// The records of a batch compressed with `codec`, decompressed. `room(n)` is asked before
/// `n` more bytes of output are held, and must return false to stop.
pub fn decompress(
    codec: Codec,
    data: &Bytes,
    limit: u64,
    room: &mut impl FnMut(u64) -> bool,
) -> Result<Bytes, DecompressError> {
    let corrupt = |detail: String| DecompressError::Corrupt { codec, detail };
    match codec {
        Codec::None => Ok(data.clone()),
        Codec::Gzip => read_within(flate2::read::MultiGzDecoder::new(&data[..]), limit, room)
            .map_err(|e| e.or_corrupt(corrupt)),
        Codec::Zstd => {
            // The decoder's window is memory too: held to 8 MiB (what a producer's batch needs
            // by far), and asked room for first.
            if !room(1 << ZSTD_WINDOW_LOG) {
                return Err(DecompressError::NoRoom);
            }
            let mut reader = zstd::stream::read::Decoder::with_buffer(&data[..])
                .map_err(|e| corrupt(e.to_string()))?;
            reader
                .window_log_max(ZSTD_WINDOW_LOG)
                .map_err(|e| corrupt(e.to_string()))?;
            read_within(reader, limit, room).map_err(|e| e.or_corrupt(corrupt))
        }
        Codec::Lz4 => {
            let reader = lz4::Decoder::new(&data[..]).map_err(|e| corrupt(e.to_string()))?;
            read_within(reader, limit, room).map_err(|e| e.or_corrupt(corrupt))
        }
        Codec::Snappy => snappy(data, limit, room).map_err(|e| e.or_corrupt(corrupt)),
    }
}

/// A failure while reading, before it is known which codec to name.
enum ReadError {
    Limit(DecompressError),
    Io(String),
}

impl ReadError {
    fn or_corrupt(self, corrupt: impl FnOnce(String) -> DecompressError) -> DecompressError {
        match self {
            ReadError::Limit(error) => error,
            ReadError::Io(detail) => corrupt(detail),
        }
    }
}

fn read_within(
    mut reader: impl Read,
    limit: u64,
    room: &mut impl FnMut(u64) -> bool,
) -> Result<Bytes, ReadError> {
    let mut out: Vec<u8> = Vec::new();
    loop {
        if !room(STEP as u64) {
            return Err(ReadError::Limit(DecompressError::NoRoom));
        }
        let filled = out.len();
        // Exactly one step more: `resize` alone may double the buffer.
        out.reserve_exact(STEP);
        out.resize(filled + STEP, 0);
        let mut at = filled;
        while at < out.len() {
            match reader.read(&mut out[at..]) {
                Ok(0) => {
                    // Kept at its capacity (at most a step over): shrinking would copy it.
                    out.truncate(at);
                    return Ok(Bytes::from(out));
                }
                Ok(n) => at += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(ReadError::Io(e.to_string())),
            }
            if at as u64 > limit {
                return Err(ReadError::Limit(DecompressError::TooLarge { limit }));
            }
        }
    }
}

/// Kafka's snappy: the Java client's framing (a 16-byte magic header, then blocks each with a
/// 4-byte length), or a single raw block when the header is absent. Each block states its
/// decompressed length, which is checked before it is decoded.
fn snappy(
    data: &Bytes,
    limit: u64,
    room: &mut impl FnMut(u64) -> bool,
) -> Result<Bytes, ReadError> {
    const MAGIC: &[u8] = b"\x82SNAPPY\x00";
    const HEADER: usize = 16;
    let framed = data.starts_with(MAGIC) && data.len() >= HEADER;
    let mut rest: &[u8] = if framed { &data[HEADER..] } else { &data[..] };
    let mut total = 0u64;
    let mut out = Vec::new();
    // One block at a time, each checked before it is decoded; nothing is listed ahead.
    while !rest.is_empty() {
        let block = if framed {
            let Some((length, after)) = rest.split_first_chunk::<4>() else {
                return Err(ReadError::Io("a block length cut short".into()));
            };
            let length = u32::from_be_bytes(*length) as usize;
            if after.len() < length {
                return Err(ReadError::Io("a block cut short".into()));
            }
            rest = &after[length..];
            &after[..length]
        } else {
            std::mem::take(&mut rest)
        };
        let length = snap::raw::decompress_len(block).map_err(|e| ReadError::Io(e.to_string()))?;
        total += length as u64;
        if total > limit {
            return Err(ReadError::Limit(DecompressError::TooLarge { limit }));
        }
        if !room(length as u64) {
            return Err(ReadError::Limit(DecompressError::NoRoom));
        }
        let at = out.len();
        out.reserve_exact(length);
        out.resize(at + length, 0);
        snap::raw::Decoder::new()
            .decompress(block, &mut out[at..])
            .map_err(|e| ReadError::Io(e.to_string()))?;
    }
    Ok(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn all_codecs(plain: &[u8]) -> Vec<(Codec, Bytes)> {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(plain).unwrap();
        let gzip = gz.finish().unwrap();
        let zstd = zstd::bulk::compress(plain, 1).unwrap();
        let mut lz = lz4::EncoderBuilder::new().build(Vec::new()).unwrap();
        lz.write_all(plain).unwrap();
        let (lz4, result) = lz.finish();
        result.unwrap();
        // The Java client's framing, in two blocks.
        let mut snappy = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01".to_vec();
        for half in plain.chunks(plain.len().div_ceil(2).max(1)) {
            let block = snap::raw::Encoder::new().compress_vec(half).unwrap();
            snappy.extend_from_slice(&(block.len() as u32).to_be_bytes());
            snappy.extend_from_slice(&block);
        }
        let raw_snappy = snap::raw::Encoder::new().compress_vec(plain).unwrap();
        vec![
            (Codec::Gzip, gzip.into()),
            (Codec::Zstd, zstd.into()),
            (Codec::Lz4, lz4.into()),
            (Codec::Snappy, snappy.into()),
            (Codec::Snappy, raw_snappy.into()),
        ]
    }

    #[test]
    fn every_codec_decompresses_what_it_compressed() {
        let plain: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        for (codec, data) in all_codecs(&plain) {
            let out = decompress(codec, &data, 1 << 20, &mut |_| true).unwrap();
            assert_eq!(&out[..], &plain[..], "{codec:?}");
        }
    }

    #[test]
    fn a_bomb_is_refused_without_inflating_it() {
        // 64 MiB of zeros compress to a few kilobytes; the limit is 1 MiB.
        let plain = vec![0u8; 64 << 20];
        for (codec, data) in all_codecs(&plain) {
            assert!(data.len() < 4 << 20, "{codec:?} {}", data.len());
            let mut asked = 0u64;
            let refused = decompress(codec, &data, 1 << 20, &mut |n| {
                asked += n;
                true
            });
            assert_eq!(
                refused,
                Err(DecompressError::TooLarge { limit: 1 << 20 }),
                "{codec:?}"
            );
            // Snappy states its sizes up front and is refused before decoding; the others
            // stop within a step of the limit (zstd also asks for its window first).
            let window = if codec == Codec::Zstd {
                1 << ZSTD_WINDOW_LOG
            } else {
                0
            };
            assert!(
                asked <= (1 << 20) + STEP as u64 + window,
                "{codec:?} held {asked}"
            );
        }
    }

    #[test]
    fn no_room_stops_decompression() {
        let plain = vec![7u8; 1 << 20];
        for (codec, data) in all_codecs(&plain) {
            let mut left = 3 * STEP as u64;
            let refused = decompress(codec, &data, 8 << 20, &mut |n| {
                let ok = n <= left;
                left = left.saturating_sub(n);
                ok
            });
            assert_eq!(refused, Err(DecompressError::NoRoom), "{codec:?}");
        }
    }

    #[test]
    fn garbage_is_corrupt_not_a_panic() {
        let garbage =
            Bytes::from_static(b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01\xff\xff\xff\xff");
        for codec in [Codec::Gzip, Codec::Zstd, Codec::Lz4, Codec::Snappy] {
            for data in [
                garbage.clone(),
                Bytes::from_static(b"nonsense"),
                Bytes::new(),
            ] {
                match decompress(codec, &data, 1 << 20, &mut |_| true) {
                    Err(DecompressError::Corrupt { .. }) => {}
                    // An empty gzip stream is an empty output; Kafka would not send it.
                    Ok(out) if out.is_empty() => {}
                    other => panic!("{codec:?} {data:?}: {other:?}"),
                }
            }
        }
    }
}
