//! Scoped bearer tokens. A server started with `--auth-tokens FILE` serves a call only with a
//! token the file lists, and only for what the token's grants allow: a scope (`append`, `read`
//! or `admin`) on the streams whose names start with a prefix. The file holds each token's
//! SHA-256, never the token, so reading it gives nobody a token; it is read again on SIGHUP and
//! whenever it changes.
//!
//! ```text
//! # name      grants                          token's SHA-256 (`nova token new` prints a line)
//! ingest      append:logs/,read:logs/         sha256:9f86d081884c7d659a2feaa0c55ad015…
//! ops         admin:,append:,read:            sha256:…
//! ```
//!
//! A presented token is hashed and compared with every entry in constant time. Tokens are never
//! logged, nor put in errors or metrics: a refusal names the token's name and the scope it
//! lacks, or says no known token was given.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::RwLock;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio_util::sync::CancellationToken;

use nova_proto::RequestError;

/// How often the file is looked at for changes (its modification time only).
const WATCH_EVERY: Duration = Duration::from_secs(2);

/// What a grant lets a token do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Append to streams.
    Append,
    /// Read streams, describe and list them (and, for gateways, fetch objects of any).
    Read,
    /// Create, delete and reconfigure streams.
    Admin,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Append => "append",
            Scope::Read => "read",
            Scope::Admin => "admin",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        match text {
            "append" => Some(Scope::Append),
            "read" => Some(Scope::Read),
            "admin" => Some(Scope::Admin),
            _ => None,
        }
    }
}

/// A scope on the streams whose names start with `prefix` (every stream when empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub scope: Scope,
    pub prefix: String,
}

impl std::fmt::Display for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.scope.as_str(), self.prefix)
    }
}

/// Who a call comes from: the name of the token it carried, and what that token may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub name: String,
    pub grants: Vec<Grant>,
}

impl Principal {
    /// Whether the token has `scope` on any stream.
    pub fn has(&self, scope: Scope) -> bool {
        self.grants.iter().any(|g| g.scope == scope)
    }

    /// Allows a call that any of `scopes` on `stream` permits, or refuses naming them.
    pub fn allows_any(&self, scopes: &[Scope], stream: &str) -> Result<(), RequestError> {
        let mut refusal = None;
        for &scope in scopes {
            match self.allows(scope, stream) {
                Ok(()) => return Ok(()),
                Err(error) => refusal = refusal.or(Some(error)),
            }
        }
        if scopes.len() < 2 {
            return Err(refusal.unwrap_or_else(|| {
                RequestError::PermissionDenied(format!("no scope for stream {stream:?}"))
            }));
        }
        // Any of them would do: name them all, not the first one tried.
        let names: Vec<&str> = scopes.iter().map(|s| s.as_str()).collect();
        let (last, rest) = names.split_last().unwrap_or((&"", &[]));
        Err(RequestError::PermissionDenied(format!(
            "token {:?} has none of the {} or {last} scopes for stream {stream:?}",
            self.name,
            rest.join(", "),
        )))
    }

    /// Allows `scope` on `stream`, or refuses with PERMISSION_DENIED naming what is missing.
    pub fn allows(&self, scope: Scope, stream: &str) -> Result<(), RequestError> {
        if self
            .grants
            .iter()
            .any(|g| g.scope == scope && stream.starts_with(&g.prefix))
        {
            return Ok(());
        }
        // The refusal names what is missing, never what the token holds: a caller probing a
        // token learns nothing of its other grants.
        if stream.is_empty() {
            // Every stream was asked for (a listing without a prefix).
            return Err(RequestError::PermissionDenied(format!(
                "token {:?} has no {} scope on every stream: ask for the streams under a \
                 prefix it has the scope for (`nova stream list PREFIX`)",
                self.name,
                scope.as_str(),
            )));
        }
        Err(RequestError::PermissionDenied(format!(
            "token {:?} has no {} scope for stream {stream:?}",
            self.name,
            scope.as_str(),
        )))
    }
}

#[derive(Debug, Clone)]
struct Entry {
    digest: [u8; 32],
    principal: Principal,
}

#[derive(Debug, thiserror::Error)]
#[error("{path} line {line}: {problem}")]
pub struct TokenFileError {
    path: String,
    line: usize,
    problem: String,
}

