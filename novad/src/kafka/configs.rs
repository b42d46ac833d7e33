//! `DescribeConfigs`, `AlterConfigs` and `IncrementalAlterConfigs`: what admin tools show and
//! change of a topic. A topic's configs are its partitions' streams' retention
//! (`retention.ms`, `retention.bytes`, which may be changed) and what Nova fixes for every
//! topic (shown read-only); a broker's are the listener's settings (read-only).

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::alter_configs_response::AlterConfigsResourceResponse as LegacyAltered;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult,
};
use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
use kafka_protocol::messages::{
    AlterConfigsRequest, AlterConfigsResponse, DescribeConfigsRequest, DescribeConfigsResponse,
    IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse, ResponseKind,
};
use kafka_protocol::protocol::StrBytes;

use nova_core::catalog::Retention;
use nova_kafka::errors::KafkaRefusal;
use nova_kafka::mapping::stream_of;
use nova_server::net::{Principal, Scope};

use super::Kafka;
use super::topics::{ANY_SCOPE, check_topic, partitions};

/// Kafka's resource types.
const TOPIC: i8 = 2;
const BROKER: i8 = 4;

/// Where a config's value comes from (Kafka's `ConfigSource`).
const DYNAMIC_TOPIC_CONFIG: i8 = 1;
const STATIC_BROKER_CONFIG: i8 = 4;
const DEFAULT_CONFIG: i8 = 5;

/// Kafka's `ConfigType`.
const BOOLEAN: i8 = 1;
const STRING: i8 = 2;
const INT: i8 = 3;
const LONG: i8 = 5;

/// Resources one request may name; the rest are refused (each costs a catalog read).
const MAX_RESOURCES: usize = 64;

fn too_many() -> KafkaRefusal {
    KafkaRefusal::new(
        ResponseError::InvalidRequest,
        format!("at most {MAX_RESOURCES} resources are served per request"),
    )
}

/// The configs that may be changed.
const RETENTION_MS: &str = "retention.ms";
const RETENTION_BYTES: &str = "retention.bytes";

/// One config as described.
struct Config {
    name: &'static str,
    value: String,
    read_only: bool,
    source: i8,
    kind: i8,
    doc: &'static str,
}

fn text(value: impl Into<String>) -> StrBytes {
    StrBytes::from_string(value.into())
}

fn limit_text(limit: Option<u64>) -> String {
    limit.map_or_else(|| "-1".to_owned(), |n| n.to_string())
}

fn topic_configs(kafka: &Kafka, retention: Retention) -> Vec<Config> {
    let source = |set: bool| {
        if set {
            DYNAMIC_TOPIC_CONFIG
        } else {
            DEFAULT_CONFIG
        }
    };
    let fixed = |name, value: String, kind, doc| Config {
        name,
        value,
        read_only: true,
        source: DEFAULT_CONFIG,
        kind,
        doc,
    };
    vec![
        Config {
            name: RETENTION_MS,
            value: limit_text(retention.age_ms),
            read_only: false,
            source: source(retention.age_ms.is_some()),
            kind: LONG,
            doc: "How long a partition keeps its records (-1: no limit); whole objects are \
                  trimmed from the front once older.",
        },
        Config {
            name: RETENTION_BYTES,
            value: limit_text(retention.bytes),
            read_only: false,
            source: source(retention.bytes.is_some()),
            kind: LONG,
            doc: "How many bytes a partition keeps (-1: no limit); whole objects are trimmed \
                  from the front past it.",
        },
        fixed(
            "cleanup.policy",
            "delete".into(),
            STRING,
            "Records are kept until retention trims them; compaction is not supported.",
        ),
        fixed(
            "max.message.bytes",
            kafka.ctx.caps.max_batch_bytes.to_string(),
            INT,
            "The largest record batch a produce may carry (--max-batch-bytes).",
        ),
        fixed(
            "message.timestamp.type",
            "CreateTime".into(),
            STRING,
            "Records keep the timestamp their producer gave them.",
        ),
        fixed(
            "compression.type",
            "producer".into(),
            STRING,
            "Batches are accepted in any codec and stored decompressed.",
        ),
        fixed(
            "min.insync.replicas",
            "1".into(),
            INT,
            "A produce is answered once the object store holds the records.",
        ),
    ]
}

