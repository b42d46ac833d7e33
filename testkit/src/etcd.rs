//! etcd, the fleet's metastore: Debian's `etcd-server` 3.4.23, which the README's test command
//! installs. Each test gets its own server on free loopback ports and a scratch data directory.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::process::{free_port, signal, wait_for_port};

pub struct Etcd {
    child: Option<Child>,
    client_port: u16,
    _dir: tempfile::TempDir,
}

/// `NOVA_ETCD`, then the PATH (Debian installs /usr/bin/etcd).
fn find_binary() -> PathBuf {
    std::env::var_os("NOVA_ETCD")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("etcd"))
}

impl Etcd {
    /// Starts a single-member cluster. Panics with a hint when etcd is not installed: run the
    /// README's test command, which installs it.
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("a data directory for etcd");
        let client_port = free_port();
        let peer_port = free_port();
        let client = format!("http://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let binary = find_binary();
        let child = Command::new(&binary)
            .args(["--name", "n1", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("n1={peer}")])
            // Fsync still happens; the cluster is one member on loopback.
            .args(["--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(dir.path().join("etcd.log"))
                    .map(Stdio::from)
                    .unwrap_or_else(|_| Stdio::null()),
            )
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {} ({e}); the README's test command (scripts/test) installs Debian's etcd-server",
                    binary.display()
                )
            });
        let mut etcd = Self {
            child: Some(child),
            client_port,
            _dir: dir,
        };
        wait_for_port(client_port, Duration::from_secs(30), "etcd");
        if let Some(child) = etcd.child.as_mut()
            && let Ok(Some(status)) = child.try_wait()
        {
            panic!("etcd exited ({status}): a port was taken");
        }
        etcd
    }

    /// `127.0.0.1:PORT`, as `--metastore etcd://…` takes it.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// The `--metastore` value for novad.
    pub fn url(&self) -> String {
        format!("etcd://{}", self.endpoint())
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

/// A cluster of etcd members on loopback, for tests that kill or pause a member under load.
pub struct EtcdCluster {
    members: Vec<Member>,
    _dir: tempfile::TempDir,
}

struct Member {
    child: Option<Child>,
    client_port: u16,
}

impl EtcdCluster {
    /// Starts `n` members that form one cluster, and waits until each answers.
    pub fn start(n: usize) -> Self {
        let dir = tempfile::tempdir().expect("a data directory for etcd");
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let initial = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let binary = find_binary();
        let members = ports
            .iter()
            .enumerate()
            .map(|(i, (client, peer))| {
                let client_url = format!("http://127.0.0.1:{client}");
                let peer_url = format!("http://127.0.0.1:{peer}");
                let child = Command::new(&binary)
                    .args(["--name", &format!("m{i}"), "--data-dir"])
                    .arg(dir.path().join(format!("m{i}")))
                    .args(["--listen-client-urls", &client_url])
                    .args(["--advertise-client-urls", &client_url])
                    .args(["--listen-peer-urls", &peer_url])
                    .args(["--initial-advertise-peer-urls", &peer_url])
                    .args(["--initial-cluster", &initial])
                    .args(["--initial-cluster-state", "new"])
                    .args(["--log-level", "warn"])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(
                        std::fs::File::create(dir.path().join(format!("m{i}.log")))
                            .map(Stdio::from)
                            .unwrap_or_else(|_| Stdio::null()),
                    )
                    .spawn()
                    .unwrap_or_else(|e| {
                        panic!(
                            "cannot start {} ({e}); the README's test command (scripts/test) installs Debian's etcd-server",
                            binary.display()
                        )
                    });
                Member {
                    child: Some(child),
                    client_port: *client,
                }
            })
            .collect();
        let cluster = Self { members, _dir: dir };
        for member in &cluster.members {
            wait_for_port(member.client_port, Duration::from_secs(30), "etcd");
        }
        cluster
    }

    /// The `--metastore` value for novad: every member.
    pub fn url(&self) -> String {
        let endpoints: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect();
        format!("etcd://{}", endpoints.join(","))
    }

    /// kill -9 of member `i`; it stays down.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOP to member `i`: it holds its connections and answers nothing.
    pub fn pause(&self, i: usize) {
        if let Some(child) = &self.members[i].child {
            signal(child.id(), libc::SIGSTOP);
        }
    }

    /// SIGCONT to member `i`.
    pub fn resume(&self, i: usize) {
        if let Some(child) = &self.members[i].child {
            signal(child.id(), libc::SIGCONT);
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for member in &mut self.members {
            if let Some(mut child) = member.child.take() {
                signal(child.id(), libc::SIGCONT);
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(child.id(), libc::SIGCONT);
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
