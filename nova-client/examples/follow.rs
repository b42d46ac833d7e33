//! Reads a stream from the start and then follows it, printing records as they arrive. A
//! following read waits at the tail on the server, so an idle stream costs one request per
//! wait period.
//!
//!     cargo run -p nova-client --example follow -- orders

use std::time::Duration;

use nova_client::{Client, Consumer, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let stream = std::env::args().nth(1).unwrap_or_else(|| "orders".into());
    let server = std::env::var("NOVA_SERVER").unwrap_or_else(|_| "http://127.0.0.1:7400".into());
    let client = Client::connect(&server).await?;
    let mut consumer = Consumer::new(client, &stream, 0).follow(Duration::from_secs(30));
    loop {
        let page = consumer.next_page().await?;
        for record in page.records {
            println!(
                "{}: {}",
                record.seq,
                String::from_utf8_lossy(&record.record.body)
            );
        }
    }
}
