//! `Metadata`, `CreateTopics` and `DeleteTopics`: topics are the streams named `topic/N`
//! (`nova_kafka::mapping`), so listing, creating and deleting a topic lists, creates and
//! deletes its partitions' streams.

use std::collections::BTreeMap;
use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{
    BrokerId, CreateTopicsRequest, CreateTopicsResponse, DeleteTopicsRequest, DeleteTopicsResponse,
    MetadataRequest, MetadataResponse, ResponseKind, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use nova_chain::streams::StreamState;
use nova_core::catalog::{Retention, StorageClass};
use nova_core::limits::{KAFKA_MAX_LISTED_PARTITIONS, KAFKA_MAX_PARTITIONS, LIST_STREAMS_MAX};
use nova_kafka::errors::KafkaRefusal;
use nova_kafka::mapping::{invalid_topic, stream_of, topic_of};
use nova_proto::RequestError;

use nova_server::net::{Principal, Scope};

use super::Kafka;

/// Seeing a topic in Metadata takes any scope on its first partition's stream.
const ANY_SCOPE: [Scope; 3] = [Scope::Read, Scope::Append, Scope::Admin];

/// The partitions of `topic` this star has, by partition number.
pub fn partitions(kafka: &Kafka, topic: &str) -> BTreeMap<i32, Arc<StreamState>> {
    let prefix = format!("{topic}/");
    kafka
        .ctx
        .star
        .streams()
        .list(&prefix, "", KAFKA_MAX_PARTITIONS as usize + 1)
        .into_iter()
        .filter_map(|stream| {
            let (of, partition) = topic_of(stream.name())?;
            (of == topic).then_some((partition, stream.clone()))
        })
        .collect()
}

/// Every topic, with its partitions, up to `KAFKA_MAX_LISTED_PARTITIONS` in all.
fn all_topics(kafka: &Kafka) -> BTreeMap<String, Vec<i32>> {
    let streams = kafka.ctx.star.streams();
    let mut topics: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    let mut listed = 0u32;
    let mut after = String::new();
    loop {
        let page = streams.list("", &after, LIST_STREAMS_MAX as usize);
        let Some(last) = page.last() else { break };
        after = last.name().to_owned();
        for stream in &page {
            if let Some((topic, partition)) = topic_of(stream.name()) {
                topics.entry(topic.to_owned()).or_default().push(partition);
                listed += 1;
            }
        }
        if page.len() < LIST_STREAMS_MAX as usize {
            break;
        }
        if listed >= KAFKA_MAX_LISTED_PARTITIONS {
            // The last topic may be cut short: leave it out rather than show it with fewer
            // partitions than it has (clients would hash keys onto the wrong ones).
            let last = topics.keys().next_back().cloned();
            if let Some(last) = last {
                topics.remove(&last);
            }
            break;
        }
    }
    for partitions in topics.values_mut() {
        partitions.sort_unstable();
    }
    topics
}

/// Creates partitions `from..to` of `topic` (those missing), unlimited retention unless given.
async fn create_partitions(
    kafka: &Kafka,
    topic: &str,
    from: i32,
    to: i32,
    retention: Retention,
) -> Result<(), RequestError> {
    let streams = kafka.ctx.star.streams();
    for partition in from..to {
        let name = stream_of(topic, partition);
        match streams
            .create_with(&name, StorageClass::Standard, retention)
            .await
        {
            Ok(_) | Err(RequestError::StreamExists(_)) => {}
            Err(error) => return Err(error),
        }
    }
    tracing::info!(topic, partitions = to - from, "Kafka topic created");
    Ok(())
}

pub async fn metadata(
    kafka: &Kafka,
    principal: Option<&Principal>,
    request: MetadataRequest,
    version: i16,
) -> ResponseKind {
    let node = BrokerId(kafka.node_id);
    let asked: Option<Vec<String>> = match request.topics {
        Some(topics) if !(version == 0 && topics.is_empty()) => Some(
            topics
                .into_iter()
                .map(|t| t.name.map(|n| n.0.to_string()).unwrap_or_default())
                .collect(),
        ),
        _ => None,
    };
    let auto_create =
        kafka.auto_create_partitions > 0 && (version < 4 || request.allow_auto_topic_creation);
    let mut topics = Vec::new();
    let listed: Vec<(String, Result<Vec<i32>, KafkaRefusal>)> = match asked {
        // Every topic the token may see anything of.
        None => all_topics(kafka)
            .into_iter()
            .filter(|(topic, _)| {
                principal.is_none_or(|p| p.allows_any(&ANY_SCOPE, &stream_of(topic, 0)).is_ok())
            })
            .map(|(topic, partitions)| (topic, Ok(partitions)))
            .collect(),
        Some(names) => {
            // Each name once, and at most KAFKA_MAX_LISTED_PARTITIONS partitions in all: the
            // rest are answered LEADER_NOT_AVAILABLE, which clients ask about again.
            let mut seen = std::collections::HashSet::new();
            let mut listed = Vec::new();
            let mut partitions = 0usize;
            for topic in names {
                if !seen.insert(topic.clone()) {
                    continue;
                }
                let found = if partitions >= KAFKA_MAX_LISTED_PARTITIONS as usize {
                    Err(KafkaRefusal::new(
                        ResponseError::LeaderNotAvailable,
                        "this answer lists its most partitions; ask again",
                    ))
                } else {
                    lookup(kafka, principal, &topic, auto_create).await
                };
                if let Ok(found) = &found {
                    partitions += found.len();
                }
                listed.push((topic, found));
            }
            listed
        }
    };
    for (topic, found) in listed {
        let mut entry = MetadataResponseTopic::default()
            .with_name(Some(TopicName(StrBytes::from_string(topic))));
        match found {
            Ok(partitions) => {
                entry.partitions = partitions
                    .into_iter()
                    .map(|partition| {
                        let mut p = MetadataResponsePartition::default()
                            .with_partition_index(partition)
                            .with_leader_id(node)
                            .with_replica_nodes(vec![node])
                            .with_isr_nodes(vec![node]);
                        if version >= 7 {
                            p.leader_epoch = 0;
                        }
                        p
                    })
                    .collect();
            }
            Err(refusal) => {
                kafka.metrics.answered("Metadata", refusal.error);
                entry.error_code = refusal.code();
            }
        }
        topics.push(entry);
    }
    let mut response = MetadataResponse::default()
        .with_brokers(vec![
            MetadataResponseBroker::default()
                .with_node_id(node)
                .with_host(StrBytes::from_string(kafka.host.clone()))
                .with_port(kafka.port),
        ])
        .with_topics(topics);
    if version >= 1 {
        response.controller_id = node;
    }
    if version >= 2 {
        response.cluster_id = Some(StrBytes::from_string(format!(
            "nova-{}",
            kafka.ctx.star.config().star
        )));
    }
    ResponseKind::Metadata(response)
}

/// The partitions of one topic a client asked about, created first when it has none and
/// auto-creation is on.
async fn lookup(
    kafka: &Kafka,
    principal: Option<&Principal>,
    topic: &str,
    auto_create: bool,
) -> Result<Vec<i32>, KafkaRefusal> {
    if let Some(why) = invalid_topic(topic) {
        return Err(KafkaRefusal::new(
            ResponseError::InvalidTopicException,
            format!("topic name {topic:?} {why}"),
        ));
    }
    kafka
        .ctx
        .access
        .check_any(principal, &ANY_SCOPE, &stream_of(topic, 0))
        .map_err(|e| KafkaRefusal::from(&e))?;
    let found = partitions(kafka, topic);
    if !found.is_empty() {
        return Ok(found.into_keys().collect());
    }
    if !auto_create {
        return Err(KafkaRefusal::new(
            ResponseError::UnknownTopicOrPartition,
            format!("no topic {topic:?}"),
        ));
    }
    let count = kafka.auto_create_partitions as i32;
    for partition in 0..count {
        super::allowed(kafka, principal, Scope::Admin, &stream_of(topic, partition))?;
    }
    create_partitions(kafka, topic, 0, count, Retention::default())
        .await
        .map_err(|e| KafkaRefusal::from(&e))?;
    Ok((0..count).collect())
}

pub async fn create(
    kafka: &Kafka,
    principal: Option<&Principal>,
    request: CreateTopicsRequest,
    version: i16,
) -> ResponseKind {
    let mut results = Vec::with_capacity(request.topics.len());
    for topic in request.topics {
        let name = topic.name.0.to_string();
        let partitions = match topic.num_partitions {
            -1 => kafka.auto_create_partitions.max(1) as i32,
            n => n,
        };
        let outcome = async {
            if let Some(why) = invalid_topic(&name) {
                return Err(KafkaRefusal::new(
                    ResponseError::InvalidTopicException,
                    format!("topic name {name:?} {why}"),
                ));
            }
            if partitions < 1 || partitions as u32 > KAFKA_MAX_PARTITIONS {
                return Err(KafkaRefusal::new(
                    ResponseError::InvalidPartitions,
                    format!("a topic has 1 to {KAFKA_MAX_PARTITIONS} partitions, not {partitions}"),
                ));
            }
            if topic.replication_factor == 0 || topic.replication_factor < -1 {
                return Err(KafkaRefusal::new(
                    ResponseError::InvalidReplicationFactor,
                    "replication factor must be -1 or at least 1 (Nova's copies are the object \
                     store's; the factor is not used)",
                ));
            }
            for partition in 0..partitions {
                super::allowed(kafka, principal, Scope::Admin, &stream_of(&name, partition))?;
            }
            let retention = retention_of(&topic.configs)?;
            if !self::partitions(kafka, &name).is_empty() {
                return Err(KafkaRefusal::new(
                    ResponseError::TopicAlreadyExists,
                    format!("topic {name:?} already exists"),
                ));
            }
            if !request.validate_only {
                create_partitions(kafka, &name, 0, partitions, retention)
                    .await
                    .map_err(|e| KafkaRefusal::from(&e))?;
            }
            Ok(())
        }
        .await;
        let mut result = CreatableTopicResult::default().with_name(topic.name);
        if version >= 5 {
            result.num_partitions = partitions;
            result.replication_factor = 1;
        }
        if let Err(refusal) = outcome {
            kafka.metrics.answered("CreateTopics", refusal.error);
            result.error_code = refusal.code();
            result.error_message = Some(StrBytes::from_string(refusal.message));
            if version >= 5 {
                result.num_partitions = -1;
                result.replication_factor = -1;
            }
        }
        results.push(result);
    }
    ResponseKind::CreateTopics(CreateTopicsResponse::default().with_topics(results))
}

/// The retention a topic's configs ask for: `retention.ms` and `retention.bytes` (per
/// partition, as in Kafka; -1 for none). `cleanup.policy=compact` is refused: Nova keeps
/// every record until retention trims it. Other configs are accepted and not used.
fn retention_of(
    configs: &[kafka_protocol::messages::create_topics_request::CreatableTopicConfig],
) -> Result<Retention, KafkaRefusal> {
    let mut retention = Retention::default();
    for config in configs {
        let value = config.value.as_deref().unwrap_or("");
        let limit = || match value.parse::<i64>() {
            Ok(-1) => Ok(None),
            Ok(n) if n > 0 => Ok(Some(n as u64)),
            _ => Err(KafkaRefusal::new(
                ResponseError::InvalidConfig,
                format!(
                    "{} must be -1 or a positive number, not {value:?}",
                    &*config.name
                ),
            )),
        };
        match &*config.name {
            "retention.ms" => retention.age_ms = limit()?,
            "retention.bytes" => retention.bytes = limit()?,
            "cleanup.policy" if value.split(',').any(|p| p.trim() == "compact") => {
                return Err(KafkaRefusal::new(
                    ResponseError::InvalidConfig,
                    "cleanup.policy=compact is not supported: Nova keeps every record until \
                     retention trims it",
                ));
            }
            _ => {}
        }
    }
    Ok(retention)
}

pub async fn delete(
    kafka: &Kafka,
    principal: Option<&Principal>,
    request: DeleteTopicsRequest,
    version: i16,
) -> ResponseKind {
    let mut results = Vec::with_capacity(request.topic_names.len());
    for name in request.topic_names {
        let topic = name.0.to_string();
        // Checked before anything is looked up, so the answer says nothing of a topic the
        // token may not manage.
        let allowed = super::allowed(kafka, principal, Scope::Admin, &stream_of(&topic, 0));
        let found = match allowed {
            Ok(()) => partitions(kafka, &topic),
            Err(_) => BTreeMap::new(),
        };
        let allowed = allowed.and_then(|()| {
            found.values().try_for_each(|stream| {
                super::allowed(kafka, principal, Scope::Admin, stream.name())
            })
        });
        let outcome = if let Err(refusal) = allowed {
            Err(refusal)
        } else if found.is_empty() {
            Err(KafkaRefusal::new(
                ResponseError::UnknownTopicOrPartition,
                format!("no topic {topic:?}"),
            ))
        } else {
            let mut outcome = Ok(());
            for stream in found.values() {
                if let Err(error) = kafka.ctx.star.streams().delete(stream.name()).await {
                    outcome = Err(KafkaRefusal::from(&error));
                    break;
                }
            }
            if outcome.is_ok() {
                tracing::info!(topic, partitions = found.len(), "Kafka topic deleted");
            }
            outcome
        };
        let mut result = DeletableTopicResult::default().with_name(Some(name));
        if let Err(refusal) = outcome {
            kafka.metrics.answered("DeleteTopics", refusal.error);
            result.error_code = refusal.code();
            if version >= 5 {
                result.error_message = Some(StrBytes::from_string(refusal.message));
            }
        }
        results.push(result);
    }
    ResponseKind::DeleteTopics(DeleteTopicsResponse::default().with_responses(results))
}

/// `CreatePartitions`: a topic grows to `count` partitions (new streams for the new ones); it
/// never shrinks.
pub async fn grow(
    kafka: &Kafka,
    principal: Option<&Principal>,
    request: kafka_protocol::messages::CreatePartitionsRequest,
) -> ResponseKind {
    use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
    let mut results = Vec::with_capacity(request.topics.len());
    for topic in request.topics {
        let name = topic.name.0.to_string();
        let outcome = async {
            // Admin on every partition the topic would have, checked before anything is
            // looked up (an answer must not say how many partitions a topic the token may not
            // manage has).
            for partition in 0..topic.count.clamp(1, KAFKA_MAX_PARTITIONS as i32) {
                super::allowed(kafka, principal, Scope::Admin, &stream_of(&name, partition))?;
            }
            let have = partitions(kafka, &name);
            let Some((&last, _)) = have.last_key_value() else {
                return Err(KafkaRefusal::new(
                    ResponseError::UnknownTopicOrPartition,
                    format!("no topic {name:?}"),
                ));
            };
            let from = last + 1;
            if topic.count <= from || topic.count as u32 > KAFKA_MAX_PARTITIONS {
                return Err(KafkaRefusal::new(
                    ResponseError::InvalidPartitions,
                    format!(
                        "topic {name:?} has {from} partitions; it can grow to at most \
                         {KAFKA_MAX_PARTITIONS}, never shrink"
                    ),
                ));
            }
            if request.validate_only {
                return Ok(());
            }
            // New partitions keep the topic's retention (its first partition's).
            let retention = have
                .values()
                .next()
                .map(|s| s.retention())
                .unwrap_or_default();
            create_partitions(kafka, &name, from, topic.count, retention)
                .await
                .map_err(|e| KafkaRefusal::from(&e))
        }
        .await;
        let mut result = CreatePartitionsTopicResult::default().with_name(topic.name);
        if let Err(refusal) = outcome {
            kafka.metrics.answered("CreatePartitions", refusal.error);
            result.error_code = refusal.code();
            result.error_message = Some(StrBytes::from_string(refusal.message));
        }
        results.push(result);
    }
    ResponseKind::CreatePartitions(
        kafka_protocol::messages::CreatePartitionsResponse::default().with_results(results),
    )
}