/// The SHA-256 of a token, as the file holds it.
pub fn digest_hex(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// One file line for a token: what `nova token new` prints.
pub fn file_line(name: &str, grants: &[Grant], token: &str) -> String {
    let grants: Vec<String> = grants.iter().map(ToString::to_string).collect();
    format!("{name} {} sha256:{}", grants.join(","), digest_hex(token))
}

fn parse_grants(text: &str) -> Result<Vec<Grant>, String> {
    text.split(',')
        .filter(|g| !g.is_empty())
        .map(|grant| {
            let (scope, prefix) = grant
                .split_once(':')
                .ok_or_else(|| format!("grant {grant:?} is not SCOPE:PREFIX"))?;
            let scope = Scope::parse(scope)
                .ok_or_else(|| format!("unknown scope {scope:?} (append, read or admin)"))?;
            Ok(Grant {
                scope,
                prefix: prefix.to_owned(),
            })
        })
        .collect()
}

fn parse(path: &Path, text: &str) -> Result<Vec<Entry>, TokenFileError> {
    let mut entries = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |problem: String| TokenFileError {
            path: path.display().to_string(),
            line: index + 1,
            problem,
        };
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [name, grants, token] = fields[..] else {
            return Err(bad("expected NAME GRANTS sha256:HEX".into()));
        };
        let hex_digest = token
            .strip_prefix("sha256:")
            .ok_or_else(|| bad("the token must be given as sha256:HEX (its SHA-256)".into()))?;
        let mut digest = [0u8; 32];
        hex::decode_to_slice(hex_digest, &mut digest)
            .map_err(|_| bad("sha256: must be followed by 64 hex digits".into()))?;
        entries.push(Entry {
            digest,
            principal: Principal {
                name: name.to_owned(),
                grants: parse_grants(grants).map_err(bad)?,
            },
        });
    }
    Ok(entries)
}

/// The tokens a server accepts, reloaded from their file.
#[derive(Debug, Clone)]
pub struct Tokens {
    path: PathBuf,
    entries: Arc<RwLock<Arc<Vec<Entry>>>>,
    reloads: prometheus::IntCounterVec,
}

/// A grant's prefix is a plain prefix of the stream's name: `read:logs` covers `logs-private/`
/// as well as `logs/`. Said at load for every grant whose prefix does not end at a separator.
fn warn_of_open_prefixes(principal: &Principal) {
    for grant in &principal.grants {
        let ends_at_separator =
            grant.prefix.is_empty() || grant.prefix.ends_with(['/', '.', '-', '_', ':']);
        if !ends_at_separator {
            tracing::warn!(
                token = %principal.name,
                grant = %grant,
                "grant {grant} covers every stream whose name starts with {:?} ({:?} as well as \
                 {:?}); end the prefix with a separator such as '/' to grant one namespace",
                grant.prefix,
                format!("{}-private/", grant.prefix),
                format!("{}/", grant.prefix),
            );
        }
    }
}

/// Why a call is refused before its handler runs.
fn unauthenticated(why: &str) -> RequestError {
    RequestError::Unauthenticated(format!(
        "{why}: send `authorization: Bearer <token>` with a token this server lists in \
         --auth-tokens (the SDK's with_token, nova's --token or NOVA_TOKEN)"
    ))
}

impl Tokens {
    /// Reads the file; an error here stops the server from starting.
    pub fn load(path: &Path, reloads: prometheus::IntCounterVec) -> Result<Self, TokenFileError> {
        let entries = Self::read(path)?;
        for entry in &entries {
            warn_of_open_prefixes(&entry.principal);
        }
        Ok(Self {
            path: path.to_owned(),
            entries: Arc::new(RwLock::new(Arc::new(entries))),
            reloads,
        })
    }

    fn read(path: &Path) -> Result<Vec<Entry>, TokenFileError> {
        let text = std::fs::read_to_string(path).map_err(|e| TokenFileError {
            path: path.display().to_string(),
            line: 0,
            problem: e.to_string(),
        })?;
        parse(path, &text)
    }

