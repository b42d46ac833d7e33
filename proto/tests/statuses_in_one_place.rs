//! Every failure a server answers with gets its gRPC code in one place, `RequestError::code`,
//! so one failure has one code on the star, on the gateway and in the SDK. This holds every
//! crate's sources to it: none of them builds a `Status` by hand.

use std::path::{Path, PathBuf};

const CONSTRUCTORS: &[&str] = &[
    "Status::new(",
    "Status::with_details(",
    "Status::invalid_argument(",
    "Status::unavailable(",
    "Status::internal(",
    "Status::not_found(",
    "Status::already_exists(",
    "Status::resource_exhausted(",
    "Status::failed_precondition(",
    "Status::out_of_range(",
    "Status::data_loss(",
    "Status::unknown(",
    "Status::aborted(",
    "Status::permission_denied(",
    "Status::unauthenticated(",
    "Status::deadline_exceeded(",
    "Status::cancelled(",
    "Status::unimplemented(",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every crate's sources (not its tests), the SDK and the router included: a client-side
/// refusal reaches the caller as a Status too.
fn every_crates_sources() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&root).unwrap() {
        let src = entry.unwrap().path().join("src");
        if src.is_dir() {
            rust_files(&src, &mut files);
        }
    }
    assert!(files.len() > 100, "found every crate's sources");
    files
}

#[test]
fn no_server_builds_a_status_by_hand() {
    // The table itself is the one place that builds them.
    let mut files = every_crates_sources();
    let table = Path::new("proto").join("src").join("error.rs");
    files.retain(|f| !f.ends_with(&table));
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            if CONSTRUCTORS.iter().any(|c| line.contains(c)) {
                found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "build the Status from a RequestError instead:\n{}",
        found.join("\n")
    );
}

/// Where a plain `RequestError::Unavailable` may be written, and how many times: the table and
/// the conversions from the storage layers' errors, and the refusals Nova makes of its own (no
/// error below them to convert). A failure that comes from a store, metastore, catalog or fetch
/// error goes through its `From` conversion instead, so it gets the same code on every path.
const UNAVAILABLE_ALLOWED: &[(&str, usize, &str)] = &[
    (
        "proto/src/error.rs",
        5,
        "the table: the code, the retry hint, the context it keeps",
    ),
    (
        "nova-core/src/request_error.rs",
        7,
        "the conversions and the shared refusals",
    ),
    (
        "nova-chain/src/star.rs",
        2,
        "a stream mid-handoff or whose class change failed",
    ),
    (
        "nova-chain/src/stream_state.rs",
        2,
        "the stream was deposed, or a delete of it is in doubt",
    ),
    (
        "nova-chain/src/streams.rs",
        1,
        "creates of one name that kept colliding",
    ),
    (
        "nova-chain/src/packer.rs",
        1,
        "the star shut down before the append was durable",
    ),
    (
        "nova-chain/src/resolver.rs",
        1,
        "the star took the stream up again since admission",
    ),
    (
        "nova-chain/src/express/lane.rs",
        1,
        "Express refused with no sealing to wait for",
    ),
    (
        "nova-fleet/src/placement.rs",
        4,
        "left the fleet, lease unrenewed, mid-handoff, moving",
    ),
    (
        "nova-fleet/src/leadership.rs",
        2,
        "a stream this star cannot take up (it is full, or its record is held) is placed again",
    ),
    (
        "novad/src/service/append.rs",
        2,
        "the star stopped or is shutting down",
    ),
    (
        "novad/src/service/charge.rs",
        1,
        "a charged message that did not arrive in time",
    ),
    (
        "nova-kafka/src/errors.rs",
        2,
        "the mapping of refusals onto Kafka's error codes (a pattern), and its test",
    ),
    (
        "novad/src/kafka/idempotence.rs",
        4,
        "an idempotent producer's batches could not be read back or were forgotten while read, \
         its batch was not submitted, or every producer state has a batch in flight",
    ),
    (
        "nova-server/src/net/small.rs",
        1,
        "a request message that did not arrive in time",
    ),
    (
        "novagateway/src/health.rs",
        1,
        "the star did not answer the gateway's probe in time",
    ),
    (
        "nova-sim/src/run/clients.rs",
        1,
        "a pattern the simulation's oracle matches, not built",
    ),
];

#[test]
fn unavailable_is_written_only_where_listed() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = Vec::new();
    for file in every_crates_sources() {
        let text = std::fs::read_to_string(&file).unwrap();
        let count = text.matches("RequestError::Unavailable(").count();
        if count > 0 {
            let relative = file
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            found.push((relative, count));
        }
    }
    found.sort();
    let mut allowed: Vec<(String, usize)> = UNAVAILABLE_ALLOWED
        .iter()
        .map(|(file, count, _)| ((*file).to_owned(), *count))
        .collect();
    allowed.sort();
    assert_eq!(
        found, allowed,
        "a failure with an error below it takes its code from the error's From conversion \
         (nova-core's request_error.rs); a new refusal of Nova's own is listed here with why"
    );
}
