"""Prints what one broker's Metadata answer says of a topic, one line per partition:
"PARTITION HOST:PORT" naming the partition's leader (or "PARTITION -" with none), then
"coordinator GROUP HOST:PORT" as FindCoordinator answers for the group.

  kafka_metadata.py BOOTSTRAP TOPIC GROUP"""

import sys

from confluent_kafka.admin import AdminClient

bootstrap, topic, group = sys.argv[1], sys.argv[2], sys.argv[3]
admin = AdminClient({"bootstrap.servers": bootstrap})
metadata = admin.list_topics(topic, timeout=30)
brokers = {b.id: f"{b.host}:{b.port}" for b in metadata.brokers.values()}
found = metadata.topics[topic]
if found.error is not None:
    raise SystemExit(f"metadata of {topic}: {found.error}")
for partition in sorted(found.partitions.values(), key=lambda p: p.id):
    print(partition.id, brokers.get(partition.leader, "-"), flush=True)
described = admin.describe_consumer_groups([group])[group].result(30)
coordinator = described.coordinator
print("coordinator", group, f"{coordinator.host}:{coordinator.port}", flush=True)
