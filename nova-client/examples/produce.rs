//! Appends numbered records to a stream, exactly once, and prints where they landed.
//!
//!     cargo run -p novad &                       # a star on the embedded default
//!     cargo run -p nova-client --example produce -- orders 1000

use std::time::Duration;

use nova_client::{Client, Error, Producer, ProducerConfig, Record};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let stream = args.next().unwrap_or_else(|| "orders".into());
    let count: u64 = args.next().and_then(|n| n.parse().ok()).unwrap_or(1000);
    let server = std::env::var("NOVA_SERVER").unwrap_or_else(|_| "http://127.0.0.1:7400".into());

    let client = Client::connect(&server).await?;
    match client.create_stream(&stream).await {
        Ok(_) => println!("created {stream}"),
        Err(e) if e.code() == Some(tonic::Code::AlreadyExists) => {}
        Err(e) => return Err(e),
    }

    // Batches close at 64 KiB or 10 ms; at most 8 MiB may wait for acks before append() blocks.
    let config = ProducerConfig {
        batch_bytes: 64 * 1024,
        linger: Duration::from_millis(10),
        max_unacked_bytes: 8 << 20,
        ..ProducerConfig::default()
    };
    let producer = Producer::new(client, &stream, config).await?;
    let mut tickets = Vec::new();
    for i in 0..count {
        let record = Record::new(format!("order {i}")).with_header("source", "example");
        tickets.push(producer.append(record).await?);
    }
    producer.close().await?;
    let first = tickets.remove(0).wait().await?;
    let last = match tickets.pop() {
        Some(ticket) => ticket.wait().await?,
        None => first,
    };
    println!("{count} records durable at {first}..={last}");
    Ok(())
}
