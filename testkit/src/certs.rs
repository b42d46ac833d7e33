//! Certificates for TLS tests, made with the openssl command (the README's test command
//! installs it where it is missing): a CA, a server certificate for `localhost` and
//! `127.0.0.1`, and client certificates, each signed by the CA, in a temporary directory.

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Certs {
    dir: tempfile::TempDir,
}

/// A certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct Identity {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run openssl ({e}); the README's test command installs it")
        });
    assert!(
        output.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

impl Certs {
    /// A new CA (`ca.pem`), with a server certificate for localhost and 127.0.0.1.
    pub fn new() -> Self {
        let certs = Self {
            dir: tempfile::tempdir().expect("tempdir"),
        };
        let dir = certs.dir.path();
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=nova test CA",
            ],
        );
        certs.issue(
            "server",
            "localhost",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        );
        certs
    }

    /// Signs a new certificate `name` for `cn` with `extension` (an openssl -addext value).
    pub fn issue(&self, name: &str, cn: &str, extension: &str) -> Identity {
        let dir = self.dir.path();
        let (key, csr, cert) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
        );
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-keyout",
                &key,
                "-out",
                &csr,
                "-subj",
                &format!("/CN={cn}"),
                "-addext",
                extension,
            ],
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &cert,
                "-days",
                "2",
                "-copy_extensions",
                "copy",
            ],
        );
        Identity {
            cert: dir.join(cert),
            key: dir.join(key),
        }
    }

    /// A client certificate, for mutual TLS.
    pub fn client(&self, name: &str) -> Identity {
        self.issue(name, name, "extendedKeyUsage=clientAuth")
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    pub fn server(&self) -> Identity {
        Identity {
            cert: self.dir.path().join("server.pem"),
            key: self.dir.path().join("server.key"),
        }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Default for Certs {
    fn default() -> Self {
        Self::new()
    }
}
