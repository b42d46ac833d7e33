"""Kafka clients nobody here wrote against Nova's Kafka listener: confluent-kafka (librdkafka)
manages topics and produces with every codec; kafka-python reads everything back by
partition, seeks by time and lists offsets. Run by novad/tests/kafka.rs with the bootstrap
address; prints "all checks passed" when every check holds."""

import sys
import time

from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, TopicPartition

bootstrap = sys.argv[1]
admin = AdminClient({"bootstrap.servers": bootstrap})


def create(topic, **kwargs):
    futures = admin.create_topics([NewTopic(topic, **kwargs)], operation_timeout=10)
    return futures[topic].result(timeout=30)


# Topics: created with partitions and a retention; refused by name, by policy and twice.
create("orders", num_partitions=3, replication_factor=1, config={"retention.ms": "3600000"})
for bad, why in [
    (dict(topic="bad topic!", num_partitions=1), "TOPIC_EXCEPTION"),
    (dict(topic="compacted", num_partitions=1, config={"cleanup.policy": "compact"}), "INVALID_CONFIG"),
    (dict(topic="orders", num_partitions=3), "TOPIC_ALREADY_EXISTS"),
]:
    try:
        create(bad.pop("topic"), **bad)
        raise SystemExit(f"creating {bad} should have failed with {why}")
    except Exception as e:  # confluent_kafka.KafkaException wrapping the KafkaError
        assert why in str(e), f"{why} expected, got {e}"

metadata = admin.list_topics(timeout=10)
orders = metadata.topics["orders"]
assert sorted(orders.partitions) == [0, 1, 2], orders.partitions
# One star: it leads every partition, and is the only broker.
assert len(metadata.brokers) == 1, metadata.brokers
assert all(p.leader in metadata.brokers for p in orders.partitions.values())
assert "compacted" not in metadata.topics
print("topics ok")

# Producing: every codec librdkafka has, acks=all, keys, headers and timestamps.
sent = {0: [], 1: [], 2: []}
base_ts = 1_700_000_000_000
for codec in ["none", "gzip", "snappy", "lz4", "zstd"]:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "compression.type": codec,
            "linger.ms": 5,
        }
    )
    delivered = []

    def report(err, msg):
        if err is not None:
            raise SystemExit(f"{codec}: delivery failed: {err}")
        delivered.append((msg.partition(), msg.offset()))

    for i in range(300):
        n = sum(len(v) for v in sent.values())
        partition = n % 3
        key = f"key-{n}".encode()
        value = None if n % 97 == 0 else f"{codec} value {n} ".encode() * (1 + n % 7)
        headers = [("codec", codec.encode()), ("n", str(n).encode()), ("dup", b"1"), ("dup", b"2")]
        ts = base_ts + n
        producer.produce(
            "orders", key=key, value=value, headers=headers, partition=partition,
            timestamp=ts, on_delivery=report,
        )
        sent[partition].append((key, value, headers, ts))
    left = producer.flush(30)
    assert left == 0, f"{codec}: {left} records not delivered"
    assert len(delivered) == 300, f"{codec}: {len(delivered)} delivery reports"
print("produce ok")

# Reading back: every partition, in order, exactly.
consumer = KafkaConsumer(
    bootstrap_servers=bootstrap,
    group_id=None,
    enable_auto_commit=False,
    auto_offset_reset="earliest",
    consumer_timeout_ms=5000,
)
partitions = [TopicPartition("orders", p) for p in range(3)]
consumer.assign(partitions)
consumer.seek_to_beginning(*partitions)
got = {0: [], 1: [], 2: []}
deadline = time.time() + 60
while sum(len(v) for v in got.values()) < 1500 and time.time() < deadline:
    for tp, records in consumer.poll(timeout_ms=1000).items():
        for r in records:
            got[tp.partition].append(r)
