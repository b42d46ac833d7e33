//! Wiring: storage backends, recovery, the gRPC server, the metrics endpoint, and an orderly
//! shutdown on SIGTERM or ctrl-c.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use nova_chain::Star;
use nova_chain::metrics::Metrics;
use nova_core::clock::Clock;
use nova_core::metastore::{
    EmbeddedMetastore, EtcdMetastore, EtcdOptions, Metastore, MetastoreError,
};
use nova_core::object_store::ObjectStore;
use nova_core::supervisor::Supervisor;
use nova_proto::server::nova_server::NovaServer;
use nova_proto::units::{ByteSize, human_bytes};
use nova_server::memory::{ProcessMetrics, detect_ceiling};
use nova_server::shed::ShedLog;

use crate::advertise::Reached;
use crate::config::Config;
use crate::service::caps::{self, Cap};
use crate::service::charge::{ChargeLayer, TransportLimits};
use crate::service::{Context, NovaService};

mod open;

use open::{join_fleet, open_metastore, open_store};

/// The store may fail this long before the star reads not ready (a single failed write is
/// ordinary; seconds of them are an outage).
const STORE_FAILING_NOT_READY_AFTER: Duration = Duration::from_secs(2);

/// `novad --rebuild-catalog`: restores the catalog from the object store, then exits.
pub async fn rebuild(config: Config) -> anyhow::Result<()> {
    let metastore = open_metastore(&config).await?;
    let store = open_store(&config).await?;
    tracing::info!(
        star = %config.star_id,
        store = %store.describe(),
        metastore = %metastore.describe(),
        "rebuilding the catalog from the object store"
    );
    let catalog = nova_core::catalog::Catalog::new(metastore);
    let report =
        nova_chain::rebuild::rebuild_catalog(&config.star_id, &store, &catalog, Clock::system())
            .await
            .context("rebuilding the catalog")?;
    tracing::info!(
        streams = report.streams,
        deleted_streams = report.deleted_streams,
        streams_without_manifest = report.streams_without_manifest,
        epochs = report.epochs,
        flights = report.flights,
        records = report.records,
        orphaned_slots = report.orphaned_slots,
        "catalog rebuilt; start novad with the same flags to serve it"
    );
    Ok(())
}

/// Probes the address this fleet star advertises, a few times while the listener settles.
/// Another server there is a misconfiguration redirects would bounce on: the reason to stop.
/// Nothing there is a warning and the star goes on: some networks do not let a host reach
/// itself through the address its clients use (a load balancer without hairpinning, names
/// published only once the star is ready).
async fn check_advertised(advertise: &str, star: &str, started_at_ms: u64) -> Option<String> {
    let mut last = String::new();
    for attempt in 0..3 {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        match crate::advertise::probe(advertise, star, started_at_ms).await {
            Reached::Itself => return None,
            Reached::Busy { why } => {
                tracing::info!(
                    advertise,
                    "a Nova server at the advertised address is too busy to say which it is \
                     ({why}); not checked"
                );
                return None;
            }
            Reached::Other { what } => {
                return Some(format!(
                    "--advertise-addr {advertise} reaches {what}, not this star: the fleet \
                     would redirect this star's clients there. Give the address clients reach \
                     this star at"
                ));
            }
            Reached::Nothing { error } => last = error,
        }
    }
    tracing::warn!(
        advertise,
        "this star cannot reach itself at its advertised address ({last}); the fleet redirects \
         clients there, so if they cannot reach it there either, every redirect to this star \
         fails: check --advertise-addr"
    );
    None
}

