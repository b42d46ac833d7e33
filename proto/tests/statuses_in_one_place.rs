//! Every failure a server answers with gets its gRPC code in one place, `RequestError::code`,
//! so one failure has one code on the star and on the gateway. This holds the servers' sources
//! to it: none of them builds a `Status` by hand.

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
    let mut files = Vec::new();
    for dir in [
        "novad/src",
        "novagateway/src",
        "nova-chain/src",
        "nova-core/src",
    ] {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(files.len() > 20, "found the servers' sources");
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
