//! moto server 5.2.5: the S3-compatible server whose conditional writes are atomic.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::process::{free_port, freeze, signal, thaw, wait_for_port, workspace_root};

pub struct Moto {
    child: Option<Child>,
    port: u16,
    binary: PathBuf,
    /// moto's request log (one line per request), for counting requests at the server.
    log: tempfile::NamedTempFile,
    /// Where moto's recorder writes each request with its headers, once `start_recording`.
    recording: tempfile::NamedTempFile,
}

/// One request as the server logged it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedRequest {
    pub method: String,
    /// Path and query, as sent.
    pub target: String,
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
            log: tempfile::NamedTempFile::new().expect("a temporary file for moto's log"),
            recording: tempfile::NamedTempFile::new()
                .expect("a temporary file for moto's recording"),
        };
        moto.spawn();
        moto
    }

    fn spawn(&mut self) {
        let child = Command::new(&self.binary)
            .args(["-H", "127.0.0.1", "-p", &self.port.to_string()])
            .env("MOTO_RECORDER_FILEPATH", self.recording.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // Appended to, so a restarted server's requests follow the earlier ones.
            .stderr(
                std::fs::OpenOptions::new()
                    .append(true)
                    .open(self.log.path())
                    .map(Stdio::from)
                    .unwrap_or_else(|_| Stdio::null()),
            )
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

    /// Every request the server has answered so far, in order, from its log.
    pub fn requests(&self) -> Vec<LoggedRequest> {
        let text = std::fs::read_to_string(self.log.path()).unwrap_or_default();
        text.lines().filter_map(parse_log_line).collect()
    }

    /// Starts moto's recorder: from now on every request is written down with its headers
    /// (and body: keep what is recorded small).
    pub fn start_recording(&self) {
        self.post("/moto-api/recorder/start-recording");
    }

    pub fn stop_recording(&self) {
        self.post("/moto-api/recorder/stop-recording");
    }

    /// S3 UploadPartCopy requests recorded so far: parts of a multipart upload the server
    /// copied from another object (a PUT with a part number and an `x-amz-copy-source`).
    pub fn recorded_part_copies(&self) -> usize {
        let text = std::fs::read_to_string(self.recording.path()).unwrap_or_default();
        text.lines()
            .filter(|line| {
                let lower = line.to_ascii_lowercase();
                lower.contains("\"x-amz-copy-source\"")
                    && lower.contains("partnumber=")
                    && lower.contains("\"method\": \"put\"")
            })
            .count()
    }

    fn post(&self, path: &str) {
        self.call("POST", path);
    }

    /// A bodiless request (moto does not check signatures), which must answer 200. Every call
    /// this helper makes is idempotent, so one the server drops (moto's development server now
    /// and then resets a connection under load) is sent again, a few times.
    fn call(&self, method: &str, path: &str) {
        let mut attempt = 0;
        let response = loop {
            match self.try_call(method, path) {
                Ok(response) => break response,
                Err(e) if attempt < 4 => {
                    eprintln!("moto {method} {path}: {e}; retrying");
                    attempt += 1;
                    std::thread::sleep(std::time::Duration::from_millis(200));
                }
                Err(e) => panic!("moto {method} {path}: {e}"),
            }
        };
        // A retried bucket creation may find the bucket the dropped attempt made.
        let ok = response.starts_with("HTTP/1.1 200")
            || response.starts_with("HTTP/1.0 200")
            || (attempt > 0 && response.contains("BucketAlreadyOwnedByYou"));
        assert!(ok, "{method} {path} failed: {response}");
    }

    fn try_call(&self, method: &str, path: &str) -> std::io::Result<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        );
        stream.write_all(request.as_bytes())?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        Ok(response)
    }

    /// Creates a bucket with a plain path-style PUT.
    pub fn create_bucket(&self, bucket: &str) {
        self.call("PUT", &format!("/{bucket}"));
    }

    /// Freezes the server (SIGSTOP): connections hang, as in a network partition.
    pub fn pause(&self) {
        freeze(self.pid());
    }

    pub fn resume(&self) {
        thaw(self.pid());
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

/// `127.0.0.1 - - [date] "METHOD /target HTTP/1.1" 200 -`, possibly with colour codes.
fn parse_log_line(line: &str) -> Option<LoggedRequest> {
    let plain: String = strip_colours(line);
    let request = plain.split('"').nth(1)?;
    let mut parts = request.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    version.starts_with("HTTP/").then(|| LoggedRequest {
        method: method.to_owned(),
        target: target.to_owned(),
    })
}

fn strip_colours(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // ESC [ ... m
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_coloured_log_lines() {
        let coloured = "127.0.0.1 - - [30/Nov/2026 21:00:22] \"\u{1b}[33mPUT /b1/k?partNumber=2 HTTP/1.1\u{1b}[0m\" 404 -";
        assert_eq!(
            parse_log_line(coloured),
            Some(LoggedRequest {
                method: "PUT".into(),
                target: "/b1/k?partNumber=2".into()
            })
        );
        let plain = "127.0.0.1 - - [30/Nov/2026 21:00:22] \"GET /b1 HTTP/1.1\" 200 -";
        assert_eq!(parse_log_line(plain).unwrap().method, "GET");
        assert_eq!(parse_log_line(" * Running on http://127.0.0.1:1"), None);
    }
}