pub async fn run(config: Config) -> anyhow::Result<()> {
    nova_server::net::take_hangups();
    if config.rebuild_catalog {
        return rebuild(config).await;
    }
    let metastore = open_metastore(&config).await?;
    let started_at_ms = Clock::system().unix_ms();
    let metrics = Arc::new(Metrics::new());
    nova_core::metrics::register_build_info(
        &metrics.registry,
        "nova",
        env!("CARGO_PKG_VERSION"),
        started_at_ms as f64 / 1000.0,
    );
    let ceiling = detect_ceiling(config.memory_ceiling.map(ByteSize::bytes));
    if let nova_server::memory::CeilingSource::Capped { asked } = ceiling.source {
        // The kernel kills at the container's limit whatever the flag says: budgets checked
        // against the flag would fit a memory the star does not have.
        tracing::warn!(
            asked = %human_bytes(asked),
            limit = %human_bytes(ceiling.bytes),
            "--memory-ceiling is above the container's memory limit; the limit is the ceiling"
        );
    }
    let memory = Arc::new(crate::memory::model(
        &config,
        ceiling,
        metrics.memory.clone(),
    ));
    let worst = memory.at_session_cap();
    tracing::info!(
        ceiling = %human_bytes(ceiling.bytes),
        ceiling_source = %ceiling.source,
        formula_at_session_cap = %human_bytes(worst.total()),
        admission = %human_bytes(worst.admission),
        express = %human_bytes(worst.express),
        read = %human_bytes(worst.read),
        tail_cache = %human_bytes(worst.tail_cache),
        recycle = %human_bytes(worst.recycle),
        transport_at_session_cap = %human_bytes(worst.transport),
        auditor = %human_bytes(worst.auditor),
        "memory ceiling"
    );
    if let Err(problem) = memory.check_fits() {
        if !config.allow_memory_overcommit {
            return Err(anyhow::anyhow!(problem));
        }
        tracing::warn!("--allow-memory-overcommit: starting anyway: {problem}");
    }
    // Certificates and tokens are read before anything else starts: a bad file stops the
    // star with the reason, not a listener that refuses every client.
    let security_metrics = nova_server::net::SecurityMetrics::register(&metrics.registry, "nova");
    let security = config
        .listener
        .load(&security_metrics)
        .context("loading --tls-cert/--auth-tokens")?;
    config.listener.warn_if_exposed(
        config.listen,
        "novad",
        "append to, read, reconfigure and delete every stream",
    );
    let connections = Arc::new(nova_server::net::Connections::default());
    // Every critical task of the process (the chain's, the auditor's, the fleet's, the servers')
    // is watched: the first to stop or panic unasked shuts novad down, named in the log.
    let supervisor = Supervisor::new();
    let stopping = CancellationToken::new();
    // The process's own figures (resident memory, CPU, the allocator's), beside the star's.
    let process = ProcessMetrics::register(&metrics.registry);
    supervisor.watch(
        "allocator trim",
        stopping.clone(),
        nova_core::allocator::trim_periodically(Clock::system(), process.trims.clone()),
    );
    let store = open_store(&config).await?;
    security.spawn_reloads(&stopping);
    let catalog = nova_core::catalog::Catalog::new(metastore.clone());

    // Metrics are up before recovery, so a star stuck retrying an unreachable store is visible.
    let ready: Arc<OnceLock<Arc<Star>>> = Arc::new(OnceLock::new());
    let fleet_metrics = nova_fleet::FleetMetrics::new(&metrics.registry)?;
    let alone = !metastore.capabilities().shared;
    if alone {
        fleet_metrics.alone(0);
    }
    let sessions_open: Arc<OnceLock<Arc<Context>>> = Arc::new(OnceLock::new());
    let refresh: Arc<dyn Fn() + Send + Sync> = {
        let ready = ready.clone();
        let memory = memory.clone();
        let sessions_open = sessions_open.clone();
        let process = process.clone();
        let fleet_metrics = fleet_metrics.clone();
        Arc::new(move || {
            if let Some(star) = ready.get() {
                star.refresh_gauges();
                if alone {
                    fleet_metrics.alone(star.streams().len());
                }
            }
            let open = sessions_open.get().map_or(0, |ctx| ctx.sessions.in_use());
            memory.update(open);
            process.refresh();
        })
    };
    let render: nova_server::process::RenderMetrics = {
        let refresh = refresh.clone();
        let metrics = metrics.clone();
        Arc::new(move || {
            refresh();
            metrics.render()
        })
    };
    supervisor.watch(
        "metastore size",
        stopping.clone(),
        watch_metastore_size(
            metastore.clone(),
            metrics.metastore_size.clone(),
            stopping.clone(),
        ),
    );
    let metrics_listener = nova_server::process::bind_metrics(config.metrics_addr).await?;
    let metrics_task = supervisor.watch_fallible(
        "metrics server",
        stopping.clone(),
        nova_server::process::serve_metrics(metrics_listener, render, stopping.clone()),
    );

    // One signal listener for the whole start: once first polled it keeps a SIGTERM that
    // arrives between two waits, where a listener made for each wait would miss it.
    let mut terminated = std::pin::pin!(nova_server::process::termination());

    // In a fleet the star registers before recovery, so that a second live star with its id
    // is refused before either touches the chain.
    let fleet = if metastore.capabilities().shared {
        let fleet_config = nova_fleet::FleetConfig {
            star_id: config.star_id.clone(),
            advertise: config.advertise(),
            // Checked at start-up (`KafkaArgs::check`).
            kafka_advertise: match config.kafka.advertised() {
                Ok(Some((host, port))) => format!("{host}:{port}"),
                _ => String::new(),
            },
            lease_ttl: Duration::from_secs(config.lease_ttl_secs),
            supervisor: supervisor.clone(),
        };
        let joining = join_fleet(&metastore, &store, fleet_config, fleet_metrics);
        Some(tokio::select! {
            fleet = joining => fleet?,
            reason = supervisor.failed() => {
                return Err(anyhow::anyhow!("{reason}; stopped while joining the fleet"));
            }
            _ = &mut terminated => {
                tracing::info!("stopped while joining the fleet; nothing was accepted");
                return Ok(());
            }
        })
    } else {
        None
    };
    tracing::info!(
        store = %store.describe(),
        metastore = %metastore.describe(),
        "recovering before accepting appends"
    );
    let mut chain = config.chain();
    chain.express = crate::express::open_zones(&config).await?;
    if fleet.is_some() {
        chain.leaders = Some(Arc::new(nova_fleet::LeaderRecords::new(metastore.clone())));
    }
    if let Some(express) = &chain.express {
        tracing::info!(
            zones = express.zones.len(),
            quorum = express.zones.quorum(),
            publish_deadline_ms = express.publish_deadline.as_millis() as u64,
            "express zone buckets ready"
        );
    }
    let star = tokio::select! {
        star = Star::open_supervised(
            chain,
            store.clone(),
            metastore,
            metrics.clone(),
            supervisor.clone(),
        ) => Arc::new(star?),
        reason = supervisor.failed() => {
            return Err(anyhow::anyhow!("{reason}; stopped during recovery, nothing was accepted"));
        }
        _ = &mut terminated => {
            tracing::info!("stopped during recovery; nothing was accepted");
            return Ok(());
        }
    };
    let _ = ready.set(star.clone());
    // Whatever the star is doing when its fleet lease is lost (starting, serving, draining),
    // it acknowledges nothing more from then on: a survivor may take its chain over.
    let fence_on_lost_lease = fleet.as_ref().map(|fleet| {
        let (fleet, star) = (fleet.clone(), star.clone());
        tokio::spawn(async move {
            let reason = fleet.lost().await;
            star.fence(reason);
        })
    });
    // After recovery: the auditor settles what the star has absorbed, never ahead of it.
    let auditor = if config.auditor {
        Some(
            nova_auditor::Auditor::start_supervised(
                config.auditor(),
                store.clone(),
                catalog,
                &metrics.registry,
                &supervisor,
            )
            .with_context(|| {
                format!(
                    "preparing the auditor's fetch cache under {}",
                    config.data_dir.display()
                )
            })?,
        )
    } else {
        tracing::warn!("--auditor false: nothing is settled or collected; the bucket only grows");
        None
    };
    if let Some(fleet) = &fleet {
        fleet.start_takeovers(nova_fleet::TakeoverContext {
            star: star.clone(),
            store: store.clone(),
            backoff: config.chain().backoff(),
            max_streams: config.max_streams as usize,
            adoptions: auditor.as_ref().map(|a| a.adoptions()),
        });
        fleet.start_balancing(star.clone());
    }

    let sheds = Arc::new(ShedLog::new(Clock::system()));
    let ctx = Arc::new(Context {
        star: star.clone(),
        fleet: fleet.clone(),
        caps: config.caps(),
        max_read_bytes: config.max_read_bytes.bytes(),
        max_read_records: config.max_read_records,
        sessions: Cap::new(
            caps::PRODUCER_SESSIONS,
            config.max_producer_sessions,
            metrics.producer_sessions.clone(),
            &metrics.producer_sessions_capacity,
            metrics.clone(),
            sheds.clone(),
        ),
        subscriptions: Cap::new(
            caps::SUBSCRIPTIONS,
            config.max_subscriptions,
            metrics.subscriptions.clone(),
            &metrics.subscriptions_capacity,
            metrics.clone(),
            sheds.clone(),
        ),
        read_shares: nova_server::net::shares::Shares::of(
            config.read_memory_mib * nova_core::limits::MIB,
            config.listener.max_client_share_percent,
        ),
        subscription_shares: nova_server::net::shares::Shares::of(
            config.max_subscriptions as u64,
            config.listener.max_client_share_percent,
        ),
        lookup_shares: nova_server::net::shares::Shares::of(
            nova_core::metastore::ETCD_MAX_INFLIGHT as u64,
            config.listener.max_client_share_percent,
        ),
        metrics: metrics.clone(),
        sheds,
        shutdown: stopping.clone(),
        access: nova_server::net::Access::new(&security_metrics),
        kafka: std::sync::OnceLock::new(),
        identity: crate::service::info::Identity {
            version: env!("CARGO_PKG_VERSION"),
            started_at_ms,
            store: store.describe(),
            max_message_bytes: config.max_message_bytes() as u64,
        },
    });
    let _ = sessions_open.set(ctx.clone());
    // Saturation moves with the sessions open; keep it current between scrapes.
    tokio::spawn({
        let refresh = refresh.clone();
        let stopping = stopping.clone();
        let fleet = fleet.clone();
        let memory = memory.clone();
        async move {
            let mut ticker = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = ticker.tick() => {
                        refresh();
                        // Published with the next lease renewal: a saturated star takes no
                        // new leadership.
                        if let Some(fleet) = &fleet {
                            fleet.set_saturated(memory.is_saturated());
                        }
                    }
                    _ = stopping.cancelled() => return,
                }
            }
        }
    });
    let max_message = config.max_message_bytes();
    let (access, shed_log) = (ctx.access.clone(), ctx.sheds.clone());
    let kafka_ctx = ctx.clone();
    // Each token's share of the admission buffer while its requests arrive, for gRPC appends
    // and Kafka requests alike.
    let receiving = nova_server::net::shares::Shares::of(
        star.admission().budget().capacity(),
        config.listener.max_client_share_percent,
    );
    let nova = NovaServer::new(NovaService::new(ctx))
        .max_decoding_message_size(max_message)
        .max_encoding_message_size(max_message.max(config.max_read_bytes.bytes() as usize * 2));
    let (health, health_service) = tonic_health::server::health_reporter();
    // tonic-health starts the overall service as SERVING: not until readiness says so.
    set_health(&health, false).await;
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(nova_proto::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(nova_proto::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;

    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {} (--listen)", config.listen))?;
    // One cap on connections for both listeners.
    let places = nova_server::net::conn::Places::new(&config.listener.limits());
    let kafka_listener = match config.kafka.kafka_listen {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} (--kafka-listen)"))?,
        ),
        None => None,
    };
    let listening = listener.local_addr().unwrap_or(config.listen);
    let window = config.grpc_stream_window_kib * 1024;
    let server = config
        .listener
        .configure(tonic::transport::Server::builder())
        // Pinned windows: each stream buffers at most `window` bytes ahead of its handler, and
        // the adaptive window that would grow it under load is off.
        .initial_stream_window_size(window)
        // The connection's window must never bind before the streams' do: a session whose
        // charge was granted needs the rest of its message, and other sessions' data waiting
        // unread for their charges must not use up the window it arrives through. Each stream
        // still buffers at most its own window, so sessions × window bounds the transport.
        .initial_connection_window_size(connection_window(window, config.max_producer_sessions))
        .http2_adaptive_window(Some(false))
        // Every call counted by method and code, and timed (outermost, so it sees them all),
        // its connection marked busy while it runs.
        .layer(nova_proto::rpc::RpcLayer::new(
            nova_server::net::CallObserver {
                rpc: metrics.rpc.clone(),
                connections: connections.clone(),
                tokens: security.tokens.clone(),
            },
            Clock::system(),
        ))
        // Then its token, before anything of it is charged or handled.
        .layer(nova_server::net::AuthLayer::new(
            security.tokens.clone(),
            &security_metrics,
        ))
        // A read's charge is held until its response is sent.
        .layer(nova_server::net::hold::HoldLayer::new(connections.clone()))
        // Appends are charged from their length prefix, before tonic buffers them.
        .layer(ChargeLayer::sharing(
            star.admission().clone(),
            TransportLimits {
                max_message: config.max_message_bytes() as u64,
                largest_fragment: config.largest_fragment(),
            },
            access,
            nova_server::net::small::SmallMessages::new(
                metrics
                    .sheds
                    .with_label_values(&[nova_server::net::small::SHED_LABEL]),
                shed_log,
                config.listener.max_client_share_percent,
                security.tokens.is_some(),
            ),
            receiving.clone(),
            nova_server::net::recycle::Recycler::new(
                config.recycle_buffer_bytes() as usize,
                nova_server::net::recycle::RecycleMetrics::register(&metrics.registry),
            ),
        ))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(nova)
        .serve_with_incoming_shutdown(
            nova_server::net::conn::incoming_within(
                listener,
                security.tls.clone(),
                config.listener.limits(),
                places.clone(),
                connections.clone(),
                security_metrics.connections.clone(),
                stopping.clone(),
            ),
            stopping.clone().cancelled_owned(),
        );
    let mut server = tokio::spawn(server);
    if let (Some(listener), Ok(Some((host, port)))) = (kafka_listener, config.kafka.advertised()) {
        let kafka = Arc::new(crate::kafka::Kafka {
            ctx: kafka_ctx,
            node_id: crate::kafka::node_id_of(&config.star_id),
            host,
            port,
            auto_create_partitions: config.kafka.kafka_auto_create_partitions,
            max_produce_bytes: config.max_message_bytes() as u64,
            metrics: crate::kafka::KafkaMetrics::register(&metrics.registry)?,
            producers: crate::kafka::Producers::default(),
            receiving,
            groups: crate::kafka::Coordinator::new(Clock::system()),
            tokens: security.tokens.clone(),
        });
        let groups: Arc<dyn crate::service::groups::KafkaGroups> = kafka.clone();
        let _ = kafka.ctx.kafka.set(Arc::downgrade(&groups));
        let kafka_addr = listener.local_addr().ok();
        supervisor.watch(
            "kafka listener",
            stopping.clone(),
            crate::kafka::serve(
                kafka,
                listener,
                crate::kafka::Listening {
                    tls: security.tls.clone(),
                    limits: config.listener.limits(),
                    places,
                    // Its own map: a client port connected to both listeners is two
                    // connections.
                    connections: Arc::new(nova_server::net::Connections::default()),
                    metrics: security_metrics.connections.clone(),
                },
                stopping.clone(),
            ),
        );
        tracing::info!(listen = ?kafka_addr, "Kafka listener serving");
    }
    let lease_lost = async {
        match &fleet {
            Some(fleet) => fleet.lost().await,
            None => std::future::pending().await,
        }
    };
    let mut lease_lost = std::pin::pin!(lease_lost);
    let server_ended = |result: Result<
        Result<(), tonic::transport::Error>,
        tokio::task::JoinError,
    >| match result {
        Ok(Ok(())) => "the gRPC server stopped".to_owned(),
        Ok(Err(e)) => format!("the gRPC server failed: {e}"),
        Err(e) => format!("the gRPC server task failed: {e}"),
    };

    // Leadership is placed here (and the star reads ready) only once its advertised address
    // is known to lead here, or cannot be checked. A signal, a lost lease or a failure while
    // the probe runs is acted on at once.
    let advertised = async {
        let Some(fleet) = &fleet else {
            return None;
        };
        let checkable = security.tls.is_none() && security.tokens.is_none();
        if !checkable {
            tracing::info!(
                advertise = %config.advertise(),
                "the advertised address is not checked: with TLS or tokens the start-up probe \
                 could not tell which server answers"
            );
        } else if let Some(misdirected) =
            check_advertised(&config.advertise(), &config.star_id, started_at_ms).await
        {
            return Some(misdirected);
        }
        // Recovered and listening: leadership may be placed here from now on.
        fleet.ready().await;
        None
    };
    let stopped_early: Option<Option<String>> = tokio::select! {
        misdirected = advertised => misdirected.map(Some),
        _ = &mut terminated => Some(None),
        reason = star.failed() => Some(Some(reason)),
        reason = &mut lease_lost => {
            star.fence(reason.clone());
            Some(Some(reason))
        }
        result = &mut server => Some(Some(server_ended(result))),
    };
    let failure = match stopped_early {
        Some(failure) => failure,
        None => {
            supervisor.watch(
                "readiness",
                stopping.clone(),
                report_readiness(
                    star.clone(),
                    health.clone(),
                    metrics.clone(),
                    stopping.clone(),
                ),
            );
            tracing::info!(
                listen = %listening,
                tls = security.tls.is_some(),
                mutual_tls = config.listener.tls_client_ca.is_some(),
                tokens = security.tokens.as_ref().map_or(0, |t| t.len()),
                max_connections = config.listener.max_connections,
                "novad accepting appends"
            );
            tokio::select! {
                _ = &mut terminated => None,
                reason = star.failed() => Some(reason),
                reason = &mut lease_lost => {
                    // A successor may take the chain over from here: acknowledge nothing more.
                    star.fence(reason.clone());
                    Some(reason)
                }
                result = &mut server => Some(server_ended(result)),
            }
        }
    };
    if let Some(reason) = &failure {
        tracing::error!("{reason}; shutting down");
    }

    tracing::info!(
        "shutting down: refusing new sessions, landing and absorbing the flights in flight"
    );
    stopping.cancel();
    if let Some(fleet) = &fleet {
        fleet.set_draining().await;
    }
    set_health(&health, false).await;
    metrics.ready.set(0);
    if let Some(auditor) = auditor {
        // Cut off wherever its jobs are: each is safe to stop at any point.
        auditor.stop().await;
    }
    // A star that stopped acknowledging has nothing left to land that it could acknowledge;
    // whatever it holds is settled by whoever owns its chain next.
    let deadline = match star.fenced() {
        Some(_) => Duration::from_secs(1),
        None => Duration::from_secs(config.shutdown_timeout_secs),
    };
    let drained = star.shutdown(deadline).await;
    // Sessions end once their last answers are out; the server then stops.
    if !server.is_finished() {
        tracing::info!(
            "shutting down: waiting up to 5 s for the calls still open (append sessions whose \
             clients have not closed them) to end"
        );
        let _ = tokio::time::timeout(Duration::from_secs(5), &mut server).await;
    }
    server.abort();
    if let Some(watch) = fence_on_lost_lease {
        // Leaving ends the lease on purpose.
        watch.abort();
    }
    if let Some(fleet) = &fleet {
        // A star that stopped acknowledging (fenced, or its lease lapsed) may hold acknowledged
        // flights it could not absorb: its chain stays registered for a survivor to settle.
        fleet
            .leave(drained.is_ok() && star.fenced().is_none())
            .await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(2), metrics_task).await;
    match (drained, failure) {
        (Ok(()), None) => {
            tracing::info!("novad stopped cleanly");
            Ok(())
        }
        (Ok(()), Some(reason)) => Err(anyhow::anyhow!(reason)),
        (Err(e), _) => Err(e.into()),
    }
}

