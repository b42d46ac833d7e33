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

/// Runs the workspace's `nova` CLI with `args`, `stdin` on its standard input, to its end, with
/// no `NOVA_TOKEN` in its environment.
pub fn run_nova(args: &[&str], stdin: &[u8]) -> std::process::Output {
    run_nova_as(None, args, stdin)
}

/// As [`run_nova`], with `NOVA_TOKEN` set to `token` (or unset).
pub fn run_nova_as(token: Option<&str>, args: &[&str], stdin: &[u8]) -> std::process::Output {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut command = Command::new(workspace_binary("nova"));
    match token {
        Some(token) => command.env("NOVA_TOKEN", token),
        None => command.env_remove("NOVA_TOKEN"),
    };
    let mut child = command
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

/// `nova --server SERVER ARGS…`, as [`run_nova`].
pub fn nova_at(server: &str, args: &[&str], stdin: &[u8]) -> std::process::Output {
    let mut argv = vec!["--server", server];
    argv.extend_from_slice(args);
    run_nova(&argv, stdin)
}

/// The standard output of a run that succeeded, or a panic with its standard error.
pub fn succeeded(output: std::process::Output) -> String {
    assert!(
        output.status.success(),
        "nova failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("nova writes UTF-8")
}

/// The Python of the test virtualenv (`NOVA_PYTHON`, else `.nova-test/venv/bin/python`, where
/// `scripts/test` puts it, with the Python packages the tests use).
pub fn python() -> PathBuf {
    std::env::var_os("NOVA_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".nova-test/venv/bin/python"))
}
