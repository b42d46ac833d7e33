//! A TCP proxy for injecting object-store faults: it forwards to an upstream server, and can be
//! switched at any time to refuse connections (reset) or to swallow them (hang: requests are
//! read and never answered). Switching away from `Pass` cuts every open connection, so no
//! pooled keep-alive connection slips through.

use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward everything.
    Pass,
    /// Close every connection as soon as it is accepted.
    Refuse,
    /// Accept connections and read from them, but never answer.
    Hang,
}

impl Fault {
    fn code(self) -> u8 {
        match self {
            Fault::Pass => 0,
            Fault::Refuse => 1,
            Fault::Hang => 2,
        }
    }

    fn from_code(code: u8) -> Self {
        match code {
            1 => Fault::Refuse,
            2 => Fault::Hang,
            _ => Fault::Pass,
        }
    }
}

struct Shared {
    mode: AtomicU8,
    stopped: AtomicBool,
    /// Open sockets (both sides of forwarded connections, and hung ones), to cut on a switch.
    open: Mutex<Vec<TcpStream>>,
}

pub struct FaultProxy {
    host: IpAddr,
    port: u16,
    shared: Arc<Shared>,
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port, forwarding to `upstream`.
    pub fn start(upstream: SocketAddr) -> Self {
        Self::start_on(IpAddr::from([127, 0, 0, 1]), upstream)
    }

    /// Starts a proxy on a free port of `host` (an address of this machine, such as the host
    /// end of a veth pair), forwarding to `upstream`.
    pub fn start_on(host: IpAddr, upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind((host, 0)).expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let shared = Arc::new(Shared {
            mode: AtomicU8::new(Fault::Pass.code()),
            stopped: AtomicBool::new(false),
            open: Mutex::new(Vec::new()),
        });
        let accept_shared = shared.clone();
        thread::spawn(move || {
            for incoming in listener.incoming() {
                if accept_shared.stopped.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = incoming else { continue };
                let shared = accept_shared.clone();
                thread::spawn(move || handle(client, upstream, &shared));
            }
        });
        Self { host, port, shared }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", SocketAddr::from((self.host, self.port)))
    }

    pub fn set(&self, fault: Fault) {
        self.shared.mode.store(fault.code(), Ordering::SeqCst);
        if fault != Fault::Pass {
            cut_all(&self.shared);
        }
    }

    pub fn fault(&self) -> Fault {
        Fault::from_code(self.shared.mode.load(Ordering::SeqCst))
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        cut_all(&self.shared);
        // Wake the accept loop so it sees `stopped`.
        let _ = TcpStream::connect_timeout(
            &SocketAddr::from((self.host, self.port)),
            Duration::from_millis(100),
        );
    }
}

fn cut_all(shared: &Shared) {
    let mut open = shared.open.lock().unwrap_or_else(|e| e.into_inner());
    for socket in open.drain(..) {
        let _ = socket.shutdown(Shutdown::Both);
    }
}

fn remember(shared: &Shared, socket: &TcpStream) {
    if let Ok(clone) = socket.try_clone() {
        let mut open = shared.open.lock().unwrap_or_else(|e| e.into_inner());
        // Forget sockets that are already closed so the list stays as long as the live ones.
        open.retain(|s| s.peer_addr().is_ok());
        open.push(clone);
    }
}

fn handle(client: TcpStream, upstream: SocketAddr, shared: &Arc<Shared>) {
    match Fault::from_code(shared.mode.load(Ordering::SeqCst)) {
        Fault::Refuse => {
            let _ = client.shutdown(Shutdown::Both);
        }
        Fault::Hang => {
            remember(shared, &client);
            let mut sink = [0u8; 4096];
            let mut client = client;
            while matches!(client.read(&mut sink), Ok(n) if n > 0) {}
        }
        Fault::Pass => {
            let Ok(server) = TcpStream::connect_timeout(&upstream, Duration::from_secs(2)) else {
                let _ = client.shutdown(Shutdown::Both);
                return;
            };
            remember(shared, &client);
            remember(shared, &server);
            let (Ok(client_read), Ok(server_read)) = (client.try_clone(), server.try_clone())
            else {
                return;
            };
            let upstream_copy = thread::spawn(move || pipe(client_read, server));
            pipe(server_read, client);
            let _ = upstream_copy.join();
        }
    }
}

fn pipe(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