    pub fn len(&self) -> usize {
        self.entries.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Who the `authorization` header's bearer token belongs to. Every entry is compared, in
    /// constant time, so the time taken tells nothing about which (or whether one) matched.
    pub fn authenticate(&self, authorization: Option<&[u8]>) -> Result<Principal, RequestError> {
        let Some(header) = authorization else {
            return Err(unauthenticated("this call carries no token"));
        };
        // The scheme's name is case-insensitive (RFC 9110); the token is not.
        let token = match header.split_at_checked(7) {
            Some((scheme, token)) if scheme.eq_ignore_ascii_case(b"bearer ") => token,
            _ => {
                return Err(unauthenticated(
                    "the authorization header is not a bearer token",
                ));
            }
        };
        let presented: [u8; 32] = Sha256::digest(token).into();
        let entries = self.entries.read().clone();
        let mut found: Option<&Entry> = None;
        for entry in entries.iter() {
            if bool::from(entry.digest.ct_eq(&presented)) {
                found = Some(entry);
            }
        }
        found
            .map(|entry| entry.principal.clone())
            .ok_or_else(|| unauthenticated("the token is not one this server knows"))
    }

    /// Reads the file again. A file that cannot be read (deleted, say) or parsed fails closed:
    /// no token is accepted until it is fixed, because keeping the old tokens would keep a
    /// revoked one working.
    pub fn reload(&self, why: &str) {
        match Self::read(&self.path) {
            Ok(entries) => {
                let count = entries.len();
                for entry in &entries {
                    warn_of_open_prefixes(&entry.principal);
                }
                *self.entries.write() = Arc::new(entries);
                self.reloads.with_label_values(&["ok"]).inc();
                tracing::info!(tokens = count, "--auth-tokens reloaded ({why})");
            }
            Err(problem) => {
                *self.entries.write() = Arc::new(Vec::new());
                self.reloads.with_label_values(&["failed"]).inc();
                tracing::error!(
                    "--auth-tokens not reloaded ({why}): {problem}; NO TOKEN IS ACCEPTED until \
                     the file is fixed (every call but health checks is refused), so that a \
                     revocation cannot fail open"
                );
            }
        }
    }

    /// Reloads on SIGHUP and when the file's modification time changes, until `stopping`.
    pub async fn watch(self, stopping: CancellationToken) {
        use tokio::signal::unix::{SignalKind, signal};
        let stamp = |p: &Path| -> Option<SystemTime> {
            std::fs::metadata(p).and_then(|m| m.modified()).ok()
        };
        let mut hangups = signal(SignalKind::hangup()).ok();
        let mut last = stamp(&self.path);
        let mut ticker = tokio::time::interval(WATCH_EVERY);
        loop {
            let hangup = async {
                match hangups.as_mut() {
                    Some(signals) => signals.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = stopping.cancelled() => return,
                _ = hangup => self.reload("SIGHUP"),
                _ = ticker.tick() => {
                    let now = stamp(&self.path);
                    if now != last {
                        last = now;
                        self.reload("the file changed");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(text: &str) -> Tokens {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(&path, text).unwrap();
        let reloads = prometheus::IntCounterVec::new(
            prometheus::Opts::new("reloads", "reloads"),
            &["outcome"],
        )
        .unwrap();
        Tokens::load(&path, reloads).unwrap()
    }

    #[test]
    fn a_token_is_known_by_its_digest_and_allowed_by_its_grants() {
        let line = file_line(
            "ingest",
            &[
                Grant {
                    scope: Scope::Append,
                    prefix: "logs/".into(),
                },
                Grant {
                    scope: Scope::Read,
                    prefix: "logs/".into(),
                },
            ],
            "s3cret",
        );
        assert!(!line.contains("s3cret"));
        let tokens = tokens(&format!(
            "# a comment\n\n{line}\nops admin: sha256:{}\n",
            digest_hex("other")
        ));
        assert_eq!(tokens.len(), 2);
        let ingest = tokens.authenticate(Some(b"Bearer s3cret")).unwrap();
        assert_eq!(ingest.name, "ingest");
        assert!(ingest.allows(Scope::Append, "logs/app").is_ok());
        assert!(ingest.allows(Scope::Read, "logs/app").is_ok());
        let denied = ingest.allows(Scope::Read, "billing/x").unwrap_err();
        assert!(matches!(denied, RequestError::PermissionDenied(_)));
        assert!(denied.to_string().contains("no read scope"), "{denied}");
        assert!(
            !denied.to_string().contains("logs/"),
            "a refusal does not list the token's grants: {denied}"
        );
        assert!(!denied.to_string().contains("s3cret"));
        let admin = ingest.allows(Scope::Admin, "logs/app").unwrap_err();
        assert!(admin.to_string().contains("no admin scope"), "{admin}");
        // A call any of several scopes allows names them all, not the first one tried.
        let any = ingest
            .allows_any(&[Scope::Read, Scope::Append, Scope::Admin], "other")
            .unwrap_err();
        assert!(
            any.to_string()
                .contains("none of the read, append or admin scopes"),
            "{any}"
        );
        // A listing of every stream says to ask under a prefix.
        let every = ingest.allows(Scope::Read, "").unwrap_err();
        assert!(
            every.to_string().contains("nova stream list PREFIX"),
            "{every}"
        );
        assert!(!every.to_string().contains("logs/"), "{every}");
        let ops = tokens.authenticate(Some(b"Bearer other")).unwrap();
        assert!(ops.allows(Scope::Admin, "anything").is_ok());
        // The scheme in any case; the token exactly.
        assert!(tokens.authenticate(Some(b"bearer other")).is_ok());
        assert!(tokens.authenticate(Some(b"BEARER other")).is_ok());
        assert!(tokens.authenticate(Some(b"Bearer OTHER")).is_err());
    }

    #[test]
    fn unknown_missing_and_malformed_tokens_are_unauthenticated_without_an_echo() {
        let tokens = tokens(&format!("a read: sha256:{}\n", digest_hex("right")));
        for header in [
            None,
            Some(&b"Bearer wrong-token"[..]),
            Some(&b"Basic abc"[..]),
            Some(&b"Bear"[..]),
        ] {
            let err = tokens.authenticate(header).unwrap_err();
            assert!(matches!(err, RequestError::Unauthenticated(_)), "{err}");
            assert!(!err.to_string().contains("wrong-token"));
        }
    }

    #[test]
    fn a_bad_file_names_its_line() {
        let path = Path::new("tokens");
        let err = parse(path, "ok read: sha256:00\n").map(|_| ()).unwrap_err();
        assert!(err.to_string().contains("line 1"), "{err}");
        let err = parse(path, &format!("\nx write: sha256:{}", digest_hex("t")))
            .map(|_| ())
            .unwrap_err();
        assert!(err.to_string().contains("line 2") && err.to_string().contains("unknown scope"));
        let err = parse(path, "x read: plaintoken").map(|_| ()).unwrap_err();
        assert!(err.to_string().contains("sha256:HEX"), "{err}");
    }
}
