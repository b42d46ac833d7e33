//! Many concurrent cold readers of large pages against a star, measured in resident memory: the
//! star's read budget bounds what its reads hold, and its allocator must give that memory back,
//! or the OOM killer (which counts RSS, not budgets) sees far more than the formula. The
//! resident-memory test and `benches/resident.sh` (which compares allocators) both run it.

use std::time::{Duration, Instant};

use nova_client::{Client, Producer, ProducerConfig, ReadOptions, Record};

use crate::novad::Novad;

#[derive(Debug, Clone)]
pub struct ColdReaders {
    /// Readers at once, each reading `pages` full pages' worth from the start of one stream.
    pub readers: usize,
    pub pages: usize,
    /// Bytes a reader asks for per page (the star caps a page at 8 MiB).
    pub page_bytes: u64,
    pub streams: usize,
    /// Bytes written to each stream before the readers start.
    pub stream_bytes: u64,
    pub record_bytes: usize,
    /// How long after the readers stop resident memory may take to come back near idle.
    pub settle: Duration,
}

impl Default for ColdReaders {
    fn default() -> Self {
        Self {
            readers: 200,
            pages: 2,
            page_bytes: 8 << 20,
            streams: 10,
            stream_bytes: 16 << 20,
            record_bytes: 64 << 10,
            settle: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, Default, Clone)]
pub struct ColdReadReport {
    /// The star's memory formula (the sum of its `nova_memory_formula_bytes` terms).
    pub formula_bytes: u64,
    /// Resident memory of the freshly restarted star before the readers start.
    pub idle_rss: u64,
    /// The most resident memory sampled while the readers ran (and the kernel's high-water mark).
    pub peak_rss: u64,
    /// Resident memory when the readers have finished.
    pub rss_at_end: u64,
    /// Resident memory at the end of the settling time, or when it first came within
    /// `near_idle` of idle.
    pub rss_settled: u64,
    pub settled_after_ms: u64,
    pub bytes_read: u64,
    pub read_seconds: f64,
}

fn rss(pid: u32) -> (u64, u64) {
    nova_server::memory::resident_bytes(pid).unwrap_or((0, 0))
}

impl ColdReaders {
    /// Writes the streams, restarts the star (so nothing read is in its caches and its
    /// high-water mark starts afresh), runs the readers, then waits up to `settle` for resident
    /// memory to come within `near_idle` of idle.
    pub async fn run(&self, star: &mut Novad, near_idle: u64) -> ColdReadReport {
        let client = Client::connect(&star.url()).await.expect("connect");
        let body = vec![b'c'; self.record_bytes];
        for s in 0..self.streams {
            let name = format!("cold-{s}");
            client.create_stream(&name).await.expect("create");
            // Large batches make large sections, so that a cold page can fill 8 MiB.
            let config = ProducerConfig {
                batch_bytes: 1 << 20,
                linger: Duration::from_millis(20),
                ..ProducerConfig::default()
            };
            let producer = Producer::new(client.clone(), &name, config)
                .await
                .expect("producer");
            let records = (self.stream_bytes / self.record_bytes as u64).max(1);
            for _ in 0..records {
                producer
                    .append(Record::new(body.clone()))
                    .await
                    .expect("append");
            }
            producer.close().await.expect("flush");
        }
        drop(client);
        star.terminate(Duration::from_secs(60));
        star.restart();
        let pid = star.pid().expect("running");
        let client = Client::connect(&star.url()).await.expect("connect");
        // Settled after its restart: recovery done, first scrape served.
        client.describe_stream("cold-0").await.expect("describe");
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut report = ColdReadReport {
            idle_rss: rss(pid).0,
            ..ColdReadReport::default()
        };

        let sampling = {
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
            let (s, p) = (stop.clone(), peak.clone());
            let thread = std::thread::spawn(move || {
                while !s.load(std::sync::atomic::Ordering::Relaxed) {
                    p.fetch_max(rss(pid).0, std::sync::atomic::Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(50));
                }
            });
            (stop, peak, thread)
        };
        let started = Instant::now();
        let readers: Vec<_> = (0..self.readers)
            .map(|r| {
                let client = client.clone();
                let stream = format!("cold-{}", r % self.streams);
                let (pages, page_bytes) = (self.pages, self.page_bytes);
                tokio::spawn(async move {
                    read_pages(&client, &stream, pages as u64 * page_bytes, page_bytes).await
                })
            })
            .collect();
        for reader in readers {
            report.bytes_read += reader.await.expect("reader");
        }
        report.read_seconds = started.elapsed().as_secs_f64();
        let metrics = star.metrics();
        report.formula_bytes = crate::formula_bytes(&metrics);
        let (stop, peak, thread) = sampling;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = thread.join();
        let (now, hwm) = rss(pid);
        report.rss_at_end = now;
        report.peak_rss = peak.load(std::sync::atomic::Ordering::Relaxed).max(hwm);
        drop(client);

        let settling = Instant::now();
        loop {
            let (now, _) = rss(pid);
            report.rss_settled = now;
            report.settled_after_ms = settling.elapsed().as_millis() as u64;
            if now <= report.idle_rss + near_idle || settling.elapsed() >= self.settle {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        report
    }
}

/// Reads `stream` from its start in pages of up to `page_bytes` until `want` content bytes have
/// arrived or the tail is reached, waiting out each retryable refusal (a shed) for its hint;
/// returns the content bytes read. Under a read budget a page may come back smaller than asked.
pub async fn read_pages(client: &Client, stream: &str, want: u64, page_bytes: u64) -> u64 {
    let mut next = 0;
    let mut bytes = 0u64;
    while bytes < want {
        let options = ReadOptions {
            max_bytes: page_bytes,
            ..ReadOptions::default()
        };
        let page = match client.read_with(stream, next, options).await {
            Ok(page) => page,
            Err(error) if error.is_retryable() => {
                let wait = error.retry_after().unwrap_or(Duration::from_millis(50));
                tokio::time::sleep(wait).await;
                continue;
            }
            Err(error) => panic!("read {stream}: {error}"),
        };
        bytes += page
            .records
            .iter()
            .map(|r| r.record.body.len() as u64)
            .sum::<u64>();
        next = page.next_seq;
        if next >= page.tail_seq {
            break;
        }
    }
    bytes
}
