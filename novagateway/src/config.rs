//! novagateway's flags; each can also be set from the environment (`NOVA_` and the flag's name).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use nova_core::limits;
use nova_proto::units::parse_bytes;
use nova_server::StoreArgs;

use crate::admission::Admission;

/// `--recycle-buffer-mib`'s default: room for a dozen encoded pages of the common size (the
/// kept set only bridges a buffer's free and the next allocation, not what reads hold).
pub const RECYCLE_BUFFER_MIB: u64 = 32;

#[derive(Debug, Clone, Parser)]
#[command(
    name = "novagateway",
    version,
    about = "Nova's read tier: serves stream reads from the object store.",
    long_about = "Nova's read tier. It serves the same Read API as a star: history it reads from \
the object store itself (refs from the star, footers and sections with ranged GETs), and reads at \
the tail it forwards to the star. Several gateways share an object cache: each object has an owner \
among them by consistent hashing with bounded loads. Stateless: start and stop instances freely.\n\n\
Every bound below is a budget: at its limit a response waits (and the wait is a metric) or a cache \
evicts; memory never grows past it."
,
    // One layout throughout: each flag's help on the lines under it.
    next_line_help = true
)]
pub struct Config {
    /// Address the gRPC API (reads, and the peer cache service) listens on.
    #[arg(long, env = "NOVA_GATEWAY_LISTEN", default_value = "127.0.0.1:7500")]
    pub listen: SocketAddr,

