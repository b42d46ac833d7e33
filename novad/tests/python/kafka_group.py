"""Three kafka-python consumers in one group share a six-partition topic; one leaves and the
other two take its partitions over; every record is consumed. Run twice by
novad/tests/kafka.rs around a restart of the star:

  kafka_group.py BOOTSTRAP first   creates the topic, produces 600 records, consumes them all
                                   with three consumers (one leaving half-way), committing
  kafka_group.py BOOTSTRAP second  produces 300 more; two new consumers of the same group go on
                                   from the committed offsets and get exactly those 300

Prints "phase passed" when its checks hold."""

import sys
import threading
import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer

bootstrap, phase = sys.argv[1], sys.argv[2]
TOPIC, GROUP = "shared", "g"


def produce(first, count):
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(first, first + count):
        producer.produce(TOPIC, key=f"k{i}".encode(), value=f"r{i}".encode(), partition=i % 6)
    assert producer.flush(30) == 0


class Member(threading.Thread):
    def __init__(self, name, seen, stop):
        super().__init__(daemon=True)
        self.name, self.seen, self.stop = name, seen, stop
        self.assigned = set()
        self.leave = threading.Event()
        self.error = None

    def run(self):
        try:
            consumer = KafkaConsumer(
                TOPIC,
                bootstrap_servers=bootstrap,
                group_id=GROUP,
                client_id=self.name,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                session_timeout_ms=10000,
                heartbeat_interval_ms=500,
                max_poll_records=20,
            )
            while not self.stop.is_set() and not self.leave.is_set():
                batches = consumer.poll(timeout_ms=200)
                self.assigned = {tp.partition for tp in consumer.assignment()}
                for tp, records in batches.items():
                    for r in records:
                        self.seen.append((self.name, r.partition, r.offset, r.value.decode()))
                if batches:
                    consumer.commit()
            consumer.close()  # LeaveGroup
        except Exception as e:  # reported by the main thread
            self.error = e


def wait_for(what, check, seconds=60):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {what}")


def consume(names, expected, leave_after=None):
    seen, stop = [], threading.Event()
    members = [Member(n, seen, stop) for n in names]
    for m in members:
        m.start()
    wait_for(
        "every partition assigned once",
        lambda: sorted(p for m in members for p in m.assigned) == list(range(6)),
    )
    print("assigned", {m.name: sorted(m.assigned) for m in members}, flush=True)
    if leave_after is not None:
        wait_for("some records consumed", lambda: len(seen) >= leave_after)
        leaving = members[-1]
        leaving.leave.set()
        leaving.join(30)
        rest = members[:-1]
        wait_for(
            "the leaver's partitions taken over",
            lambda: sorted(p for m in rest for p in m.assigned) == list(range(6)),
        )
        print("after leave", {m.name: sorted(m.assigned) for m in rest}, flush=True)
    wait_for("every record consumed", lambda: {v for (_, _, _, v) in seen} >= expected, 120)
    time.sleep(1)  # the last commits
    stop.set()
    for m in members:
        m.join(30)
        if m.error:
            raise SystemExit(f"{m.name} failed: {m.error!r}")
    return seen


if phase == "first":
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, num_partitions=6, replication_factor=1)])[TOPIC].result(30)
    produce(0, 600)
    seen = consume(["c1", "c2", "c3"], {f"r{i}" for i in range(600)}, leave_after=150)
    print(f"consumed {len(seen)} (600 distinct)", flush=True)
elif phase == "second":
    produce(600, 300)
    seen = consume(["c4", "c5"], {f"r{i}" for i in range(600, 900)})
    old = [v for (_, _, _, v) in seen if int(v[1:]) < 600]
    assert not old, f"records consumed again after the restart: {old[:10]}"
    print(f"consumed {len(seen)} new records from the committed offsets", flush=True)
print("phase passed", flush=True)
