use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local addr").port()
}

/// Waits until something accepts connections on the port, or panics after `timeout`.
pub fn wait_for_port(port: u16, timeout: Duration, what: &str) {
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{what} did not listen on port {port} within {timeout:?}");
}

/// The repository root (the parent of this crate's directory).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testkit sits in the workspace")
        .to_path_buf()
}

/// Freezes a process (SIGSTOP), if there is one: it neither runs nor answers, its connections
/// still open.
pub(crate) fn freeze(pid: Option<u32>) {
    if let Some(pid) = pid {
        signal(pid, libc::SIGSTOP);
    }
}

/// Lets a frozen process run again (SIGCONT).
pub(crate) fn thaw(pid: Option<u32>) {
    if let Some(pid) = pid {
        signal(pid, libc::SIGCONT);
    }
}

/// Sends a signal to a process by PID.
pub(crate) fn signal(pid: u32, signal: i32) {
    // SAFETY: kill(2) has no memory-safety preconditions; a stale PID only yields ESRCH.
    unsafe {
        libc::kill(pid as libc::pid_t, signal);
    }
}

/// A binary built from this workspace, found beside the running executable: a test runs from
/// target/<profile>/deps, a binary from target/<profile>.
pub fn workspace_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().expect("the executable's directory");
    let candidates = [dir.join(name), dir.parent().unwrap_or(dir).join(name)];
    candidates
        .iter()
        .find(|path| path.exists())
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "{name} is not built next to {}; run the tests with `cargo nextest run --workspace` (or scripts/test)",
                exe.display()
            )
        })
}

/// Runs the workspace's `nova` CLI with `args`, `stdin` on its standard input, to its end.
pub fn run_nova(args: &[&str], stdin: &[u8]) -> std::process::Output {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(workspace_binary("nova"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run nova");
    if let Some(mut input) = child.stdin.take() {
        input.write_all(stdin).expect("write nova's stdin");
    }
    child.wait_with_output().expect("wait for nova")
}
