//! What the SDK's errors say and which are worth retrying: appends over a cap, to a missing
//! stream, or out of sequence are refused with a code the caller can act on.
//!
//!     cargo run -p nova-client --example errors

use nova_client::{Client, Error, Record};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let server = std::env::var("NOVA_SERVER").unwrap_or_else(|_| "http://127.0.0.1:7400".into());
    let client = Client::connect(&server).await?;
    let _ = client.create_stream("examples-errors").await;
    let mut session = client.append_session().await?;

    let attempts = [
        (
            "a missing stream",
            "no-such-stream",
            vec![Record::new("x")],
            None,
        ),
        ("an empty batch", "examples-errors", vec![], None),
        (
            "a stale match_seq_num",
            "examples-errors",
            vec![Record::new("x")],
            Some(u64::MAX),
        ),
    ];
    for (what, stream, records, match_seq_num) in attempts {
        match session.append(stream, records, match_seq_num).await {
            Ok(ack) => println!("{what}: accepted at {}..{}", ack.start_seq, ack.end_seq),
            Err(error) => println!(
                "{what}: {:?}, retryable: {}: {error}",
                error.code(),
                error.is_retryable()
            ),
        }
    }
    Ok(())
}
