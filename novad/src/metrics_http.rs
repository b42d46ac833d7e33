//! The Prometheus endpoint: GET /metrics on --metrics-addr.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use nova_core::metrics::Metrics;

/// Brings computed gauges (ages, saturation) up to date before a scrape.
pub type Refresh = Arc<dyn Fn() + Send + Sync>;

/// Serves until `shutdown`.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    refresh: Refresh,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        anyhow::anyhow!("cannot listen for metrics on {addr} (--metrics-addr): {e}")
    })?;
    let app = Router::new().route(
        "/metrics",
        get(move || {
            let metrics = metrics.clone();
            let refresh = refresh.clone();
            async move {
                refresh();
                (
                    [("content-type", "text/plain; version=0.0.4")],
                    metrics.render(),
                )
            }
        }),
    );
    tracing::info!(%addr, "metrics listening");
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await?;
    Ok(())
}