    /// Address the Prometheus metrics endpoint (/metrics) listens on.
    #[arg(
        long,
        env = "NOVA_GATEWAY_METRICS_ADDR",
        default_value = "127.0.0.1:7501"
    )]
    pub metrics_addr: SocketAddr,

    /// The leading star's gRPC URL: refs come from it, and reads at the tail go to it.
    #[arg(long, env = "NOVA_STAR", default_value = "http://127.0.0.1:7400")]
    pub star: String,

    /// Every gateway instance's URL, this one's included, comma-separated: the object cache
    /// tier's members. Empty: this gateway caches alone.
    #[arg(
        long,
        env = "NOVA_GATEWAY_PEERS",
        value_delimiter = ',',
        default_value = ""
    )]
    pub peers: Vec<String>,

    /// This instance's URL as it appears in --peers (default: --listen, with https:// when
    /// --tls-cert is given, else http://).
    #[arg(long, env = "NOVA_GATEWAY_ADVERTISE")]
    pub advertise: Option<String>,

    /// The local object-store directory (a star's <data-dir>/store, or its objects/ folder)
    /// when no --s3-bucket is set.
    #[arg(
        long,
        env = "NOVA_GATEWAY_STORE_DIR",
        default_value = "nova-data/store"
    )]
    pub store_dir: PathBuf,

    #[command(flatten)]
    pub store: StoreArgs,

    #[command(flatten)]
    pub listener: nova_server::net::ListenerArgs,

    /// CA certificates (PEM) the star's and the peers' certificates must chain to, for
    /// https:// URLs in --star and --peers (default: the system's roots).
    #[arg(long, env = "NOVA_UPSTREAM_CA", help_heading = "Upstream")]
    pub upstream_ca: Option<PathBuf>,

    /// Hosts (names, or *.domain; comma-separated) a star's redirect over TLS may send the
    /// gateway's calls, and its --upstream-token, to besides --star's host. Not needed with
    /// --upstream-ca: the fleet's CA vouches for its stars.
    #[arg(
        long,
        env = "NOVA_UPSTREAM_ALLOW_REDIRECT",
        value_delimiter = ',',
        help_heading = "Upstream"
    )]
    pub upstream_allow_redirect: Vec<String>,

    /// The certificate (PEM) this gateway presents to a star or peer that requires one (mutual
    /// TLS); with --upstream-key.
    #[arg(
        long,
        env = "NOVA_UPSTREAM_CERT",
        requires = "upstream_key",
        help_heading = "Upstream"
    )]
    pub upstream_cert: Option<PathBuf>,

    /// The private key of --upstream-cert (PEM).
    #[arg(
        long,
        env = "NOVA_UPSTREAM_KEY",
        requires = "upstream_cert",
        help_heading = "Upstream"
    )]
    pub upstream_key: Option<PathBuf>,

    /// The bearer token this gateway sends to its star and its peers (for stars and gateways
    /// started with --auth-tokens): it needs the read scope on every stream it serves, and on
    /// every stream (an empty prefix) for peers' object fetches. Prefer the environment
    /// variable: a flag's value shows in the process list.
    #[arg(
        long,
        env = "NOVA_UPSTREAM_TOKEN",
        hide_env_values = true,
        help_heading = "Upstream"
    )]
    pub upstream_token: Option<Secret>,

    // ---- budgets --------------------------------------------------------------------------
    /// Fetch pool: bytes of object sections being fetched for responses, across every response.
    /// A response waits for room for its first 8 sections before it fetches (the wait is a
    /// metric), and takes more only while the pool stays at most half used, ending its page
    /// sooner otherwise. A first window needing more than the whole pool is clamped to it.
    #[arg(long, env = "NOVA_FETCH_INFLIGHT", default_value = "64MiB", value_parser = parse_bytes, help_heading = "Budgets")]
    pub fetch_inflight: u64,

    /// Footer cache: decoded flight footers, weighted by their decoded size, evicted at the
    /// budget.
    #[arg(long, env = "NOVA_FOOTER_CACHE_BYTES", default_value = "32MiB", value_parser = parse_bytes, help_heading = "Budgets")]
    pub footer_cache_bytes: u64,

    /// Object cache: byte ranges of the objects this instance owns, evicted at the budget.
    #[arg(long, env = "NOVA_OBJECT_CACHE_BYTES", default_value = "256MiB", value_parser = parse_bytes, help_heading = "Budgets")]
    pub object_cache_bytes: u64,

    /// When the object cache keeps a fetched range: `repeat` on its second request (while its
    /// first is remembered), so a consumer reading history once passes through without evicting
    /// what others share, at one more GET for a range many consumers read (a section a page is
    /// expected to end in is kept at once: the next page starts there); `first` on its first
    /// request.
    #[arg(long, env = "NOVA_OBJECT_CACHE_ADMISSION", value_enum, default_value_t = Admission::Repeat, help_heading = "Budgets")]
    pub object_cache_admission: Admission,

    /// Recycled buffers: freed buffers of 128 KiB or more (fetched sections, encoded pages,
    /// connection buffers) kept resident for the next large allocation they can hold, so it is
    /// not written into freshly mapped pages (each of which faults once). A reused buffer's
    /// pages past what is asked for are returned first. When full, the oldest kept buffers are
    /// unmapped to make room. 0 keeps none.
    #[arg(long, env = "NOVA_GATEWAY_RECYCLE_BUFFER_MIB", default_value_t = RECYCLE_BUFFER_MIB, help_heading = "Budgets")]
    pub recycle_buffer_mib: u64,

    /// Bounded loads: a fetch goes to its object's owner unless the owner's in-flight claims
    /// would pass this factor times the mean; then it spills to the next instance on the ring.
    #[arg(
        long,
        env = "NOVA_OBJECT_CACHE_LOAD_FACTOR",
        default_value_t = 1.25,
        help_heading = "Budgets"
    )]
    pub object_cache_load_factor: f64,

    /// Content bytes in one read response; the page returns short at the cap.
    #[arg(long, env = "NOVA_MAX_READ_BYTES", default_value = "8MiB", value_parser = parse_bytes, help_heading = "Budgets")]
    pub max_read_bytes: u64,

    /// Records in one read response; the page returns short at the cap.
    #[arg(long, env = "NOVA_MAX_READ_RECORDS", default_value_t = limits::MAX_READ_RECORDS, help_heading = "Budgets")]
    pub max_read_records: u32,

    /// Reads in progress at once, from their arrival until their response is sent (those
    /// forwarded to the star and waiting at a stream's tail included). A read past the cap is
    /// refused at once with RESOURCE_EXHAUSTED naming the flag and a retry hint; reads in
    /// progress are never cut.
    #[arg(long, env = "NOVA_GATEWAY_MAX_READS", default_value_t = crate::read::MAX_READS, help_heading = "Budgets")]
    pub max_reads: u32,

    /// Read-ahead: bytes of the next pages of consumers reading history in order, begun once
    /// their current page has all its sections on their way, so their GETs keep a full window
    /// from page to page (charged as a page is: its sections, its encoded copy and its
    /// records' bookkeeping, and the section it starts in). A page is only read ahead when
    /// it fits at once; a read-ahead never waits for room here. A page its consumer does not
    /// ask for within 2 s is dropped. 0 (the default) turns read-ahead off. A consumer reading
    /// in order holds up to two pages here (the one being sent and the next, each charged
    /// about twice its bytes): about 4 × --max-read-bytes per consumer lets every consumer
    /// read ahead.
    #[arg(long, env = "NOVA_GATEWAY_READ_AHEAD_BYTES", default_value = crate::read_ahead::READ_AHEAD_BYTES, value_parser = parse_bytes, help_heading = "Budgets")]
    pub read_ahead_bytes: u64,

    /// Read-aheads at once, being read or waiting for their request, each with its task and
    /// its state outside --read-ahead-bytes (a consumer reading in order holds up to two). At the cap no more are started (counted in
    /// nova_gateway_read_aheads_total{outcome="cap"}); the reads themselves go on as usual. 0
    /// turns read-ahead off.
    #[arg(long, env = "NOVA_GATEWAY_MAX_READ_AHEADS", default_value_t = crate::read_ahead::MAX_READ_AHEADS, help_heading = "Budgets")]
    pub max_read_aheads: u32,

    // ---- peers ----------------------------------------------------------------------------
    /// How long a fetch from a peer may take before the peer is taken for dead.
    #[arg(long, env = "NOVA_GATEWAY_PEER_TIMEOUT_MS", default_value_t = 2000)]
    pub peer_timeout_ms: u64,

    /// How long a peer that failed is skipped (its share goes straight to the object store).
    #[arg(long, env = "NOVA_GATEWAY_DEAD_PEER_MS", default_value_t = 5000)]
    pub dead_peer_ms: u64,

    /// Print every setting as an example environment file (what
    /// ops/novagateway.env.example holds) and exit.
    #[arg(long, hide = true)]
    pub print_env_example: bool,
}

