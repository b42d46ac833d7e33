//! GET /metrics on --metrics-addr.

use std::net::SocketAddr;

use axum::Router;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use crate::metrics::GatewayMetrics;

pub async fn serve(
    addr: SocketAddr,
    metrics: GatewayMetrics,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        anyhow::anyhow!("cannot listen for metrics on {addr} (--metrics-addr): {e}")
    })?;
    let app = Router::new().route(
        "/metrics",
        get(move || {
            let metrics = metrics.clone();
            async move {
                (
                    [("content-type", "text/plain; version=0.0.4")],
                    metrics.render(),
                )
            }
        }),
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await?;
    Ok(())
}
