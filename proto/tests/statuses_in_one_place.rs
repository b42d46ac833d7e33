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

#[test]
fn no_server_builds_a_status_by_hand() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // Every crate's sources, the SDK and the router included: a client-side refusal reaches
    // the caller as a Status too. The table itself is the one place that builds them.
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&root).unwrap() {
        let src = entry.unwrap().path().join("src");
        if src.is_dir() {
            rust_files(&src, &mut files);
        }
    }
    let table = Path::new("proto").join("src").join("error.rs");
    files.retain(|f| !f.ends_with(&table));
    assert!(files.len() > 100, "found every crate's sources");
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
