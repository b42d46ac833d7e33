"""A confluent-kafka producer authenticated with a token writes one record, says "ready", and
waits for a line on stdin (the test revokes the token meanwhile); then it tries another on
the same producer and says whether it was delivered."""

import sys

from confluent_kafka import Producer

bootstrap, token = sys.argv[1], sys.argv[2]
producer = Producer(
    {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "PLAIN",
        "sasl.username": "anyone",
        "sasl.password": token,
        "message.timeout.ms": 5000,
    }
)
outcomes = []
producer.produce("logs", value=b"before", partition=0, on_delivery=lambda e, m: outcomes.append(e))
producer.flush(10)
assert len(outcomes) == 1 and outcomes[0] is None, "the first record was not delivered"
print("ready", flush=True)
sys.stdin.readline()
producer.produce("logs", value=b"after", partition=0, on_delivery=lambda e, m: outcomes.append(e))
producer.flush(15)
later = outcomes[1:]
# (KafkaError does not compare with None: test identity.)
delivered = len(later) == 1 and later[0] is None
print("after:", "delivered" if delivered else f"failed ({len(later)} reports)", flush=True)
