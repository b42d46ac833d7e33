//! `Metadata`, `CreateTopics` and `DeleteTopics`: topics are the streams named `topic/N`
//! (`nova_kafka::mapping`), so listing, creating and deleting a topic lists, creates and
//! deletes its partitions' streams.

use std::collections::BTreeMap;

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

use nova_core::catalog::{Retention, StorageClass};
use nova_core::limits::{KAFKA_MAX_LISTED_PARTITIONS, KAFKA_MAX_PARTITIONS, LIST_STREAMS_MAX};
use nova_kafka::errors::KafkaRefusal;
use nova_kafka::mapping::{invalid_topic, stream_of, topic_of};
use nova_proto::RequestError;

use nova_server::net::{Principal, Scope};

use super::Kafka;

/// Seeing a topic in Metadata takes any scope on its first partition's stream.
pub(super) const ANY_SCOPE: [Scope; 3] = [Scope::Read, Scope::Append, Scope::Admin];

/// Streams named `{prefix}…` after `after` (at most `limit`), with their retention: in a
/// fleet every star's, from the shared catalog; on a single star, its own.
async fn streams_named(
    kafka: &Kafka,
    prefix: &str,
    after: &str,
    limit: usize,
) -> Result<Vec<(String, Retention)>, KafkaRefusal> {
    let streams = kafka.ctx.star.streams();
    if kafka.ctx.fleet.is_none() {
        return Ok(streams
            .list(prefix, after, limit)
            .into_iter()
            .map(|s| (s.name().to_owned(), s.retention()))
            .collect());
    }
    let metas = streams
        .catalog()
        .streams_with_prefix(prefix, after, limit)
        .await
        .map_err(|e| KafkaRefusal::from(&RequestError::from(e)))?;
    Ok(metas.into_iter().map(|m| (m.name, m.retention)).collect())
}

/// The partitions of `topic`, by partition number, with their retention.
pub async fn partitions(
    kafka: &Kafka,
    topic: &str,
) -> Result<BTreeMap<i32, Retention>, KafkaRefusal> {
    let prefix = format!("{topic}/");
    Ok(
        streams_named(kafka, &prefix, "", KAFKA_MAX_PARTITIONS as usize + 1)
            .await?
            .into_iter()
            .filter_map(|(stream, retention)| {
                let (of, partition) = topic_of(&stream)?;
                (of == topic).then_some((partition, retention))
            })
            .collect(),
    )
}

/// Streams an all-topics listing reads at most (in a fleet, etcd scans of a page each):
/// topics among the streams past it, by name, are not listed.
const MAX_SCANNED_FOR_TOPICS: usize = 4 * KAFKA_MAX_LISTED_PARTITIONS as usize;

/// Every topic, with its partitions, up to `KAFKA_MAX_LISTED_PARTITIONS` in all, among the
/// first `MAX_SCANNED_FOR_TOPICS` streams by name.
async fn all_topics(kafka: &Kafka) -> Result<BTreeMap<String, Vec<i32>>, KafkaRefusal> {
    let mut topics: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    let mut listed = 0u32;
    let mut scanned = 0usize;
    let mut after = String::new();
    loop {
        let page = streams_named(kafka, "", &after, LIST_STREAMS_MAX as usize).await?;
        let Some((last, _)) = page.last() else { break };
        after = last.clone();
        scanned += page.len();
        for (stream, _) in &page {
            if let Some((topic, partition)) = topic_of(stream) {
                topics.entry(topic.to_owned()).or_default().push(partition);
                listed += 1;
            }
        }
        if page.len() < LIST_STREAMS_MAX as usize {
            break;
        }
        if listed >= KAFKA_MAX_LISTED_PARTITIONS || scanned >= MAX_SCANNED_FOR_TOPICS {
            // The topic of the last stream read may be cut short: leave it out rather than
            // show it with fewer partitions than it has (clients would hash keys onto the
            // wrong ones). Streams sort by name, so it is that stream's topic, which need not
            // be the last topic by name ("a.b/0" sorts before "a/0").
            if let Some((topic, _)) = topic_of(&after) {
                topics.remove(topic);
            }
            break;
        }
    }
    for partitions in topics.values_mut() {
        partitions.sort_unstable();
    }
    Ok(topics)
}

