//! Where a process's memory ceiling comes from: the cgroup it runs in (v2 `memory.max`, or v1
//! `memory.limit_in_bytes`) when that sets a limit, else a share of physical memory.

use std::path::Path;

use nova_core::metrics::{counter, gauge, register};
use prometheus::{Gauge, IntCounter, IntGauge, Registry};

pub use nova_core::formula::{Ceiling, CeilingSource};

/// The share of physical memory used as the ceiling when no cgroup limit applies.
pub const PHYSICAL_SHARE: f64 = 0.6;

/// cgroup v1 reports "no limit" as a huge page-aligned number; anything at or above this is
/// treated as unlimited.
const V1_UNLIMITED: u64 = 1 << 62;

/// The ceiling for this process: `explicit` when given (capped to the cgroup limit when above
/// it), else the cgroup limit, else 60% of physical memory.
pub fn detect_ceiling(explicit: Option<u64>) -> Ceiling {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    choose_ceiling(explicit, cgroup_limit(&cgroups, Path::new("/")))
}

/// The cgroup's memory limit, v2 or v1, when one is set.
fn cgroup_limit(cgroups: &str, root: &Path) -> Option<Ceiling> {
    if let Some(bytes) = cgroup_v2_limit(cgroups, root) {
        return Some(Ceiling {
            bytes,
            source: CeilingSource::CgroupV2,
        });
    }
    cgroup_v1_limit(cgroups, root).map(|bytes| Ceiling {
        bytes,
        source: CeilingSource::CgroupV1,
    })
}

fn choose_ceiling(explicit: Option<u64>, limit: Option<Ceiling>) -> Ceiling {
    match (explicit, limit) {
        (Some(asked), Some(limit)) if asked > limit.bytes => Ceiling {
            bytes: limit.bytes,
            source: CeilingSource::Capped { asked },
        },
        (Some(bytes), _) => Ceiling {
            bytes,
            source: CeilingSource::Explicit,
        },
        (None, Some(limit)) => limit,
        (None, None) => physical(),
    }
}

fn physical() -> Ceiling {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|meminfo| mem_total(&meminfo))
        .unwrap_or(4 << 30);
    Ceiling {
        bytes: (total as f64 * PHYSICAL_SHARE) as u64,
        source: CeilingSource::Physical,
    }
}

/// The v2 limit: the unified hierarchy's line is `0::/path`.
fn cgroup_v2_limit(cgroups: &str, root: &Path) -> Option<u64> {
    let path = cgroups
        .lines()
        .find_map(|line| line.strip_prefix("0::"))?
        .trim_start_matches('/');
    let file = root.join("sys/fs/cgroup").join(path).join("memory.max");
    parse_limit(&std::fs::read_to_string(file).ok()?)
}

/// The v1 limit: the memory controller's line is `N:memory:/path` (possibly with other
/// controllers listed beside it).
fn cgroup_v1_limit(cgroups: &str, root: &Path) -> Option<u64> {
    let path = cgroups.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let _id = parts.next()?;
        let controllers = parts.next()?;
        let path = parts.next()?;
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then_some(path.trim_start_matches('/'))
    })?;
    let file = root
        .join("sys/fs/cgroup/memory")
        .join(path)
        .join("memory.limit_in_bytes");
    parse_limit(&std::fs::read_to_string(file).ok()?)
}

/// A limit file's value, or `None` when it says there is no limit.
fn parse_limit(text: &str) -> Option<u64> {
    let text = text.trim();
    if text == "max" {
        return None;
    }
    let bytes: u64 = text.parse().ok()?;
    (bytes < V1_UNLIMITED).then_some(bytes)
}

fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// A process's resident and peak resident memory from `/proc/<pid>/status`, in bytes.
pub fn resident_bytes(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// CPU time this process has used (user + system), in seconds, from `/proc/self/stat`.
pub fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no memory-safety preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (ticks > 0).then(|| (utime + stime) as f64 / ticks as f64)
}

/// The process's own resource use and its allocator's figures, refreshed at each scrape. The
/// star and the gateway export them under the same names.
#[derive(Debug, Clone)]
pub struct ProcessMetrics {
    pub resident: IntGauge,
    pub peak_resident: IntGauge,
    pub cpu_seconds: Gauge,
    pub allocated: IntGauge,
    pub mapped: IntGauge,
    pub retained: IntGauge,
    /// Times free memory was returned to the system (`nova_core::allocator::trim_periodically`).
    pub trims: IntCounter,
}

