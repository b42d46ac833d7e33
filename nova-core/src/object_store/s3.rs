//! S3 (or any S3-compatible server) through aws-sdk-s3.
//!
//! Only the protocol: the concurrency limits are a layer (`ConcurrencyLimited`) that `StoreStack`
//! stacks on it. Every attempt has a deadline; the SDK retries only errors it classes as
//! transient (timeouts, throttling, 5xx), and a conditional create's 412 is never retried: it is
//! the answer.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_config::BehaviorVersion;
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::config::{
    Credentials, Region, RequestChecksumCalculation, ResponseChecksumValidation,
};
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_smithy_types::body::SdkBody;

use super::{
    ComposePart, CreateOutcome, GetRange, GetResult, ListPage, MAX_LIST_KEYS, ObjectMeta,
    ObjectStore, Op, PutPayload, StoreError, StoreLimits,
};

#[derive(Debug, Clone)]
pub struct S3Config {
    pub bucket: String,
    /// Prepended to every key; a trailing `/` is added when missing.
    pub prefix: String,
    /// A custom endpoint (an S3-compatible server); `None` means AWS.
    pub endpoint: Option<String>,
    pub region: String,
    pub force_path_style: bool,
    /// Static credentials; `None` means the standard AWS credential chain.
    pub credentials: Option<(String, String)>,
    pub limits: StoreLimits,
    /// Attempts per request, including the first.
    pub max_attempts: u32,
}

impl S3Config {
    pub fn new(bucket: impl Into<String>) -> Self {
        Self {
            bucket: bucket.into(),
            prefix: String::new(),
            endpoint: None,
            region: "us-east-1".into(),
            force_path_style: true,
            credentials: None,
            limits: StoreLimits::default(),
            max_attempts: 3,
        }
    }
}

#[derive(Debug, Clone)]
pub struct S3Store {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    client: aws_sdk_s3::Client,
    bucket: String,
    prefix: String,
    endpoint: String,
}

impl S3Store {
    pub async fn new(config: S3Config) -> Self {
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .region(Region::new(config.region.clone()));
        if let Some(endpoint) = &config.endpoint {
            loader = loader.endpoint_url(endpoint);
        }
        if let Some((key, secret)) = &config.credentials {
            loader = loader.credentials_provider(Credentials::new(
                key,
                secret,
                None,
                None,
                "nova-config",
            ));
        }
        let shared = loader.load().await;
        let timeouts = TimeoutConfig::builder()
            .operation_attempt_timeout(config.limits.request_timeout)
            .connect_timeout(Duration::from_secs(5).min(config.limits.request_timeout))
            .build();
        let s3_config = aws_sdk_s3::config::Builder::from(&shared)
            .force_path_style(config.force_path_style)
            .timeout_config(timeouts)
            .retry_config(RetryConfig::standard().with_max_attempts(config.max_attempts.max(1)))
            // Flights stream as several slices; a trailing checksum would need aws-chunked
            // encoding, which not every S3-compatible server accepts. Flights carry crc32c per
            // section and footer, checked on every read.
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
            .build();
        let mut prefix = config.prefix.trim_start_matches('/').to_owned();
        if !prefix.is_empty() && !prefix.ends_with('/') {
            prefix.push('/');
        }
        Self {
            inner: Arc::new(Inner {
                client: aws_sdk_s3::Client::from_conf(s3_config),
                bucket: config.bucket,
                prefix,
                endpoint: config.endpoint.unwrap_or_else(|| "aws".into()),
            }),
        }
    }

    /// The SDK client, for tests and tools that need to set up a bucket.
    pub fn client(&self) -> &aws_sdk_s3::Client {
        &self.inner.client
    }

    fn full_key(&self, key: &str) -> String {
        format!("{}{}", self.inner.prefix, key)
    }

