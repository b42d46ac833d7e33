//! The Prometheus endpoint: GET /metrics on --metrics-addr.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use nova_chain::Star;
use nova_core::metrics::Metrics;

/// Serves until `shutdown`. `star` is empty while recovery runs; the page then shows what the
/// star has recorded so far (store requests, for one).
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    star: Arc<OnceLock<Arc<Star>>>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        anyhow::anyhow!("cannot listen for metrics on {addr} (--metrics-addr): {e}")
    })?;
    let app = Router::new().route(
        "/metrics",
        get(move || {
            let metrics = metrics.clone();
            let star = star.clone();
            async move {
                if let Some(star) = star.get() {
                    star.refresh_gauges();
                }
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