fn broker_configs(kafka: &Kafka) -> Vec<Config> {
    let fixed = |name, value: String, kind, doc| Config {
        name,
        value,
        read_only: true,
        source: STATIC_BROKER_CONFIG,
        kind,
        doc,
    };
    vec![
        fixed(
            "broker.id",
            kafka.node_id.to_string(),
            INT,
            "This star's broker id (a hash of its star id).",
        ),
        fixed(
            "auto.create.topics.enable",
            (kafka.auto_create_partitions > 0).to_string(),
            BOOLEAN,
            "Whether Metadata creates the topics it is asked about (--kafka-auto-create-partitions).",
        ),
        fixed(
            "num.partitions",
            kafka.auto_create_partitions.max(1).to_string(),
            INT,
            "Partitions of a topic created without a count (--kafka-auto-create-partitions).",
        ),
        fixed(
            "message.max.bytes",
            kafka.ctx.caps.max_batch_bytes.to_string(),
            INT,
            "The largest record batch a produce may carry (--max-batch-bytes).",
        ),
    ]
}

/// A topic's retention, when `principal` may see it.
async fn topic_retention(
    kafka: &Kafka,
    principal: Option<&Principal>,
    topic: &str,
    scope: &[Scope],
) -> Result<(Vec<i32>, Retention), KafkaRefusal> {
    check_topic(kafka, principal, topic, scope)?;
    let found = partitions(kafka, topic).await?;
    let retention = found.values().next().copied().ok_or_else(|| {
        KafkaRefusal::new(
            ResponseError::UnknownTopicOrPartition,
            format!("no topic {topic:?}"),
        )
    })?;
    Ok((found.into_keys().collect(), retention))
}

pub async fn describe(
    kafka: &Kafka,
    principal: Option<&Principal>,
    request: DescribeConfigsRequest,
    version: i16,
) -> ResponseKind {
    let mut results = Vec::with_capacity(request.resources.len());
    for (at, resource) in request.resources.into_iter().enumerate() {
        let mut result = DescribeConfigsResult::default()
            .with_resource_type(resource.resource_type)
            .with_resource_name(resource.resource_name.clone());
        let configs = match resource.resource_type {
            _ if at >= MAX_RESOURCES => Err(too_many()),
            TOPIC => topic_retention(kafka, principal, &resource.resource_name, &ANY_SCOPE)
                .await
                .map(|(_, retention)| topic_configs(kafka, retention)),
            BROKER => Ok(broker_configs(kafka)),
            other => Err(KafkaRefusal::new(
                ResponseError::InvalidRequest,
                format!(
                    "configs of resource type {other} are not served; topics' and brokers' are"
                ),
            )),
        };
        match configs {
            Ok(configs) => {
                let wanted = resource.configuration_keys.as_ref();
                result.configs = configs
                    .into_iter()
                    .filter(|c| wanted.is_none_or(|keys| keys.iter().any(|k| &**k == c.name)))
                    .map(|c| {
                        let mut described = DescribeConfigsResourceResult::default()
                            .with_name(text(c.name))
                            .with_value(Some(text(c.value)))
                            .with_read_only(c.read_only)
                            .with_config_source(c.source)
                            .with_is_sensitive(false);
                        if version >= 3 {
                            described.config_type = c.kind;
                            if request.include_documentation {
                                described.documentation = Some(text(c.doc));
                            }
                        }
                        described
                    })
                    .collect();
            }
            Err(refusal) => {
                kafka.metrics.answered("DescribeConfigs", refusal.error);
                result.error_code = refusal.code();
                result.error_message = Some(text(refusal.message));
            }
        }
        results.push(result);
    }
    ResponseKind::DescribeConfigs(DescribeConfigsResponse::default().with_results(results))
}