impl nova_server::process::ServerFlags for Config {
    const ENV_INTRO: &'static str = "Every novagateway setting as an environment variable, with its default: uncomment and\n\
         change what you need. Load it with `set -a; . ./novagateway.env; set +a`, or an\n\
         EnvironmentFile= line in a systemd unit. Generated from the flags by\n\
         `novagateway --print-env-example` (scripts/env-examples); a test keeps it current.\n\
         \n\
         Object-store credentials come from the standard AWS chain (AWS_ACCESS_KEY_ID and\n\
         AWS_SECRET_ACCESS_KEY, a profile, or instance metadata), not from these settings.";

    fn print_env_example(&self) -> bool {
        self.print_env_example
    }

    fn check(&self) -> Result<(), String> {
        Config::check(self)
    }
}

impl Config {
    /// What `--recycle-buffer-mib` keeps, in bytes.
    pub fn recycle_buffer_bytes(&self) -> u64 {
        self.recycle_buffer_mib.saturating_mul(limits::MIB)
    }

    /// Read-ahead's budget in bytes and its slots, or `None` when either is 0 (off).
    pub fn read_ahead(&self) -> Option<(u64, u32)> {
        (self.read_ahead_bytes > 0 && self.max_read_aheads > 0)
            .then_some((self.read_ahead_bytes, self.max_read_aheads))
    }

    /// How the gateway calls its star and its peers: TLS for https:// URLs, its token, and
    /// decoders bounded at the SDK's default.
    pub fn upstream(&self) -> anyhow::Result<nova_proto::route::Settings> {
        let tls = nova_proto::route::ClientTls::from_files(
            self.upstream_ca.as_deref(),
            self.upstream_cert
                .as_deref()
                .zip(self.upstream_key.as_deref()),
            None,
        )?;
        let credentials = match &self.upstream_token {
            Some(Secret(token)) => nova_proto::route::Credentials::bearer(token)
                .map_err(|e| anyhow::anyhow!("--upstream-token: {e}"))?,
            None => nova_proto::route::Credentials::none(),
        };
        Ok(nova_proto::route::Settings {
            connect_timeout: Duration::from_secs(5),
            credentials,
            tls,
            redirect_hosts: self.upstream_allow_redirect.clone(),
            ..nova_proto::route::Settings::default()
        })
    }

    pub fn advertise(&self) -> String {
        let scheme = if self.listener.tls_cert.is_some() {
            "https"
        } else {
            "http"
        };
        self.advertise
            .clone()
            .unwrap_or_else(|| format!("{scheme}://{}", self.listen))
    }

    /// The tier's members: --peers, or just this instance.
    pub fn members(&self) -> Vec<String> {
        let peers: Vec<String> = self
            .peers
            .iter()
            .map(|p| p.trim().to_owned())
            .filter(|p| !p.is_empty())
            .collect();
        if peers.is_empty() {
            vec![self.advertise()]
        } else {
            peers
        }
    }

    pub fn peer_timeout(&self) -> Duration {
        Duration::from_millis(self.peer_timeout_ms)
    }

    pub fn dead_peer(&self) -> Duration {
        Duration::from_millis(self.dead_peer_ms)
    }

