"""An idempotent confluent-kafka producer writes records 0..N-1 to partition 0 of a topic and
keeps going while its star is killed and restarted. Prints "delivered K" as delivery reports
come in (the test kills the star at set points) and, at the end, writes one line per record
the client reported delivered ("i offset") to the file named by its third argument."""

import sys
import time

from confluent_kafka import Producer

bootstrap, topic, out_path, total = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

producer = Producer(
    {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "batch.num.messages": 2000,
        "message.timeout.ms": 180000,
        "retry.backoff.ms": 100,
        "reconnect.backoff.max.ms": 500,
        "queue.buffering.max.messages": 200000,
    }
)
delivered = []
failed = 0
next_report = 1000


def report(err, msg):
    global failed
    if err is not None:
        failed += 1
        return
    delivered.append((int(msg.value().split(b" ")[1]), msg.offset()))


for i in range(total):
    while True:
        try:
            producer.produce(topic, value=f"record {i} {'p' * (i % 50)}".encode(), partition=0, on_delivery=report)
            break
        except BufferError:
            producer.poll(0.05)
    producer.poll(0)
    if len(delivered) >= next_report:
        print(f"delivered {len(delivered)}", flush=True)
        next_report += 1000

deadline = time.time() + 240
while len(producer) > 0 and time.time() < deadline:
    producer.poll(0.2)
    if len(delivered) >= next_report:
        print(f"delivered {len(delivered)}", flush=True)
        next_report += 1000
left = producer.flush(10)
with open(out_path, "w") as out:
    for i, offset in delivered:
        out.write(f"{i} {offset}\n")
print(f"done delivered={len(delivered)} failed={failed} left={left}", flush=True)