    /// A PutObject request for the payload, ready for conditions and `send`.
    fn put_request(
        &self,
        key: &str,
        payload: &PutPayload,
    ) -> aws_sdk_s3::operation::put_object::builders::PutObjectFluentBuilder {
        self.inner
            .client
            .put_object()
            .bucket(&self.inner.bucket)
            .key(self.full_key(key))
            .content_length(payload.len() as i64)
            .body(Self::body(payload))
    }

    fn body(payload: &PutPayload) -> ByteStream {
        if let [single] = payload.parts() {
            return ByteStream::from(single.clone());
        }
        let payload = payload.clone();
        ByteStream::new(SdkBody::retryable(move || {
            SdkBody::from_body_1_x(payload.body())
        }))
    }
}

impl S3Store {
    /// One multipart upload of `parts` to `key`; the caller aborts it on failure.
    async fn upload_parts(
        &self,
        key: &str,
        upload_id: &str,
        parts: &[ComposePart],
    ) -> Result<(), StoreError> {
        use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
        let op = Op::Compose;
        let client = &self.inner.client;
        let full = self.full_key(key);
        let mut completed = Vec::with_capacity(parts.len());
        for (i, part) in parts.iter().enumerate() {
            let number = i32::try_from(i + 1).map_err(|_| StoreError::Permanent {
                op,
                key: key.to_owned(),
                message: "too many parts".into(),
            })?;
            let e_tag = match part {
                ComposePart::Copy { source, range } => client
                    .upload_part_copy()
                    .bucket(&self.inner.bucket)
                    .key(&full)
                    .upload_id(upload_id)
                    .part_number(number)
                    .copy_source(copy_source(&self.inner.bucket, &self.full_key(source)))
                    .copy_source_range(format!("bytes={}-{}", range.start, range.end - 1))
                    .send()
                    .await
                    .map_err(|err| classify(op, source, err))?
                    .copy_part_result()
                    .and_then(|r| r.e_tag())
                    .map(str::to_owned),
                ComposePart::Data(payload) => client
                    .upload_part()
                    .bucket(&self.inner.bucket)
                    .key(&full)
                    .upload_id(upload_id)
                    .part_number(number)
                    .content_length(payload.len() as i64)
                    .body(Self::body(payload))
                    .send()
                    .await
                    .map_err(|err| classify(op, key, err))?
                    .e_tag()
                    .map(str::to_owned),
            };
            let Some(e_tag) = e_tag else {
                return Err(StoreError::Permanent {
                    op,
                    key: key.to_owned(),
                    message: format!("part {number} was answered without an ETag"),
                });
            };
            completed.push(
                CompletedPart::builder()
                    .part_number(number)
                    .e_tag(e_tag)
                    .build(),
            );
        }
        client
            .complete_multipart_upload()
            .bucket(&self.inner.bucket)
            .key(&full)
            .upload_id(upload_id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(completed))
                    .build(),
            )
            .send()
            .await
            .map(|_| ())
            .map_err(|err| classify(op, key, err))
    }
}

/// The `x-amz-copy-source` of an object: S3 wants the key URL-encoded (the SDK sends it as
/// given), with its `/` separators kept.
fn copy_source(bucket: &str, key: &str) -> String {
    let mut out = format!("{bucket}/");
    for byte in key.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                out.push(byte as char)
            }
            other => out.push_str(&format!("%{other:02X}")),
        }
    }
    out
}

fn status_of<E>(err: &SdkError<E, HttpResponse>) -> Option<u16> {
    err.raw_response().map(|r| r.status().as_u16())
}

/// One line for a request that never left because the SDK found no credentials, instead of the
/// SDK's context (about 1.5 KB naming every provider it tried, on each retry). Still transient:
/// credentials that appear later (a role attached, a profile written) are picked up.
fn credentials_failure(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    use aws_credential_types::provider::error::CredentialsError;
    let mut cause = err.source();
    while let Some(error) = cause {
        if let Some(credentials) = error.downcast_ref::<CredentialsError>() {
            return Some(match credentials {
                CredentialsError::CredentialsNotLoaded(_) => "no AWS credentials found \
                    (environment, profile, web identity, container, instance metadata): set \
                    AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"
                    .to_owned(),
                // The variant's own words are generic ("an error occurred while loading
                // credentials"); the cause is in what it wraps.
                other => format!(
                    "loading AWS credentials failed: {}",
                    nova_proto::error::with_causes(other)
                ),
            });
        }
        cause = error.source();
    }
    None
}