/// Who leads each partition of `topic`, as a broker id, or LEADER_NOT_AVAILABLE (its leader
/// departed and is not yet taken over, or serves no Kafka clients). A partition without a
/// leader yet names this star: a produce to it places it, here or on another star, whose
/// NOT_LEADER_OR_FOLLOWER sends the client back for Metadata.
async fn leaders(
    kafka: &Kafka,
    topic: &str,
) -> Result<std::collections::HashMap<i32, Result<super::Broker, ResponseError>>, KafkaRefusal> {
    let Some(fleet) = &kafka.ctx.fleet else {
        return Ok(Default::default());
    };
    let records = fleet
        .leaders_under(&format!("{topic}/"), KAFKA_MAX_PARTITIONS as usize + 1)
        .await
        .map_err(|e| KafkaRefusal::from(&e))?;
    Ok(records
        .into_iter()
        .filter_map(|(stream, leader)| {
            let (of, partition) = topic_of(&stream)?;
            let node = leader
                .as_ref()
                .and_then(super::Broker::of)
                .ok_or(ResponseError::LeaderNotAvailable);
            (of == topic).then_some((partition, node))
        })
        .collect())
}

/// Creates partitions `from..to` of `topic` (those missing), unlimited retention unless given;
/// in a fleet each is placed on the least-loaded star.
async fn create_partitions(
    kafka: &Kafka,
    topic: &str,
    from: i32,
    to: i32,
    retention: Retention,
) -> Result<(), RequestError> {
    let star = &kafka.ctx.star;
    for partition in from..to {
        let name = stream_of(topic, partition);
        let created = match &kafka.ctx.fleet {
            Some(fleet) => {
                let created = fleet
                    .create_stream(star, &name, StorageClass::Standard, retention)
                    .await;
                kafka.ctx.count_fleet_shed(&created, &name, None);
                created.map(|_| ())
            }
            None => star
                .streams()
                .create_with(&name, StorageClass::Standard, retention)
                .await
                .map(|_| ()),
        };
        match created {
            Ok(()) | Err(RequestError::StreamExists(_)) => {}
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
) -> Result<ResponseKind, KafkaRefusal> {
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
    let mut brokers = kafka.brokers();
    let listed: Vec<(String, Result<Vec<i32>, KafkaRefusal>)> = match asked {
        // Every topic the token may see anything of.
        // A listing that fails is not answered as no topics: a client subscribed by pattern
        // would drop every partition.
        None => all_topics(kafka)
            .await?
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
        let found = match found {
            Ok(partitions) => leaders(kafka, &topic).await.map(|led| (partitions, led)),
            Err(refusal) => Err(refusal),
        };
        let mut entry = MetadataResponseTopic::default()
            .with_name(Some(TopicName(StrBytes::from_string(topic))));
        match found {
            Ok((partitions, led)) => {
                // A leader this star's view of the fleet has not seen yet is named too.
                for broker in led.values().flatten() {
                    if !brokers.contains(broker) {
                        brokers.push(broker.clone());
                    }
                }
                entry.partitions = partitions
                    .into_iter()
                    .map(|partition| {
                        let leader = match led.get(&partition) {
                            Some(Ok(broker)) => Ok(broker.node_id),
                            Some(Err(error)) => Err(*error),
                            None => Ok(node.0),
                        };
                        let mut p =
                            MetadataResponsePartition::default().with_partition_index(partition);
                        match leader {
                            Ok(leader) => {
                                let leader = BrokerId(leader);
                                p = p
                                    .with_leader_id(leader)
                                    .with_replica_nodes(vec![leader])
                                    .with_isr_nodes(vec![leader]);
                            }
                            Err(error) => {
                                kafka.metrics.answered("Metadata", error);
                                p = p.with_error_code(error.code()).with_leader_id(BrokerId(-1));
                            }
                        }
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
    let brokers = brokers
        .into_iter()
        .map(|b| {
            MetadataResponseBroker::default()
                .with_node_id(BrokerId(b.node_id))
                .with_host(StrBytes::from_string(b.host))
                .with_port(b.port)
        })
        .collect();
    let mut response = MetadataResponse::default()
        .with_brokers(brokers)
        .with_topics(topics);
    if version >= 1 {
        response.controller_id = node;
    }
    if version >= 2 {
        // One id for the whole fleet: clients warn when it changes between brokers.
        response.cluster_id = Some(StrBytes::from_string(match &kafka.ctx.fleet {
            Some(_) => "nova-fleet".to_owned(),
            None => format!("nova-{}", kafka.ctx.star.config().star),
        }));
    }
    Ok(ResponseKind::Metadata(response))
}

/// Refuses a name no topic can have.
fn valid_topic(topic: &str) -> Result<(), KafkaRefusal> {
    match invalid_topic(topic) {
        Some(why) => Err(KafkaRefusal::new(
            ResponseError::InvalidTopicException,
            format!("topic name {topic:?} {why}"),
        )),
        None => Ok(()),
    }
}

/// Refuses a name no topic can have, then a token with none of `scopes` on the topic (its
/// first partition's stream), before anything is looked up: an answer says nothing of a topic
/// the token may not see.
pub(super) fn check_topic(
    kafka: &Kafka,
    principal: Option<&Principal>,
    topic: &str,
    scopes: &[Scope],
) -> Result<(), KafkaRefusal> {
    valid_topic(topic)?;
    kafka
        .ctx
        .access
        .check_any(principal, scopes, &stream_of(topic, 0))
        .map_err(|e| KafkaRefusal::from(&e))
}

/// The partitions of one topic a client asked about, created first when it has none and
/// auto-creation is on.
async fn lookup(
    kafka: &Kafka,
    principal: Option<&Principal>,
    topic: &str,
    auto_create: bool,
) -> Result<Vec<i32>, KafkaRefusal> {
    check_topic(kafka, principal, topic, &ANY_SCOPE)?;
    let found = partitions(kafka, topic).await?;
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
            valid_topic(&name)?;
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
            if !self::partitions(kafka, &name).await?.is_empty() {
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
            Ok(()) => partitions(kafka, &topic).await,
            Err(refusal) => Err(refusal),
        };
        let outcome = match found {
            Err(refusal) => Err(refusal),
            Ok(found) if found.is_empty() => Err(KafkaRefusal::new(
                ResponseError::UnknownTopicOrPartition,
                format!("no topic {topic:?}"),
            )),
            Ok(found) => {
                let streams: Vec<String> = found.keys().map(|p| stream_of(&topic, *p)).collect();
                match streams
                    .iter()
                    .try_for_each(|s| super::allowed(kafka, principal, Scope::Admin, s))
                {
                    Err(refusal) => Err(refusal),
                    Ok(()) => delete_streams(kafka, &topic, &streams).await,
                }
            }
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

/// Deletes a topic's streams. In a fleet each is deleted by its leader: a topic with a
/// partition led by another star is refused before any is deleted, naming it.
async fn delete_streams(
    kafka: &Kafka,
    topic: &str,
    streams: &[String],
) -> Result<(), KafkaRefusal> {
    let star = &kafka.ctx.star;
    if let Some(fleet) = &kafka.ctx.fleet {
        for stream in streams {
            let leader = fleet
                .leader_of(stream)
                .await
                .map_err(|e| KafkaRefusal::from(&e))?;
            if let Some(leader) = leader.filter(|l| l.id != fleet.id()) {
                return Err(KafkaRefusal::new(
                    ResponseError::PolicyViolation,
                    format!(
                        "partition stream {stream:?} is led by star {} ({}): in a fleet, a \
                         topic is deleted through a star leading all its partitions, or with \
                         `nova delete` of each partition's stream",
                        leader.id, leader.advertise
                    ),
                ));
            }
        }
    }
    for stream in streams {
        match &kafka.ctx.fleet {
            Some(fleet) => fleet.delete_stream(star, stream).await,
            None => star.streams().delete(stream).await,
        }
        .map_err(|e| KafkaRefusal::from(&e))?;
    }
    tracing::info!(topic, partitions = streams.len(), "Kafka topic deleted");
    Ok(())
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
            let have = partitions(kafka, &name).await?;
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
            let retention = have.values().next().copied().unwrap_or_default();
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
