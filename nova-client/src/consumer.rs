//! A consumer: reads a stream page by page from a sequence number. In follow mode it waits at
//! the tail for new records with a long-poll read, so following an idle stream costs one request
//! per wait period, not a busy loop.

use std::time::Duration;

use futures::TryStreamExt;
use nova_proto::domain::SequencedRecord;

use crate::client::{Client, Page, ReadOptions};
use crate::error::Error;

#[derive(Debug, Clone)]
pub struct Consumer {
    client: Client,
    stream: String,
    next_seq: u64,
    options: ReadOptions,
    follow: bool,
}

impl Consumer {
    /// Reads `stream` from `from_seq`, with the server's page caps.
    pub fn new(client: Client, stream: impl Into<String>, from_seq: u64) -> Self {
        Self {
            client,
            stream: stream.into(),
            next_seq: from_seq,
            options: ReadOptions::default(),
            follow: false,
        }
    }

    /// At the tail, wait up to `wait` per request for new records instead of returning empty
    /// pages at once. Each waiting request holds one of the star's `--max-subscriptions` slots.
    pub fn follow(mut self, wait: Duration) -> Self {
        self.follow = true;
        self.options.wait = wait;
        self
    }

    /// Starts at the first record (from the start sequence number on) whose timestamp is at or
    /// after `timestamp_ms` (unix ms), as the server finds it: by the index, then passing over
    /// earlier records. Pages before the first such record may come back empty.
    pub fn from_time(mut self, timestamp_ms: u64) -> Self {
        self.options.start_timestamp = Some(timestamp_ms);
        self
    }

    /// Caps each page (0: the server's cap).
    pub fn page_size(mut self, max_records: u32, max_bytes: u64) -> Self {
        self.options.max_records = max_records;
        self.options.max_bytes = max_bytes;
        self
    }

    /// The sequence number the next page starts at.
    pub fn position(&self) -> u64 {
        self.next_seq
    }

    /// The next page. Without follow, an empty page means the consumer has reached the tail.
    /// With follow, it waits at the tail and returns a page as soon as records arrive; an
    /// empty page means the wait elapsed with nothing new, and the caller simply asks again.
    pub async fn next_page(&mut self) -> Result<Page, Error> {
        let page = self
            .client
            .read_with(&self.stream, self.next_seq, self.options)
            .await?;
        self.next_seq = page.next_seq.max(self.next_seq);
        if !page.records.is_empty() {
            // Found: from here on every record is read, whatever its timestamp.
            self.options.start_timestamp = None;
        }
        Ok(page)
    }

    pub fn is_following(&self) -> bool {
        self.follow
    }

    /// Whether an empty `page` is a read by time that has not found its first record yet
    /// and has more of the stream to look through.
    pub fn seeking_past(&self, page: &Page) -> bool {
        page.records.is_empty()
            && self.options.start_timestamp.is_some()
            && page.next_seq < page.tail_seq
    }

    /// The stream's records one by one, as a `futures::Stream`, fetched a page at a time as it
    /// is polled (so a slow reader slows its own reads and holds one page at most). Without
    /// follow it ends at the tail; with follow it waits there for more and never ends. The
    /// first error ends it.
    pub fn records(self) -> impl futures::Stream<Item = Result<SequencedRecord, Error>> + Send {
        futures::stream::try_unfold(self, |mut consumer| async move {
            loop {
                let page = consumer.next_page().await?;
                if !page.records.is_empty() {
                    return Ok::<_, Error>(Some((
                        futures::stream::iter(page.records.into_iter().map(Ok)),
                        consumer,
                    )));
                }
                // An empty page short of the tail is a read by time passing over earlier
                // records: keep going.
                if !consumer.follow && !consumer.seeking_past(&page) {
                    return Ok(None);
                }
            }
        })
        .try_flatten()
    }
}
