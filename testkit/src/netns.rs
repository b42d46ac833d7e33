//! A network namespace joined to this one by a veth pair, for partition tests: a process run in
//! it (`NovadBuilder::netns`) reaches the host only through the pair's host address, so the
//! test decides what it can reach by what it forwards there. Needs root and iproute2; removed
//! (with the pair) when dropped.

use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

static MADE: AtomicU32 = AtomicU32::new(0);

pub struct Netns {
    name: String,
    host_if: String,
    host_ip: IpAddr,
    ns_ip: IpAddr,
}

fn run(args: &[&str]) -> Result<(), String> {
    let output = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args.join(" ")))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

impl Netns {
    /// Makes a namespace with a veth pair to this one on a /30 of its own. `Err` says why it
    /// cannot (not root, no iproute2), for the test to report.
    pub fn create() -> Result<Self, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("network namespaces need root".into());
        }
        let n = MADE.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let tag = format!("{}{}", pid % 100_000, n);
        let name = format!("nova-{tag}");
        let host_if = format!("nvh{tag}");
        let ns_if = format!("nvn{tag}");
        // A /30 per namespace, in 10.0.0.0/8, from the pid and count.
        let block = (pid.wrapping_mul(16) + n * 4) % (1 << 22);
        let base = Ipv4Addr::from(0x0a00_0000 | (block << 2));
        let host_ip = Ipv4Addr::from(u32::from(base) + 1);
        let ns_ip = Ipv4Addr::from(u32::from(base) + 2);
        let netns = Self {
            name: name.clone(),
            host_if: host_if.clone(),
            host_ip: IpAddr::V4(host_ip),
            ns_ip: IpAddr::V4(ns_ip),
        };
        run(&["ip", "netns", "add", &name])?;
        run(&[
            "ip", "link", "add", &host_if, "type", "veth", "peer", "name", &ns_if,
        ])?;
        run(&["ip", "link", "set", &ns_if, "netns", &name])?;
        run(&[
            "ip",
            "addr",
            "add",
            &format!("{host_ip}/30"),
            "dev",
            &host_if,
        ])?;
        run(&["ip", "link", "set", &host_if, "up"])?;
        let inside = |args: &[&str]| {
            let mut all = vec!["ip", "netns", "exec", &name];
            all.extend_from_slice(args);
            run(&all)
        };
        inside(&["ip", "addr", "add", &format!("{ns_ip}/30"), "dev", &ns_if])?;
        inside(&["ip", "link", "set", &ns_if, "up"])?;
        inside(&["ip", "link", "set", "lo", "up"])?;
        Ok(netns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// This side's address on the pair: what the namespace reaches the host at.
    pub fn host_ip(&self) -> IpAddr {
        self.host_ip
    }

    /// The namespace's address on the pair: what the host reaches it at.
    pub fn ns_ip(&self) -> IpAddr {
        self.ns_ip
    }
}

impl Netns {
    /// Drops, silently, every packet the namespace sends to `port` on the host side of the
    /// pair: the peer sees no reset and no refusal, only silence, as across a real partition.
    /// Needs iptables (Debian's `iptables`, which the README's test command installs).
    pub fn drop_to(&self, port: u16) -> Result<(), String> {
        self.iptables("-A", port)
    }

    /// Stops dropping what `drop_to` dropped.
    pub fn pass_to(&self, port: u16) -> Result<(), String> {
        self.iptables("-D", port)
    }

    fn iptables(&self, action: &str, port: u16) -> Result<(), String> {
        let host = self.host_ip.to_string();
        let port = port.to_string();
        run(&[
            "ip", "netns", "exec", &self.name, "iptables", action, "OUTPUT", "-p", "tcp", "-d",
            &host, "--dport", &port, "-j", "DROP",
        ])
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting the namespace deletes its end of the pair, and with it the host end.
        let _ = run(&["ip", "netns", "del", &self.name]);
        let _ = run(&["ip", "link", "del", &self.host_if]);
    }
}
