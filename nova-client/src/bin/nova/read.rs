//! `nova read` and `nova tail`.

use std::io::Write;
use std::time::Duration;

use nova_client::{Client, Consumer};

use crate::Format;
use crate::output;

pub async fn read(
    client: &Client,
    stream: &str,
    from: u64,
    limit: Option<u64>,
    format: Format,
) -> anyhow::Result<()> {
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut consumer = Consumer::new(client.clone(), stream, from);
    let mut left = limit.unwrap_or(u64::MAX);
    while left > 0 {
        consumer = consumer.page_size(left.min(u32::MAX as u64) as u32, 0);
        let page = consumer.next_page().await?;
        if page.records.is_empty() {
            break;
        }
        for record in &page.records {
            output::record(&mut out, record, format)?;
        }
        left -= page.records.len() as u64;
        if page.next_seq >= page.tail_seq {
            break;
        }
    }
    out.flush()?;
    Ok(())
}

/// How long one follow request waits at the tail before asking again.
const FOLLOW_WAIT: Duration = Duration::from_secs(30);

pub async fn tail(
    client: &Client,
    stream: &str,
    lines: u64,
    follow: bool,
    format: Format,
) -> anyhow::Result<()> {
    let tail = client.describe_stream(stream).await?.tail_seq;
    let from = tail.saturating_sub(lines);
    if !follow {
        return read(client, stream, from, Some(tail - from), format).await;
    }
    let mut consumer = Consumer::new(client.clone(), stream, from).follow(FOLLOW_WAIT);
    let mut out = std::io::stdout().lock();
    loop {
        let page = consumer.next_page().await?;
        for record in &page.records {
            output::record(&mut out, record, format)?;
        }
        // Flush per page so a pipe sees records as they arrive.
        out.flush()?;
    }
}
