"""A confluent-kafka consumer in group "lag" consumes and commits the 100 records of a topic's
partition 0, pauses (it stays in the group, heartbeating, fetching nothing), and 40 more records
are produced. Prints "produced" then, and stays in the group until its standard input closes.

  kafka_lag.py BOOTSTRAP TOPIC"""

import sys
import threading

from confluent_kafka import Consumer, Producer, TopicPartition

bootstrap, topic = sys.argv[1], sys.argv[2]
consumer = Consumer(
    {
        "bootstrap.servers": bootstrap,
        "group.id": "lag",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    }
)
consumer.subscribe([topic])
seen = 0
while seen < 100:
    message = consumer.poll(1.0)
    if message is not None and message.error() is None:
        seen += 1
consumer.commit(asynchronous=False)
consumer.pause([TopicPartition(topic, 0)])
producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
for i in range(40):
    producer.produce(topic, value=f"more {i}".encode(), partition=0)
assert producer.flush(30) == 0
print("produced", flush=True)
closed = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), closed.set()), daemon=True).start()
while not closed.is_set():
    consumer.poll(0.2)
consumer.close()