    pub fn check(&self) -> Result<(), String> {
        if self.max_reads == 0 {
            return Err("--max-reads must be at least 1".into());
        }
        // Peers are called with the upstream token: never in plain text when the gateway's
        // calls to its star are encrypted.
        let me = self.advertise();
        if self.star.starts_with("https://")
            && self.upstream_token.is_some()
            && let Some(peer) = self
                .members()
                .iter()
                .find(|p| **p != me && p.starts_with("http://"))
        {
            return Err(format!(
                "--star is https:// but the tier member {peer} is plain http://: give the \
                 other --peers as https:// URLs"
            ));
        }
        if self.object_cache_load_factor < 1.0 {
            return Err("--object-cache-load-factor must be at least 1".into());
        }
        if self.fetch_inflight == 0 {
            return Err("--fetch-inflight must be more than 0".into());
        }
        let members = self.members();
        if !members.contains(&self.advertise()) {
            return Err(format!(
                "--peers ({}) must include this instance's URL {} (set --advertise)",
                members.join(","),
                self.advertise()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// One layout throughout, and nothing a gateway does not do: it writes no flights, so its
    /// help describes no flight-write retries.
    #[test]
    fn help_has_one_layout_and_only_what_a_gateway_does() {
        for help in [
            Config::command().render_help().to_string(),
            Config::command().render_long_help().to_string(),
        ] {
            assert_eq!(
                nova_testkit::help::flag_lines_with_help(&help),
                Vec::<&str>::new()
            );
            assert!(!help.to_lowercase().contains("flight write"), "{help}");
        }
    }

    #[test]
    fn defaults_match_the_spec() {
        let config = Config::parse_from(["novagateway"]);
        assert_eq!(config.fetch_inflight, 64 << 20);
        assert_eq!(config.footer_cache_bytes, 32 << 20);
        assert_eq!(config.recycle_buffer_mib, 32);
        assert_eq!(config.read_ahead_bytes, 0, "read-ahead is opt-in");
        assert_eq!(config.max_read_aheads, 64);
        assert_eq!(config.object_cache_load_factor, 1.25);
        assert_eq!(config.object_cache_admission, Admission::Repeat);
        assert_eq!(config.members(), ["http://127.0.0.1:7500"]);
        assert!(config.check().is_ok());
        Config::command().debug_assert();
        let help = Config::command().render_long_help().to_string();
        for flag in [
            "--fetch-inflight",
            "--footer-cache-bytes",
            "--object-cache-load-factor",
            "--object-cache-admission",
            "--read-ahead-bytes",
            "--max-read-aheads",
            "NOVA_FETCH_INFLIGHT",
            "NOVA_GATEWAY_READ_AHEAD_BYTES",
        ] {
            assert!(help.contains(flag), "{flag} missing from --help");
        }
    }

    #[test]
    fn a_gateway_calling_its_star_over_tls_calls_no_peer_in_plain_text() {
        let tls_star = [
            "novagateway",
            "--star",
            "https://star:7400",
            "--upstream-token",
            "t0ken",
        ];
        // Alone, it calls no peer.
        assert!(Config::parse_from(tls_star).check().is_ok());
        let with_peers = |peers: &str| {
            let mut args = tls_star.to_vec();
            args.extend(["--advertise", "https://gw-0:7500", "--peers", peers]);
            Config::parse_from(args).check()
        };
        assert!(with_peers("https://gw-0:7500,https://gw-1:7500").is_ok());
        let err = with_peers("https://gw-0:7500,http://gw-1:7500").unwrap_err();
        assert!(err.contains("http://gw-1:7500"), "{err}");
    }

    /// ops/novagateway.env.example is what the flags make of it now.
    #[test]
    fn the_example_env_file_is_generated_from_the_flags() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ops/novagateway.env.example");
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        nova_server::envdoc::check_current(
            "ops/novagateway.env.example",
            &on_disk,
            &<Config as nova_server::process::ServerFlags>::env_example(),
            "scripts/env-examples",
        );
    }

    #[test]
    fn peers_must_include_this_instance() {
        let config = Config::parse_from([
            "novagateway",
            "--peers",
            "http://a:1,http://b:2",
            "--advertise",
            "http://c:3",
        ]);
        assert!(config.check().is_err());
        let config = Config::parse_from([
            "novagateway",
            "--peers",
            "http://a:1,http://b:2",
            "--advertise",
            "http://b:2",
        ]);
        assert!(config.check().is_ok());
    }
}

/// A token from the command line or the environment: its `Debug` (the config's) never shows it.
#[derive(Clone)]
pub struct Secret(pub String);

impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self(s.to_owned()))
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}
