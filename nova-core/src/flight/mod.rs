//! The flight object format: what a star writes at each slot of its chain.
//!
//! ```text
//! header   16 B   magic "NOVAFLT\0", u16 version, u16 kind, u32 crc32c of the first 12 bytes
//! sections        runs of one stream's records (at most 1 MiB each unless one record is
//!                 larger), framed as in `section`
//! footer          what the object holds and where (see `FlightFooter`)
//! trailer  24 B   u32 footer_len, u32 footer crc32c, u16 version, u16 kind, u32 reserved,
//!                 magic "NOVAEND\0"
//! ```
//!
//! A reader fetches the trailer and footer with one suffix GET, then any stream's records with
//! one ranged GET whose crc32c it checks against the footer. A fence (the marker a successor
//! writes to close a predecessor's chain) uses the same header and trailer with another kind.
//! Every integer is little-endian; the version and kind values are kept stable.

pub mod crc;
mod fetch;
mod layout;
mod marker;
pub mod page;
pub mod section;

pub use fetch::{FetchError, fetch_footer, fetch_section};
pub use marker::{SettleMarker, latest_settle_marker};

pub use layout::{
    FenceInfo, FlightFooter, FlightMeta, HEADER_LEN, ObjectFooter, SUGGESTED_TAIL_READ,
    SectionEntry, SectionInput, TRAILER_LEN, TailParse, assemble_flight, encode_fence,
    encode_flight_end, flight_header, parse_object, parse_tail, verify_section,
};

/// A flight object, or part of one, is not what it claims to be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("corrupt flight object: {0}")]
    Corrupt(String),
    #[error("unsupported flight format version {0}")]
    UnsupportedVersion(u16),
    #[error("checksum mismatch in {what}: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum {
        what: &'static str,
        stored: u32,
        computed: u32,
    },
}

impl FormatError {
    pub(crate) fn corrupt(what: impl Into<String>) -> Self {
        Self::Corrupt(what.into())
    }
}
