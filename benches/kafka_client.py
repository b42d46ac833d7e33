"""librdkafka (confluent-kafka) as benches/kafka.sh drives it: `produce` writes BYTES of
RECORD-byte records to PARTITIONS partitions of TOPIC as fast as the star acknowledges them;
`consume` reads every partition from the start to its end. Prints one JSON line: records,
bytes and seconds."""

import json
import sys
import time

from confluent_kafka import Consumer, Producer, TopicPartition

mode, bootstrap, topic, partitions = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

if mode == "produce":
    total, size = int(sys.argv[5]), int(sys.argv[6])
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "queue.buffering.max.kbytes": 256 * 1024,
            "compression.type": "none",
        }
    )
    value = b"x" * size
    started, sent, n = time.time(), 0, 0
    while sent < total:
        try:
            producer.produce(topic, value=value, partition=n % partitions)
            sent += size
            n += 1
        except BufferError:
            producer.poll(0.01)
        producer.poll(0)
    producer.flush(120)
    print(json.dumps({"records": n, "bytes": sent, "seconds": time.time() - started}))
elif mode == "consume":
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench",
            "enable.auto.commit": False,
            # Pages of the star's --max-read-bytes (8 MiB), as `nova read` asks for, so both
            # paths read the same pages: with librdkafka's default of 1 MiB a partition, each
            # MiB costs a page's fixed share eight times over.
            "max.partition.fetch.bytes": 8 << 20,
            "fetch.max.bytes": 64 << 20,
        }
    )
    _, ends = zip(*[consumer.get_watermark_offsets(TopicPartition(topic, p)) for p in range(partitions)])
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got, records, started = 0, 0, time.time()
    left = dict(enumerate(ends))
    while any(left.values()):
        msg = consumer.poll(1.0)
        if msg is None or msg.error():
            continue
        got += len(msg.value())
        records += 1
        if msg.offset() + 1 >= ends[msg.partition()]:
            left[msg.partition()] = 0
    print(json.dumps({"records": records, "bytes": got, "seconds": time.time() - started}))
