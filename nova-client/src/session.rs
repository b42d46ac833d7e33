//! A producer session: one `Append` stream, pipelined. `send` queues a batch without waiting;
//! `next_ack` returns acks in the order batches were sent.

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use nova_proto::domain::Record;
use nova_proto::route::Stub;
use nova_proto::v1;

use crate::error::Error;

/// Where an acknowledged batch landed: sequence numbers `[start_seq, end_seq)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    pub start_seq: u64,
    pub end_seq: u64,
}

/// Batches sent but not yet handed to the transport. The transport's flow control bounds the
/// rest, so this only smooths bursts.
const SEND_QUEUE: usize = 16;

pub struct AppendSession {
    sender: AppendSender,
    receiver: AckReceiver,
}

impl AppendSession {
    pub(crate) async fn open(mut client: Stub) -> Result<Self, Error> {
        let (requests, outbound) = mpsc::channel(SEND_QUEUE);
        let acks = client
            .append(ReceiverStream::new(outbound))
            .await?
            .into_inner();
        Ok(Self {
            sender: AppendSender {
                requests: Some(requests),
            },
            receiver: AckReceiver { acks },
        })
    }

    /// Queues one batch for `stream`. Waits only while the transport pushes back.
    pub async fn send(
        &mut self,
        stream: &str,
        records: Vec<Record>,
        match_seq_num: Option<u64>,
    ) -> Result<(), Error> {
        self.sender.send(stream, records, match_seq_num).await
    }

    /// The answer to the oldest batch not yet answered.
    pub async fn next_ack(&mut self) -> Result<Ack, Error> {
        self.receiver.next_ack().await
    }

    /// Sends one batch and waits for its answer. Only use this when nothing else is pending.
    pub async fn append(
        &mut self,
        stream: &str,
        records: Vec<Record>,
        match_seq_num: Option<u64>,
    ) -> Result<Ack, Error> {
        self.send(stream, records, match_seq_num).await?;
        self.next_ack().await
    }

    /// Stops sending. Acks still owed can be read with `next_ack` until it reports the end.
    pub fn finish(&mut self) {
        self.sender.requests = None;
    }

    /// Splits the session so one task can send while another reads acks.
    pub fn split(self) -> (AppendSender, AckReceiver) {
        (self.sender, self.receiver)
    }
}

/// The sending half of a split session.
pub struct AppendSender {
    requests: Option<mpsc::Sender<v1::AppendRequest>>,
}

impl AppendSender {
    /// Queues one batch; waits only while the transport pushes back.
    pub async fn send(
        &self,
        stream: &str,
        records: Vec<Record>,
        match_seq_num: Option<u64>,
    ) -> Result<(), Error> {
        let sender = self
            .requests
            .as_ref()
            .ok_or_else(|| Error::SessionClosed("the session was finished".into()))?;
        sender
            .send(v1::AppendRequest {
                stream: stream.to_owned(),
                records: records.into_iter().map(Into::into).collect(),
                match_seq_num,
            })
            .await
            .map_err(|_| Error::SessionClosed("the server ended the session".into()))
    }
}

/// The receiving half of a split session: acks in the order batches were sent.
pub struct AckReceiver {
    pub(crate) acks: Streaming<v1::AppendAck>,
}

impl AckReceiver {
    pub async fn next_ack(&mut self) -> Result<Ack, Error> {
        self.next_answer().await?
    }

    /// The next answer (an ack, or the server's refusal of that batch) or, as the outer error,
    /// the end of the session itself (a status on the stream, a broken connection), which
    /// answers no batch in particular.
    pub(crate) async fn next_answer(&mut self) -> Result<Result<Ack, Error>, Error> {
        match self.acks.message().await? {
            Some(v1::AppendAck {
                error: Some(error), ..
            }) => Ok(Err(error.into())),
            Some(ack) => Ok(Ok(Ack {
                start_seq: ack.start_seq,
                end_seq: ack.end_seq,
            })),
            None => Err(Error::SessionClosed(
                "the server ended the session with answers still owed".into(),
            )),
        }
    }
}
