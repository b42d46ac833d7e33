//! TLS for a server's gRPC listener, with certificates that change without a restart. The
//! certificate, its key and (for mutual TLS) the CA that client certificates must chain to are
//! read from files; on SIGHUP, and whenever one of the files changes, they are read again, and
//! new connections use the new ones while open connections keep theirs. A reload that fails (a
//! half-written file, a key that does not match) is logged and the old configuration stays.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::RwLock;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio_util::sync::CancellationToken;

/// How often the files are looked at for changes (their modification times only).
const WATCH_EVERY: Duration = Duration::from_secs(2);

/// Where the server's certificate and key are, and the CA client certificates must chain to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// With it, a client without a certificate signed by this CA is refused (mutual TLS).
    pub client_ca: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {problem}")]
    File { path: String, problem: String },
    #[error("{0}")]
    Config(String),
}

fn file_error(path: &Path, problem: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        path: path.display().to_string(),
        problem: problem.to_string(),
    }
}

/// The crypto every Nova TLS endpoint uses: the one the AWS SDK already brings.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// Every certificate in a PEM file.
pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, e))?;
    if certs.is_empty() {
        return Err(file_error(path, "no PEM certificate in it"));
    }
    Ok(certs)
}

impl TlsFiles {
    /// A server configuration from the files as they are now.
    pub fn load(&self) -> Result<Arc<ServerConfig>, TlsError> {
        let chain = read_certs(&self.cert)?;
        let key = PrivateKeyDer::from_pem_file(&self.key).map_err(|e| file_error(&self.key, e))?;
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let builder = match &self.client_ca {
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in read_certs(ca)? {
                    roots.add(cert).map_err(|e| file_error(ca, e))?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                        .build()
                        .map_err(|e| TlsError::Config(format!("--tls-client-ca: {e}")))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_single_cert(chain, key).map_err(|e| {
            TlsError::Config(format!(
                "--tls-cert {} and --tls-key {} do not make a usable identity: {e}",
                self.cert.display(),
                self.key.display()
            ))
        })?;
        // gRPC is HTTP/2 only.
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
    }

    fn paths(&self) -> impl Iterator<Item = &PathBuf> {
        [&self.cert, &self.key].into_iter().chain(&self.client_ca)
    }

    /// The files' modification times, to tell when one changed.
    fn stamps(&self) -> Vec<Option<SystemTime>> {
        self.paths()
            .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
            .collect()
    }
}

/// The server configuration new connections get, reloaded from its files.
#[derive(Debug, Clone)]
pub struct ReloadingTls {
    files: TlsFiles,
    current: Arc<RwLock<Arc<ServerConfig>>>,
    reloads: prometheus::IntCounterVec,
}

impl ReloadingTls {
    /// Loads the files; an error here stops the server from starting.
    pub fn new(files: TlsFiles, reloads: prometheus::IntCounterVec) -> Result<Self, TlsError> {
        let config = files.load()?;
        Ok(Self {
            files,
            current: Arc::new(RwLock::new(config)),
            reloads,
        })
    }

    pub fn config(&self) -> Arc<ServerConfig> {
        self.current.read().clone()
    }

    /// Reads the files again; on failure the configuration in use stays.
    pub fn reload(&self, why: &str) {
        match self.files.load() {
            Ok(config) => {
                *self.current.write() = config;
                self.reloads.with_label_values(&["ok"]).inc();
                tracing::info!(
                    cert = %self.files.cert.display(),
                    "TLS certificate reloaded ({why}); new connections use it"
                );
            }
            Err(problem) => {
                self.reloads.with_label_values(&["failed"]).inc();
                tracing::error!(
                    "TLS certificate not reloaded ({why}): {problem}; connections keep the one \
                     loaded before"
                );
            }
        }
    }

    /// Reloads on SIGHUP and when a file's modification time changes, until `stopping`.
    pub async fn watch(self, stopping: CancellationToken) {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangups = signal(SignalKind::hangup()).ok();
        let mut stamps = self.files.stamps();
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
                    let now = self.files.stamps();
                    if now != stamps {
                        stamps = now;
                        self.reload("a file changed");
                    }
                }
            }
        }
    }
}
