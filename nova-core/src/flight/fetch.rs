//! Reading flights back from an object store: the footer with a suffix GET, a section with one
//! ranged GET checked against its crc32c.

use bytes::Bytes;

use super::{FormatError, ObjectFooter, SUGGESTED_TAIL_READ, TailParse, parse_tail};
use crate::object_store::{GetRange, ObjectStore, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{key}: {source}")]
    Format { key: String, source: FormatError },
}

/// The footer of the object at `key`: one suffix GET, and a second when the footer is larger
/// than the first read.
pub async fn fetch_footer(store: &dyn ObjectStore, key: &str) -> Result<ObjectFooter, FetchError> {
    let tail = store
        .get(key, GetRange::Suffix(SUGGESTED_TAIL_READ))
        .await?;
    let format = |source| FetchError::Format {
        key: key.to_owned(),
        source,
    };
    match parse_tail(&tail.bytes, tail.object_size).map_err(format)? {
        TailParse::Footer(footer) => Ok(footer),
        TailParse::NeedFrom(from) => {
            let rest = store
                .get(key, GetRange::Bounded(from..tail.object_size))
                .await?;
            match parse_tail(&rest.bytes, tail.object_size).map_err(format)? {
                TailParse::Footer(footer) => Ok(footer),
                TailParse::NeedFrom(_) => Err(format(FormatError::Corrupt(
                    "footer not found where the trailer says".into(),
                ))),
            }
        }
    }
}

/// One section, fetched with a ranged GET and checked: the length and crc32c must match what
/// the index or footer recorded, or the bytes are refused.
pub async fn fetch_section(
    store: &dyn ObjectStore,
    key: &str,
    offset: u64,
    len: u64,
    crc32c: u32,
) -> Result<Bytes, FetchError> {
    let format = |source| FetchError::Format {
        key: key.to_owned(),
        source,
    };
    if len == 0 {
        return Ok(Bytes::new());
    }
    let got = store
        .get(key, GetRange::Bounded(offset..offset + len))
        .await?;
    if got.bytes.len() as u64 != len {
        return Err(format(FormatError::Corrupt(format!(
            "section at {offset} should be {len} bytes, the store returned {}",
            got.bytes.len()
        ))));
    }
    let computed = crate::flight::crc::crc32c(&got.bytes);
    if computed != crc32c {
        return Err(format(FormatError::Checksum {
            what: "section",
            stored: crc32c,
            computed,
        }));
    }
    Ok(got.bytes)
}