/// Maps an SDK error to a store error, saying whether a retry could help.
fn classify<E>(op: Op, key: &str, err: SdkError<E, HttpResponse>) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let status = status_of(&err);
    let code = err.code().map(str::to_owned);
    // A service error's code and message say it all; the SDK's full context (raw response,
    // body, extensions) is for transport failures, where it is the only clue.
    let message = match (&err, &code) {
        _ if let Some(missing) = credentials_failure(&err) => missing,
        (SdkError::ServiceError(_), Some(code)) => format!(
            "HTTP {} {code}: {}",
            status.map_or_else(|| "?".to_owned(), |s| s.to_string()),
            err.message().unwrap_or("no message")
        ),
        _ => DisplayErrorContext(&err).to_string(),
    };
    let key = key.to_owned();
    let transient = |message| StoreError::Transient {
        op,
        key: key.clone(),
        message,
    };
    match &err {
        // The request may never have reached the server, or its answer was lost.
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            transient(message)
        }
        SdkError::ServiceError(_) => match (status, code.as_deref()) {
            // Not the object but the bucket: a configuration error, not a missing key.
            (_, Some("NoSuchBucket")) => StoreError::Permanent {
                op,
                key,
                message: format!("the bucket does not exist (check --s3-bucket): {message}"),
            },
            (Some(404), _) | (_, Some("NoSuchKey")) => StoreError::NotFound { key },
            (Some(416), _) | (_, Some("InvalidRange")) => StoreError::InvalidRange {
                key,
                range: GetRange::All,
            },
            // The backend does not implement what was asked (a conditional write, say): no
            // retry changes that.
            (Some(501), _) | (_, Some("NotImplemented")) => {
                StoreError::Permanent { op, key, message }
            }
            // A conditional write raced another one in flight on the same key: ask again.
            (Some(409), Some("ConditionalRequestConflict")) => transient(message),
            (Some(408 | 429 | 500..=599), _) => transient(message),
            (_, Some("SlowDown" | "RequestTimeout" | "InternalError" | "ServiceUnavailable")) => {
                transient(message)
            }
            _ => StoreError::Permanent { op, key, message },
        },
        _ => StoreError::Permanent { op, key, message },
    }
}

fn range_header(range: &GetRange) -> Option<String> {
    match range {
        GetRange::All => None,
        GetRange::Bounded(r) => Some(format!("bytes={}-{}", r.start, r.end - 1)),
        GetRange::Suffix(n) => Some(format!("bytes=-{n}")),
    }
}

/// Reserve at most this much ahead of a body's bytes on the server's word (Content-Length);
/// a longer body grows its buffer as it arrives.
const MAX_BODY_HINT: u64 = 64 << 20;

/// A body's bytes in one buffer, copied chunk by chunk as they arrive.
///
/// The SDK's `collect` keeps every chunk until the body ends and then joins them. Each chunk is
/// a slice of hyper's read buffer, so that buffer cannot be reused while the body is collected,
/// and hyper maps fresh ones (a few hundred KiB each) for the rest; the join then writes the
/// whole body again, long after its first chunks left the cache. Copying each chunk into a
/// buffer of the body's length as it arrives lets hyper reuse its buffer, and copies each byte
/// while it is still warm. (Without a length, or past the cap, the buffer grows as bytes
/// arrive, and is trimmed to them at the end.)
async fn read_body(
    mut body: ByteStream,
    hint: Option<u64>,
) -> Result<bytes::Bytes, aws_sdk_s3::primitives::ByteStreamError> {
    let capacity = hint.unwrap_or(0).min(MAX_BODY_HINT) as usize;
    let mut buffer = bytes::BytesMut::with_capacity(capacity);
    while let Some(chunk) = body.try_next().await? {
        buffer.extend_from_slice(&chunk);
    }
    if buffer.capacity() > buffer.len() {
        // Not the length it was said to be (none was given, or it passed the cap): the buffer
        // grew past it, and callers' budgets (the gateway's object cache) weigh bytes by their
        // length, so keep only that.
        return Ok(bytes::Bytes::copy_from_slice(&buffer));
    }
    Ok(buffer.freeze())
}