/// How a config is changed.
enum Change {
    Set(String),
    /// Back to the default (no limit).
    Default,
}

/// Applies `changes` to a topic's retention: only `retention.ms` and `retention.bytes` may be
/// changed; `replace` (AlterConfigs) sets every config not named back to its default.
async fn alter_topic(
    kafka: &Kafka,
    principal: Option<&Principal>,
    topic: &str,
    changes: Vec<(String, Change)>,
    replace: bool,
    validate_only: bool,
) -> Result<(), KafkaRefusal> {
    let (partitions, mut retention) =
        topic_retention(kafka, principal, topic, &[Scope::Admin]).await?;
    if replace {
        retention = Retention::default();
    }
    let fixed = topic_configs(kafka, retention);
    for (name, change) in changes {
        // A read-only config sent back as it is (tools send every config they described).
        if let Change::Set(value) = &change
            && fixed
                .iter()
                .any(|c| c.read_only && c.name == name && c.value == *value)
        {
            continue;
        }
        let limit = match change {
            Change::Default => None,
            Change::Set(value) => match value.parse::<i64>() {
                Ok(-1) => None,
                Ok(n) if n > 0 => Some(n as u64),
                _ => {
                    return Err(KafkaRefusal::new(
                        ResponseError::InvalidConfig,
                        format!("{name} must be -1 or a positive number, not {value:?}"),
                    ));
                }
            },
        };
        match name.as_str() {
            RETENTION_MS => retention.age_ms = limit,
            RETENTION_BYTES => retention.bytes = limit,
            _ => {
                return Err(KafkaRefusal::new(
                    ResponseError::InvalidConfig,
                    format!(
                        "{name} cannot be changed: a topic's retention.ms and retention.bytes can"
                    ),
                ));
            }
        }
    }
    let streams: Vec<String> = partitions.iter().map(|p| stream_of(topic, *p)).collect();
    for stream in &streams {
        super::allowed(kafka, principal, Scope::Admin, stream)?;
    }
    // In a fleet, each stream's retention is changed by its leader, which trims it: every
    // partition is checked to be led here before any is changed (and when only validating).
    if kafka.ctx.fleet.is_some() {
        for stream in &streams {
            kafka
                .ctx
                .route(stream, None, principal)
                .await
                .map_err(|e| match e {
                    nova_proto::RequestError::NotLeader {
                        leader_id,
                        leader_addr,
                        ..
                    } => KafkaRefusal::new(
                        ResponseError::PolicyViolation,
                        format!(
                            "partition stream {stream:?} is led by star {leader_id} \
                             ({leader_addr}): in a fleet, a topic's configs are changed through \
                             a star leading all its partitions, or with `nova stream \
                             reconfigure` of each partition's stream"
                        ),
                    ),
                    other => KafkaRefusal::from(&other),
                })?;
        }
    }
    if validate_only {
        return Ok(());
    }
    for stream in &streams {
        kafka
            .ctx
            .star
            .streams()
            .set_retention(stream, retention)
            .await
            .map_err(|e| KafkaRefusal::from(&e))?;
    }
    tracing::info!(topic, ?retention, "Kafka topic reconfigured");
    Ok(())
}

/// The refusal of a resource that is not a topic.
fn not_a_topic(resource_type: i8) -> KafkaRefusal {
    KafkaRefusal::new(
        ResponseError::InvalidRequest,
        format!(
            "configs of resource type {resource_type} cannot be changed; a topic's retention can"
        ),
    )
}

/// What a request asked of one resource.
struct Asked<'a> {
    /// Its place in the request (past `MAX_RESOURCES`, refused).
    at: usize,
    resource_type: i8,
    name: &'a str,
    /// The changes, or why they cannot be made.
    changes: Result<Vec<(String, Change)>, KafkaRefusal>,
}

