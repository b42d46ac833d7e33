//! A real novad process for end-to-end tests.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::process::{free_port, freeze, signal, thaw, wait_for_port};

pub struct NovadBuilder {
    binary: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// Variables of the test's own environment the process does not inherit.
    env_removed: Vec<String>,
    data_dir: Option<PathBuf>,
    cgroup: Option<PathBuf>,
    port: Option<u16>,
    /// novagateway takes no --data-dir.
    gateway: bool,
    /// Run inside this network namespace, listening on this address of it.
    netns: Option<(String, IpAddr)>,
}

impl NovadBuilder {
    /// `binary` is the novad executable (`env!("CARGO_BIN_EXE_novad")` in novad's own tests).
    pub fn new(binary: impl Into<PathBuf>) -> Self {
        Self {
            binary: binary.into(),
            args: Vec::new(),
            env: Vec::new(),
            env_removed: Vec::new(),
            data_dir: None,
            cgroup: None,
            port: None,
            gateway: false,
            netns: None,
        }
    }

    /// A novagateway process (`binary` is the novagateway executable): the same handle, without
    /// the star's --data-dir.
    pub fn gateway(binary: impl Into<PathBuf>) -> Self {
        Self {
            gateway: true,
            ..Self::new(binary)
        }
    }

    /// A gateway for `star` on the embedded default: it reads the star's local object-store
    /// directory.
    pub fn gateway_beside(binary: impl Into<PathBuf>, star: &Novad) -> Self {
        let store_dir = star.data_dir().join("store");
        Self::gateway(binary).args([
            "--star".to_owned(),
            star.url(),
            "--store-dir".to_owned(),
            store_dir.display().to_string(),
        ])
    }

    /// Listens on this port instead of a free one picked at start (to name it to peers first).
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    /// Runs novad inside this cgroup (v1: a directory under /sys/fs/cgroup/memory); it joins the
    /// group before exec, so every byte it allocates is charged there.
    pub fn cgroup(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cgroup = Some(dir.into());
        self
    }

    /// Runs novad inside network namespace `name` (`ip netns exec`), listening on `ip`, an
    /// address of the namespace the test reaches over a veth pair.
    pub fn netns(mut self, name: &str, ip: IpAddr) -> Self {
        self.netns = Some((name.to_owned(), ip));
        self
    }

    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Starts the process without `key`, even if the test's environment has it.
    pub fn env_remove(mut self, key: impl Into<String>) -> Self {
        self.env_removed.push(key.into());
        self
    }

    /// Uses this data directory instead of a fresh temporary one.
    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.data_dir = Some(dir.into());
        self
    }

    /// Starts novad and waits until it accepts connections (it listens only once recovery is
    /// done).
    pub fn start(self) -> Novad {
        let mut novad = self.start_detached();
        // Another process may take a port between our probe and novad's bind; pick new ones.
        for _ in 0..5 {
            if !novad.lost_port_race(Duration::from_secs(60)) {
                novad.wait_accepting(Duration::from_secs(10));
                return novad;
            }
            novad.port = free_port();
            novad.metrics_port = free_port();
            novad.spawn();
        }
        novad.wait_ready(Duration::from_secs(60));
        novad
    }

    /// Starts novad without waiting for it to listen.
    pub fn start_detached(self) -> Novad {
        let (temp, data_dir) = match self.data_dir {
            Some(dir) => (None, dir),
            None => {
                let temp = tempfile::tempdir().expect("tempdir");
                let dir = temp.path().to_path_buf();
                (Some(temp), dir)
            }
        };
        let mut novad = Novad {
            child: None,
            binary: self.binary,
            args: self.args,
            env: self.env,
            env_removed: self.env_removed,
            port: self.port.unwrap_or_else(free_port),
            metrics_port: free_port(),
            gateway: self.gateway,
            data_dir,
            cgroup: self.cgroup,
            netns: self.netns,
            _temp: temp,
            starts: 0,
        };
        novad.spawn();
        novad
    }
}