for p in range(3):
    assert len(got[p]) == len(sent[p]), f"partition {p}: {len(got[p])} of {len(sent[p])}"
    for offset, (record, (key, value, headers, ts)) in enumerate(zip(got[p], sent[p])):
        assert record.offset == offset, (p, record.offset, offset)
        assert record.key == key, (p, offset, record.key, key)
        assert record.value == value, (p, offset, record.value, value)
        assert [(k, v) for k, v in record.headers] == headers, (p, offset, record.headers)
        assert record.timestamp == ts, (p, offset, record.timestamp, ts)
print("fetch ok")

# Offsets: earliest, latest and by time.
begin = consumer.beginning_offsets(partitions)
end = consumer.end_offsets(partitions)
for tp in partitions:
    assert begin[tp] == 0, begin
    assert end[tp] == len(sent[tp.partition]), end
wanted = base_ts + 600
found = consumer.offsets_for_times({tp: wanted for tp in partitions})
for tp in partitions:
    expected = next(i for i, s in enumerate(sent[tp.partition]) if s[3] >= wanted)
    assert found[tp].offset == expected, (tp, found[tp], expected)
    assert found[tp].timestamp == sent[tp.partition][expected][3]
late = consumer.offsets_for_times({partitions[0]: base_ts + 10_000_000})
assert late[partitions[0]] is None, late
consumer.close()
print("offsets ok")

# Growing the topic adds partitions; shrinking it is refused.
from confluent_kafka.admin import NewPartitions

admin.create_partitions([NewPartitions("orders", 5)])["orders"].result(timeout=30)
assert sorted(admin.list_topics(timeout=10).topics["orders"].partitions) == [0, 1, 2, 3, 4]
try:
    admin.create_partitions([NewPartitions("orders", 2)])["orders"].result(timeout=30)
    raise SystemExit("shrinking a topic should have failed")
except Exception as e:
    assert "INVALID_PARTITIONS" in str(e), e
print("partitions ok")

# Configs: what admin tools show of a topic and a broker, and changing a topic's retention,
# incrementally (confluent-kafka) and whole (kafka-python's AlterConfigs).
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource
from kafka.admin import ConfigResource as PyConfigResource, ConfigResourceType, KafkaAdminClient


def topic_configs():
    resource = ConfigResource("topic", "orders")
    return {k: v.value for k, v in admin.describe_configs([resource])[resource].result(30).items()}


shown = topic_configs()
assert shown["retention.ms"] == "3600000", shown
assert shown["retention.bytes"] == "-1", shown
assert shown["cleanup.policy"] == "delete", shown
broker = ConfigResource("broker", str(next(iter(admin.list_topics(timeout=10).brokers))))
assert admin.describe_configs([broker])[broker].result(30)["auto.create.topics.enable"].value == "false"
change = ConfigResource(
    "topic",
    "orders",
    incremental_configs=[
        ConfigEntry("retention.bytes", "1048576000", incremental_operation=AlterConfigOpType.SET)
    ],
)
admin.incremental_alter_configs([change])[change].result(30)
shown = topic_configs()
assert (shown["retention.ms"], shown["retention.bytes"]) == ("3600000", "1048576000"), shown
refused = ConfigResource(
    "topic",
    "orders",
    incremental_configs=[
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)
    ],
)
try:
    admin.incremental_alter_configs([refused])[refused].result(30)
    raise SystemExit("changing cleanup.policy should have been refused")
except Exception as e:
    assert "INVALID_CONFIG" in str(e), e
# AlterConfigs replaces a topic's configs; kafka-python sends the other changed ones along
# (it reads them with DescribeConfigs first), so they stay.
py_admin = KafkaAdminClient(bootstrap_servers=bootstrap)
py_admin.alter_configs(
    [PyConfigResource(ConfigResourceType.TOPIC, "orders", configs={"retention.ms": "7200000"})],
    incremental=False,
)
shown = topic_configs()
assert (shown["retention.ms"], shown["retention.bytes"]) == ("7200000", "1048576000"), shown
py_admin.close()
print("configs ok")

# Deleting the topic deletes its partitions.
admin.delete_topics(["orders"], operation_timeout=10)["orders"].result(timeout=30)
assert "orders" not in admin.list_topics(timeout=10).topics
print("all checks passed")