/// Applies one resource's changes (only a topic's may change); its answer's error code and
/// message, the refusal counted under `api`.
async fn alter_resource(
    kafka: &Kafka,
    principal: Option<&Principal>,
    asked: Asked<'_>,
    replace: bool,
    validate_only: bool,
    api: &str,
) -> (i16, Option<StrBytes>) {
    let outcome = match asked.resource_type {
        _ if asked.at >= MAX_RESOURCES => Err(too_many()),
        TOPIC => match asked.changes {
            Ok(changes) => {
                alter_topic(
                    kafka,
                    principal,
                    asked.name,
                    changes,
                    replace,
                    validate_only,
                )
                .await
            }
            Err(refusal) => Err(refusal),
        },
        other => Err(not_a_topic(other)),
    };
    match outcome {
        Ok(()) => (0, None),
        Err(refusal) => {
            kafka.metrics.answered(api, refusal.error);
            (refusal.code(), Some(text(refusal.message)))
        }
    }
}

/// AlterConfigs: each topic's configs replaced by those named (a value of none: the default).
pub async fn alter(
    kafka: &Kafka,
    principal: Option<&Principal>,
    request: AlterConfigsRequest,
) -> ResponseKind {
    let mut responses = Vec::with_capacity(request.resources.len());
    for (at, resource) in request.resources.into_iter().enumerate() {
        let changes = resource
            .configs
            .into_iter()
            .map(|c| {
                let change = c
                    .value
                    .map_or(Change::Default, |v| Change::Set(v.to_string()));
                (c.name.to_string(), change)
            })
            .collect();
        let asked = Asked {
            at,
            resource_type: resource.resource_type,
            name: &resource.resource_name,
            changes: Ok(changes),
        };
        let (error_code, error_message) = alter_resource(
            kafka,
            principal,
            asked,
            true,
            request.validate_only,
            "AlterConfigs",
        )
        .await;
        responses.push(
            LegacyAltered::default()
                .with_resource_type(resource.resource_type)
                .with_resource_name(resource.resource_name)
                .with_error_code(error_code)
                .with_error_message(error_message),
        );
    }
    ResponseKind::AlterConfigs(AlterConfigsResponse::default().with_responses(responses))
}

/// IncrementalAlterConfigs: SET and DELETE of a topic's configs.
pub async fn alter_incrementally(
    kafka: &Kafka,
    principal: Option<&Principal>,
    request: IncrementalAlterConfigsRequest,
) -> ResponseKind {
    let mut responses = Vec::with_capacity(request.resources.len());
    for (at, resource) in request.resources.into_iter().enumerate() {
        let changes = resource
            .configs
            .into_iter()
            .map(|c| {
                let change = match (c.config_operation, c.value) {
                    (0, Some(value)) => Change::Set(value.to_string()),
                    (1, _) => Change::Default,
                    _ => {
                        return Err(KafkaRefusal::new(
                            ResponseError::InvalidConfig,
                            format!(
                                "{}: only SET (with a value) and DELETE are served",
                                &*c.name
                            ),
                        ));
                    }
                };
                Ok((c.name.to_string(), change))
            })
            .collect();
        let asked = Asked {
            at,
            resource_type: resource.resource_type,
            name: &resource.resource_name,
            changes,
        };
        let (error_code, error_message) = alter_resource(
            kafka,
            principal,
            asked,
            false,
            request.validate_only,
            "IncrementalAlterConfigs",
        )
        .await;
        responses.push(
            AlterConfigsResourceResponse::default()
                .with_resource_type(resource.resource_type)
                .with_resource_name(resource.resource_name)
                .with_error_code(error_code)
                .with_error_message(error_message),
        );
    }
    ResponseKind::IncrementalAlterConfigs(
        IncrementalAlterConfigsResponse::default().with_responses(responses),
    )
}
