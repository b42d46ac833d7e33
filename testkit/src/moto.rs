//! moto server 5.2.5: the S3-compatible server whose conditional writes are atomic.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::process::{free_port, signal, wait_for_port, workspace_root};

pub struct Moto {
    child: Option<Child>,
    port: u16,
    binary: PathBuf,
}

/// Where the README's test command installs moto, then `NOVA_MOTO_SERVER`, then the PATH.
fn find_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("NOVA_MOTO_SERVER") {
        return PathBuf::from(path);
    }
    let venv = workspace_root().join(".nova-test/venv/bin/moto_server");
    if venv.exists() {
        return venv;
    }
    PathBuf::from("moto_server")
}

impl Moto {
    /// Starts a fresh moto server on a free loopback port. Panics with a hint when moto is not
    /// installed: run the README's test command, which installs it.
    pub fn start() -> Self {
        let binary = find_binary();
        let port = free_port();
        let mut moto = Self {
            child: None,
            port,
            binary,
        };
        moto.spawn();
        moto
    }

    fn spawn(&mut self) {
        let child = Command::new(&self.binary)
            .args(["-H", "127.0.0.1", "-p", &self.port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {} ({e}); the README's test command (scripts/test) installs moto server 5.2.5",
                    self.binary.display()
                )
            });
        self.child = Some(child);
        wait_for_port(self.port, Duration::from_secs(30), "moto server");
        // Something else may have taken the port first; then moto has exited.
        if let Some(child) = self.child.as_mut()
            && let Ok(Some(status)) = child.try_wait()
        {
            panic!(
                "moto server exited ({status}): port {} was taken",
                self.port
            );
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Creates a bucket with a plain path-style PUT (moto does not check signatures).
    pub fn create_bucket(&self, bucket: &str) {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).expect("connect to moto");
        let request = format!(
            "PUT /{bucket} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        );
        stream.write_all(request.as_bytes()).expect("send");
        let mut response = String::new();
        stream.read_to_string(&mut response).expect("read");
        assert!(
            response.starts_with("HTTP/1.1 200") || response.starts_with("HTTP/1.0 200"),
            "creating bucket {bucket} failed: {response}"
        );
    }

    /// Freezes the server (SIGSTOP): connections hang, as in a network partition.
    pub fn pause(&self) {
        if let Some(pid) = self.pid() {
            signal(pid, libc::SIGSTOP);
        }
    }

    pub fn resume(&self) {
        if let Some(pid) = self.pid() {
            signal(pid, libc::SIGCONT);
        }
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(child.id(), libc::SIGCONT);
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