impl ProcessMetrics {
    pub fn register(r: &Registry) -> Self {
        Self {
            resident: gauge(r, "nova_process_resident_bytes", "Resident memory (VmRSS)."),
            peak_resident: gauge(
                r,
                "nova_process_peak_resident_bytes",
                "Peak resident memory since start (VmHWM).",
            ),
            cpu_seconds: register(
                r,
                Gauge::new(
                    "nova_process_cpu_seconds_total",
                    "CPU time used, user and system, in seconds.",
                )
                .expect("valid metric"),
            ),
            allocated: gauge(
                r,
                "nova_allocator_allocated_bytes",
                "Memory the process has allocated and not freed.",
            ),
            mapped: gauge(
                r,
                "nova_allocator_mapped_bytes",
                "Memory the allocator has taken from the system: its arenas and the large \
                 buffers mapped on their own.",
            ),
            retained: gauge(
                r,
                "nova_allocator_retained_bytes",
                "Memory freed by the process but held in the allocator's arenas: resident \
                 unless a trim returned its pages (a trim does not lower this figure).",
            ),
            trims: counter(
                r,
                "nova_allocator_trims_total",
                "Times the allocator's free memory was returned to the system (malloc_trim).",
            ),
        }
    }

    pub fn refresh(&self) {
        if let Some((rss, peak)) = resident_bytes(std::process::id()) {
            self.resident.set(rss as i64);
            self.peak_resident.set(peak as i64);
        }
        if let Some(cpu) = cpu_seconds() {
            self.cpu_seconds.set(cpu);
        }
        if let Some(stats) = nova_core::allocator::stats() {
            // glibc counts freed buffers kept for reuse (the gateway's --recycle-buffer-mib) as
            // in use; to the program they are freed.
            let kept = nova_core::allocator::reuse::stats().held;
            self.allocated
                .set(stats.allocated.saturating_sub(kept) as i64);
            self.mapped.set(stats.mapped as i64);
            self.retained.set(stats.retained as i64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_root(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (path, content) in files {
            let full = dir.path().join(path);
            std::fs::create_dir_all(full.parent().unwrap()).unwrap();
            std::fs::write(full, content).unwrap();
        }
        dir
    }

    #[test]
    fn reads_a_v2_limit_and_ignores_max() {
        let root = fake_root(&[
            ("sys/fs/cgroup/app/memory.max", "536870912\n"),
            ("sys/fs/cgroup/free/memory.max", "max\n"),
        ]);
        assert_eq!(cgroup_v2_limit("0::/app\n", root.path()), Some(512 << 20));
        assert_eq!(cgroup_v2_limit("0::/free\n", root.path()), None);
        assert_eq!(cgroup_v2_limit("4:memory:/app\n", root.path()), None);
    }

    #[test]
    fn reads_a_v1_limit_and_ignores_the_unlimited_value() {
        let root = fake_root(&[
            (
                "sys/fs/cgroup/memory/nova/memory.limit_in_bytes",
                "268435456\n",
            ),
            (
                "sys/fs/cgroup/memory/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
        ]);
        let cgroups = "9:name=systemd:/\n4:cpu,memory:/nova\n";
        assert_eq!(cgroup_v1_limit(cgroups, root.path()), Some(256 << 20));
        assert_eq!(cgroup_v1_limit("4:memory:/\n", root.path()), None);
    }

    #[test]
    fn an_explicit_ceiling_above_the_cgroup_limit_is_capped_to_it() {
        let cgroup = Ceiling {
            bytes: 1 << 30,
            source: CeilingSource::CgroupV2,
        };
        let limit = Some(cgroup);
        let capped = choose_ceiling(Some(4 << 30), limit);
        assert_eq!(capped.bytes, 1 << 30);
        assert_eq!(capped.source, CeilingSource::Capped { asked: 4 << 30 });
        let below = choose_ceiling(Some(512 << 20), limit);
        assert_eq!(below.bytes, 512 << 20);
        assert_eq!(below.source, CeilingSource::Explicit);
        assert_eq!(choose_ceiling(None, limit), cgroup);
        assert_eq!(
            choose_ceiling(Some(8 << 30), None).source,
            CeilingSource::Explicit
        );
    }

    #[test]
    fn this_process_reports_its_memory_and_cpu() {
        let (rss, peak) = resident_bytes(std::process::id()).unwrap();
        assert!(rss > 0 && peak >= rss);
        assert!(cpu_seconds().unwrap() >= 0.0);
    }

    #[test]
    fn an_explicit_ceiling_wins_and_physical_memory_is_the_fallback() {
        let explicit = detect_ceiling(Some(123));
        assert_eq!(explicit.bytes, 123);
        assert_eq!(explicit.source, CeilingSource::Explicit);
        assert_eq!(
            mem_total("MemTotal:       1000 kB\nMemFree: 1 kB\n"),
            Some(1_024_000)
        );
    }
}
