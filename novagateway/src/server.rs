//! Wiring: the object store, the star client, the tier, the services, shutdown.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use nova_core::budget::Budget;
use nova_core::clock::Clock;
use nova_core::object_store::StoreStack;
use nova_proto::server::gateway_peer_server::GatewayPeerServer;
use nova_proto::server::nova_server::NovaServer;
use nova_proto::units::human_bytes;

use crate::config::Config;
use crate::footers::Footers;
use crate::metrics::GatewayMetrics;
use crate::read::Reader;
use crate::read_ahead::ReadAhead;
use crate::service::{GatewayService, PeerService};
use crate::tier::Tier;

pub async fn run(config: Config) -> anyhow::Result<()> {
    nova_server::net::take_hangups();
    let started_at_ms = Clock::system().unix_ms();
    let metrics = GatewayMetrics::new();
    nova_core::metrics::register_build_info(
        &metrics.registry,
        "nova_gateway",
        env!("CARGO_PKG_VERSION"),
        started_at_ms as f64 / 1000.0,
    );
    let security_metrics =
        nova_server::net::SecurityMetrics::register(&metrics.registry, "nova_gateway");
    let security = config
        .listener
        .load(&security_metrics)
        .context("loading --tls-cert/--auth-tokens")?;
    config.listener.warn_if_exposed(
        config.listen,
        "novagateway",
        "read every stream its star lets it read, and fetch its objects",
    );
    if config.upstream_token.is_some() && config.listener.auth_tokens.is_none() {
        // Even on loopback: whoever reaches this gateway reads with the gateway's token.
        tracing::warn!(
            listen = %config.listen,
            "novagateway calls its star with --upstream-token but checks no tokens itself \
             (no --auth-tokens): every client that reaches it reads what that token may read"
        );
    }
    if !nova_core::allocator::reuse::keep_up_to(
        usize::try_from(config.recycle_buffer_bytes()).unwrap_or(usize::MAX),
    ) {
        tracing::warn!(
            "--recycle-buffer-mib keeps nothing here: freed buffers are kept only under glibc's \
             malloc on 64-bit Linux (is another allocator preloaded?)"
        );
    }
    tokio::spawn(nova_core::allocator::trim_periodically(
        Clock::system(),
        metrics.process.trims.clone(),
    ));
    let connections = Arc::new(nova_server::net::Connections::default());
    let store_dir = match config.store.s3_bucket {
        None => crate::health::check_store_dir(&config.store_dir).await?,
        Some(_) => config.store_dir.clone(),
    };
    let store = config
        .store
        .open(&store_dir, false)
        .await
        .with_context(|| format!("opening the object store at {}", store_dir.display()))?;
    let store = StoreStack::over(store)
        .instrumented(metrics.store.clone(), Clock::system())
        .build();
    let upstream = config.upstream()?;
    let star = nova_proto::route::Router::with_settings(
        upstream.client(
            upstream
                .endpoint(&config.star)
                .context("--star is not a URL")?
                .connect_lazy(),
        ),
        upstream.clone(),
    )
    .seeds(&config.star, [config.star.as_str()]);

    let health = crate::health::Health::new(metrics.clone());
    crate::health::check_at_start(&store, &star, &config.star, &health).await?;

    let members = config.members();
    let me = members
        .iter()
        .position(|m| *m == config.advertise())
        .unwrap_or(0);
    let tier = Arc::new(
        Tier::new(
            members.clone(),
            me,
            config.object_cache_load_factor,
            config.object_cache_bytes,
            config.object_cache_admission,
            store.clone(),
            metrics.clone(),
            config.peer_timeout(),
            config.dead_peer(),
            &upstream,
        )
        .context("a --peers entry is not a URL")?,
    );
    let pool = Budget::new(
        config.fetch_inflight,
        metrics.fetch_pool.clone(),
        Clock::system(),
    );
    metrics.reads_capacity.set(config.max_reads as i64);
    let ahead = Arc::new(ReadAhead::new(
        config
            .read_ahead()
            .map(|(bytes, _)| Budget::new(bytes, metrics.read_ahead.clone(), Clock::system())),
        config.max_read_aheads,
        metrics.clone(),
    ));
    crate::formula::export(&config, &metrics);
    let reader = Arc::new(Reader {
        star,
        footers: Footers::new(
            config.footer_cache_bytes,
            store.clone(),
            metrics.clone(),
            pool.clone(),
        ),
        tier: tier.clone(),
        pool: pool.clone(),
        metrics: metrics.clone(),
        max_read_bytes: config.max_read_bytes,
        max_read_records: config.max_read_records,
        reads: Arc::new(tokio::sync::Semaphore::new(config.max_reads.max(1) as usize)),
        max_reads: config.max_reads,
        sheds: Arc::new(nova_server::shed::ShedLog::new(Clock::system())),
        ahead: ahead.clone(),
    });
    if ahead.budget.is_some() {
        tokio::spawn(ReadAhead::sweep_forever(Arc::downgrade(&ahead)));
    }

    let stopping = CancellationToken::new();
    let render: nova_server::process::RenderMetrics = {
        let metrics = metrics.clone();
        Arc::new(move || metrics.render())
    };
    let metrics_listener = nova_server::process::bind_metrics(config.metrics_addr).await?;
    let metrics_task = tokio::spawn(nova_server::process::serve_metrics(
        metrics_listener,
        render,
        stopping.clone(),
    ));
    let (reporter, health_service) = tonic_health::server::health_reporter();
    if health.is_ready() {
        reporter.set_serving::<NovaServer<GatewayService>>().await;
    } else {
        reporter
            .set_not_serving::<NovaServer<GatewayService>>()
            .await;
    }
    tokio::spawn(crate::health::watch(
        store.clone(),
        reader.star.clone(),
        config.star.clone(),
        health.clone(),
        reporter.clone(),
        stopping.clone(),
    ));
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(nova_proto::v1::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {} (--listen)", config.listen))?;
    let listening = listener.local_addr().unwrap_or(config.listen);
    let nova = NovaServer::new(GatewayService {
        reader,
        star_url: config.star.clone(),
        errors_logged: Arc::new(nova_server::shed::ShedLog::new(Clock::system())),
        health: health.clone(),
        access: nova_server::net::Access::new(&security_metrics),
        identity: crate::service::GatewayIdentity {
            version: env!("CARGO_PKG_VERSION"),
            id: config.advertise(),
            started_at_ms,
            store: store.describe(),
            max_read_bytes: config.max_read_bytes,
            max_read_records: config.max_read_records,
        },
    })
    .max_encoding_message_size(usize::MAX);
    let peer = GatewayPeerServer::new(PeerService {
        tier,
        access: nova_server::net::Access::new(&security_metrics),
        pool,
    })
    .max_encoding_message_size(usize::MAX);
    security.spawn_reloads(&stopping);
    let server = config
        .listener
        .configure(tonic::transport::Server::builder())
        .layer(nova_proto::rpc::RpcLayer::new(
            nova_server::net::CallObserver {
                rpc: metrics.rpc.clone(),
                connections: connections.clone(),
                tokens: security.tokens.clone(),
            },
            Clock::system(),
        ))
        .layer(nova_server::net::AuthLayer::new(
            security.tokens.clone(),
            &security_metrics,
        ))
        // A star's redirect stays between the gateway and the star.
        .layer(crate::redirects::NoRedirectsLayer)
        .layer(nova_server::net::hold::HoldLayer::new(connections.clone()))
        // Every request message is small: collected outside tonic, within a budget and a
        // deadline, and refused at its prefix if it says it is large.
        .layer(nova_server::net::small::SmallMessagesLayer(
            nova_server::net::small::SmallMessages::new(
                metrics
                    .sheds
                    .with_label_values(&[nova_server::net::small::SHED_LABEL]),
                Arc::new(nova_server::shed::ShedLog::new(Clock::system())),
                config.listener.max_client_share_percent,
                security.tokens.is_some(),
            ),
        ))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(nova)
        .add_service(peer)
        .serve_with_incoming_shutdown(
            nova_server::net::conn::incoming(
                listener,
                security.tls.clone(),
                config.listener.limits(),
                connections,
                security_metrics.connections.clone(),
                stopping.clone(),
            ),
            stopping.clone().cancelled_owned(),
        );
    let mut server = tokio::spawn(server);
    tracing::info!(
        listen = %listening,
        star = %config.star,
        members = %members.join(","),
        store = %store.describe(),
        fetch_inflight = %human_bytes(config.fetch_inflight),
        footer_cache = %human_bytes(config.footer_cache_bytes),
        object_cache = %human_bytes(config.object_cache_bytes),
        max_read_bytes = %human_bytes(config.max_read_bytes),
        "novagateway serving reads"
    );
    let failure = tokio::select! {
        _ = nova_server::process::termination() => None,
        result = &mut server => Some(match result {
            Ok(Ok(())) => "the gRPC server stopped".to_owned(),
            Ok(Err(e)) => format!("the gRPC server failed: {e}"),
            Err(e) => format!("the gRPC server task failed: {e}"),
        }),
    };
    tracing::info!("shutting down: finishing the reads in progress");
    reporter
        .set_not_serving::<NovaServer<GatewayService>>()
        .await;
    stopping.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), &mut server).await;
    server.abort();
    let _ = tokio::time::timeout(Duration::from_secs(2), metrics_task).await;
    match failure {
        None => {
            tracing::info!("novagateway stopped cleanly");
            Ok(())
        }
        Some(reason) => Err(anyhow::anyhow!(reason)),
    }
}