pub struct Novad {
    child: Option<Child>,
    binary: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    env_removed: Vec<String>,
    port: u16,
    metrics_port: u16,
    data_dir: PathBuf,
    cgroup: Option<PathBuf>,
    gateway: bool,
    netns: Option<(String, IpAddr)>,
    _temp: Option<tempfile::TempDir>,
    starts: u32,
}

impl Novad {
    /// The address novad listens on: loopback, or its address in its network namespace.
    pub fn host(&self) -> IpAddr {
        self.netns
            .as_ref()
            .map_or(IpAddr::from([127, 0, 0, 1]), |(_, ip)| *ip)
    }

    pub fn url(&self) -> String {
        format!("http://{}", SocketAddr::from((self.host(), self.port)))
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Where this start's output goes.
    pub fn log_path(&self) -> PathBuf {
        self.data_dir.join(format!("novad-{}.log", self.starts))
    }

    /// Everything novad printed in its current (or last) run.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn spawn(&mut self) {
        self.starts += 1;
        let log = File::create(self.log_path()).expect("create novad log");
        let mut command = match &self.cgroup {
            // The shell joins the cgroup, then becomes novad: same PID, already charged there.
            Some(cgroup) => {
                let mut shell = Command::new("sh");
                shell
                    .arg("-c")
                    .arg(r#"echo $$ > "$0/cgroup.procs" && exec "$@""#)
                    .arg(cgroup)
                    .arg(&self.binary);
                shell
            }
            None => match &self.netns {
                // `ip netns exec` enters the namespace and then becomes novad: same PID.
                Some((name, _)) => {
                    let mut ip = Command::new("ip");
                    ip.args(["netns", "exec", name]).arg(&self.binary);
                    ip
                }
                None => Command::new(&self.binary),
            },
        };
        let host = self.host();
        command
            .arg("--listen")
            .arg(SocketAddr::from((host, self.port)).to_string())
            .arg("--metrics-addr")
            .arg(SocketAddr::from((host, self.metrics_port)).to_string());
        if !self.gateway {
            command.arg("--data-dir").arg(&self.data_dir);
        }
        command
            .args(&self.args)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log"))
            .stderr(log);
        for k in &self.env_removed {
            command.env_remove(k);
        }
        for (k, v) in &self.env {
            command.env(k, v);
        }
        self.child = Some(command.spawn().expect("spawn novad"));
    }

    /// A fleet star listens a moment before it takes leadership (it first checks that its
    /// advertised address leads to it): waits for the log line that says it serves, so a test
    /// creating a stream right away is not refused for want of a ready star. At most
    /// `timeout`, and not at all for a gateway; a log without INFO lines never says it.
    fn wait_accepting(&mut self, timeout: Duration) {
        if self.gateway {
            return;
        }
        let deadline = Instant::now() + timeout;
        while !self.log().contains("novad accepting appends") && Instant::now() < deadline {
            if self.try_exit_status().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until novad listens; `true` if it exited because a port was already taken.
    fn lost_port_race(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(_)) = child.try_wait()
            {
                self.child = None;
                if self.log().contains("Address already in use") {
                    return true;
                }
                panic!("novad exited before listening:\n{}", self.log());
            }
            if TcpStream::connect((self.host(), self.port)).is_ok() {
                return false;
            }
            if Instant::now() > deadline {
                panic!("novad did not listen within {timeout:?}:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until novad accepts connections; panics with its log if it exits or times out.
    pub fn wait_ready(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!(
                    "novad exited with {status} before listening:\n{}",
                    self.log()
                );
            }
            if TcpStream::connect((self.host(), self.port)).is_ok() {
                return;
            }
            if Instant::now() > deadline {
                panic!("novad did not listen within {timeout:?}:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills novad with SIGKILL: no chance to flush or clean up.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(child.id(), libc::SIGKILL);
            let _ = child.wait();
        }
    }

    /// Freezes the process (SIGSTOP): it neither runs nor answers, as a long GC pause or a
    /// stalled VM would leave it, with its connections still open.
    pub fn pause(&self) {
        freeze(self.pid());
    }

    pub fn resume(&self) {
        thaw(self.pid());
    }

    /// Sends SIGTERM and waits for the exit, up to `timeout`.
    pub fn terminate(&mut self, timeout: Duration) -> ExitStatus {
        let mut child = self.child.take().expect("novad is running");
        signal(child.id(), libc::SIGTERM);
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!(
                    "novad did not exit within {timeout:?} of SIGTERM:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts novad again on the same port and data directory, and waits until it listens.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "stop novad before restarting it");
        self.spawn();
        self.wait_ready(Duration::from_secs(60));
        self.wait_accepting(Duration::from_secs(10));
    }

    /// For a star started detached: waits until novad listens (up to a minute) and then, a
    /// fleet star, until it has taken leadership (up to 30 s more), as `start` does. Listening
    /// comes a moment before leadership, and a loaded machine can stretch that moment past a
    /// test's first create.
    pub fn wait_serving(&mut self) {
        self.wait_ready(Duration::from_secs(60));
        self.wait_accepting(Duration::from_secs(30));
    }

    /// Starts novad again without waiting for it to listen.
    pub fn restart_detached(&mut self) {
        assert!(self.child.is_none(), "stop novad before restarting it");
        self.spawn();
    }

    /// Whether something accepts connections on novad's port right now.
    pub fn is_listening(&self) -> bool {
        TcpStream::connect((self.host(), self.port)).is_ok()
    }

    /// Whether the process has exited, and how.
    pub fn try_exit_status(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    pub fn metrics_port(&self) -> u16 {
        self.metrics_port
    }

    /// The metrics page, in Prometheus text format.
    pub fn metrics(&self) -> String {
        let host = self.host();
        if self.netns.is_none() {
            wait_for_port(self.metrics_port, Duration::from_secs(10), "novad metrics");
        }
        scrape_at(host, self.metrics_port)
    }

    /// The value of one series on the metrics page (`name` may include labels, exactly as
    /// printed), or `None` when absent.
    pub fn metric(&self, series_name: &str) -> Option<f64> {
        series(&self.metrics(), series_name)
    }
}

/// GET /metrics on a loopback port; empty when nothing answers.
pub fn scrape(port: u16) -> String {
    scrape_at(IpAddr::from([127, 0, 0, 1]), port)
}

/// GET /metrics on `host:port`; empty when nothing answers.
pub fn scrape_at(host: IpAddr, port: u16) -> String {
    let addr = SocketAddr::from((host, port));
    let Ok(mut stream) = TcpStream::connect(addr) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return String::new();
    }
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    match response.split_once("\r\n\r\n") {
        Some((_, body)) => body.to_owned(),
        None => response,
    }
}

/// One series' value on a metrics page.
pub fn series(page: &str, name: &str) -> Option<f64> {
    page.lines().find_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        if series == name {
            value.parse().ok()
        } else {
            None
        }
    })
}

/// The star's memory formula on a metrics page: the sum of its `nova_memory_formula_bytes`
/// terms (the transport term counting the sessions open at the scrape).
pub fn formula_bytes(page: &str) -> u64 {
    nova_core::formula::TERMS
        .iter()
        .filter_map(|t| series(page, &format!("nova_memory_formula_bytes{{term=\"{t}\"}}")))
        .sum::<f64>() as u64
}

/// A gateway's memory formula on its metrics page: the sum of its
/// `nova_gateway_memory_formula_bytes` terms (a panic if one is missing).
pub fn gateway_formula_bytes(page: &str) -> u64 {
    [
        "fetch_pool",
        "footer_cache",
        "object_cache",
        "recycle",
        "reads",
        "read_ahead",
        "read_aheads",
        "fixed",
    ]
    .iter()
    .map(|t| {
        series(
            page,
            &format!("nova_gateway_memory_formula_bytes{{term=\"{t}\"}}"),
        )
        .unwrap_or_else(|| panic!("the gateway exports its formula's {t} term"))
    })
    .sum::<f64>() as u64
}

impl Drop for Novad {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(child.id(), libc::SIGKILL);
            let _ = child.wait();
        }
    }
}