/// The HTTP/2 connection window: twice room for every session's stream window at once. A
/// receiver hands connection window back only once half of it has been consumed, so with every
/// other session's window full of data waiting for its charge, the session that may proceed
/// still needs half the window free to get it back. (HTTP/2 caps a window at 2^31 - 1 bytes.)
fn connection_window(stream_window: u32, max_sessions: u32) -> u32 {
    (2 * stream_window as u64 * max_sessions.max(1) as u64).clamp(1 << 20, (1u64 << 31) - 1) as u32
}

/// Keeps `nova_metastore_size_bytes` current. A failure leaves the last value (the metastore's
/// own errors show elsewhere, where they matter).
async fn watch_metastore_size(
    metastore: Arc<dyn Metastore>,
    gauge: prometheus::IntGauge,
    stopping: CancellationToken,
) {
    let mut ticker = tokio::time::interval(Duration::from_secs(10));
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stopping.cancelled() => return,
        }
        if let Ok(Some(bytes)) = metastore.size_bytes().await {
            gauge.set(bytes.min(i64::MAX as u64) as i64);
        }
    }
}

async fn set_health(health: &tonic_health::server::HealthReporter, serving: bool) {
    let status = if serving {
        tonic_health::ServingStatus::Serving
    } else {
        tonic_health::ServingStatus::NotServing
    };
    // The server as a whole ("") and the Nova service by name.
    health.set_service_status("", status).await;
    health
        .set_service_status(
            <NovaServer<NovaService> as tonic::server::NamedService>::NAME,
            status,
        )
        .await;
}

/// Keeps the health service and the ready gauge current: a star is ready while it holds its
/// chain and its object store takes writes. Load balancers and supervisors watch this.
async fn report_readiness(
    star: Arc<Star>,
    health: tonic_health::server::HealthReporter,
    metrics: Arc<Metrics>,
    stopping: CancellationToken,
) {
    let mut ticker = tokio::time::interval(Duration::from_millis(500));
    let mut was: Option<bool> = None;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stopping.cancelled() => return,
        }
        let failing = star
            .store_failing_for()
            .is_some_and(|d| d >= STORE_FAILING_NOT_READY_AFTER);
        let ready = star.fenced().is_none() && !failing;
        if was != Some(ready) {
            set_health(&health, ready).await;
            metrics.ready.set(ready as i64);
            if was.is_some() {
                if ready {
                    tracing::info!("ready again: health reports SERVING");
                } else {
                    tracing::warn!(
                        fenced = star.fenced().is_some(),
                        store_failing = failing,
                        "not ready: health reports NOT_SERVING"
                    );
                }
            }
            was = Some(ready);
        }
    }
}