/// The total size out of a `Content-Range: bytes a-b/total` header.
fn total_from_content_range(value: &str) -> Option<u64> {
    value.rsplit('/').next()?.parse().ok()
}

#[async_trait]
impl ObjectStore for S3Store {
    fn describe(&self) -> String {
        format!(
            "s3://{}/{} at {}",
            self.inner.bucket, self.inner.prefix, self.inner.endpoint
        )
    }

    async fn put_if_absent(
        &self,
        key: &str,
        payload: PutPayload,
    ) -> Result<CreateOutcome, StoreError> {
        let op = Op::PutIfAbsent;
        let result = self
            .put_request(key, &payload)
            .if_none_match("*")
            .send()
            .await;
        match result {
            Ok(_) => Ok(CreateOutcome::Created),
            Err(err) if status_of(&err) == Some(412) => Ok(CreateOutcome::AlreadyExists),
            Err(err) => Err(classify(op, key, err)),
        }
    }

    async fn put(&self, key: &str, payload: PutPayload) -> Result<(), StoreError> {
        let op = Op::Put;
        self.put_request(key, &payload)
            .send()
            .await
            .map(|_| ())
            .map_err(|err| classify(op, key, err))
    }

    async fn get(&self, key: &str, range: GetRange) -> Result<GetResult, StoreError> {
        let op = Op::Get;
        if let GetRange::Bounded(r) = &range
            && r.start >= r.end
        {
            return Err(StoreError::InvalidRange {
                key: key.to_owned(),
                range,
            });
        }
        let response = self
            .inner
            .client
            .get_object()
            .bucket(&self.inner.bucket)
            .key(self.full_key(key))
            .set_range(range_header(&range))
            .send()
            .await
            .map_err(|err| match classify(op, key, err) {
                StoreError::InvalidRange { key, .. } => StoreError::InvalidRange {
                    key,
                    range: range.clone(),
                },
                other => other,
            })?;
        let object_size = match (&range, response.content_range()) {
            (GetRange::All, _) => response.content_length().map(|l| l as u64),
            (_, Some(content_range)) => total_from_content_range(content_range),
            (_, None) => response.content_length().map(|l| l as u64),
        };
        // The SDK fails a body that is not its Content-Length, so that is the length to reserve.
        let length = response
            .content_length()
            .and_then(|l| u64::try_from(l).ok());
        let bytes = read_body(response.body, length)
            .await
            .map_err(|e| StoreError::Transient {
                op,
                key: key.to_owned(),
                message: format!("reading the body: {e}"),
            })?;
        Ok(GetResult {
            object_size: object_size.unwrap_or(bytes.len() as u64),
            bytes,
        })
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError> {
        let op = Op::Head;
        let response = self
            .inner
            .client
            .head_object()
            .bucket(&self.inner.bucket)
            .key(self.full_key(key))
            .send()
            .await
            .map_err(|err| classify(op, key, err))?;
        Ok(ObjectMeta {
            key: key.to_owned(),
            size: response.content_length().unwrap_or(0).max(0) as u64,
            modified_ms: response.last_modified().and_then(unix_ms),
        })
    }

    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        max_keys: usize,
    ) -> Result<ListPage, StoreError> {
        let op = Op::List;
        let max_keys = max_keys.clamp(1, MAX_LIST_KEYS);
        let response = self
            .inner
            .client
            .list_objects_v2()
            .bucket(&self.inner.bucket)
            .prefix(self.full_key(prefix))
            .set_start_after(start_after.map(|s| self.full_key(s)))
            .max_keys(max_keys as i32)
            .send()
            .await
            .map_err(|err| classify(op, prefix, err))?;
        let objects: Vec<ObjectMeta> = response
            .contents()
            .iter()
            .filter_map(|object| {
                let key = object.key()?.strip_prefix(&self.inner.prefix)?.to_owned();
                Some(ObjectMeta {
                    key,
                    size: object.size().unwrap_or(0).max(0) as u64,
                    modified_ms: object.last_modified().and_then(unix_ms),
                })
            })
            .collect();
        let next_start_after = if response.is_truncated().unwrap_or(false) {
            objects.last().map(|o| o.key.clone())
        } else {
            None
        };
        Ok(ListPage {
            objects,
            next_start_after,
        })
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let op = Op::Delete;
        self.inner
            .client
            .delete_object()
            .bucket(&self.inner.bucket)
            .key(self.full_key(key))
            .send()
            .await
            .map(|_| ())
            .map_err(|err| classify(op, key, err))
    }

    /// A multipart upload whose copied parts are UploadPartCopy requests. An upload that fails
    /// is aborted; one cut off by a crash stays until the bucket's lifecycle rule for incomplete
    /// multipart uploads removes it (see docs/operations.md).
    async fn compose(&self, key: &str, parts: Vec<ComposePart>) -> Result<(), StoreError> {
        let op = Op::Compose;
        super::check_compose(key, &parts)?;
        let created = self
            .inner
            .client
            .create_multipart_upload()
            .bucket(&self.inner.bucket)
            .key(self.full_key(key))
            .send()
            .await
            .map_err(|err| classify(op, key, err))?;
        let Some(upload_id) = created.upload_id() else {
            return Err(StoreError::Permanent {
                op,
                key: key.to_owned(),
                message: "the multipart upload was started without an upload id".into(),
            });
        };
        let result = self.upload_parts(key, upload_id, &parts).await;
        if result.is_err() {
            let aborted = self
                .inner
                .client
                .abort_multipart_upload()
                .bucket(&self.inner.bucket)
                .key(self.full_key(key))
                .upload_id(upload_id)
                .send()
                .await;
            if let Err(err) = aborted {
                tracing::warn!(key, error = %DisplayErrorContext(&err), "could not abort a failed multipart upload");
            }
        }
        result
    }
}

/// S3's Last-Modified in Unix milliseconds (it has whole seconds; none before 1970).
fn unix_ms(at: &aws_sdk_s3::primitives::DateTime) -> Option<u64> {
    u64::try_from(at.to_millis().ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_sources_are_url_encoded_but_keep_their_slashes() {
        assert_eq!(
            copy_source("b", "p/data/star one/00-01-ab"),
            "b/p/data/star%20one/00-01-ab"
        );
        assert_eq!(copy_source("b", "a+b%/é"), "b/a%2Bb%25/%C3%A9");
    }

    fn chunked(chunks: &'static [&'static [u8]]) -> ByteStream {
        let frames = chunks.iter().map(|c| {
            Ok::<_, std::convert::Infallible>(http_body::Frame::data(bytes::Bytes::from_static(c)))
        });
        let body = http_body_util::StreamBody::new(futures::stream::iter(frames));
        ByteStream::new(SdkBody::from_body_1_x(body))
    }

    #[tokio::test]
    async fn a_body_is_read_whole_whatever_its_length_was_said_to_be() {
        let chunks: &'static [&'static [u8]] = &[b"ab", b"cde", b"", b"f"];
        for hint in [None, Some(0), Some(2), Some(6), Some(100), Some(u64::MAX)] {
            let body = read_body(chunked(chunks), hint).await.unwrap();
            assert_eq!(&body[..], b"abcdef", "hint {hint:?}");
        }
    }
}
