"""A generic gRPC client (Python grpcio) that knows nothing of Nova's .proto: it discovers the
API through server reflection, checks health, and appends and reads a record.

Usage: generic_client.py HOST:PORT STREAM
With NOVA_TEST_CA set (a PEM file), it speaks TLS and verifies the server against that CA; with
NOVA_TEST_TOKEN set, it sends the token as a bearer token with every call.
Prints one line per check; exits non-zero on the first failure.
"""

import os
import sys

import grpc
from google.protobuf import descriptor_pool, message_factory
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)


def main():
    target, stream = sys.argv[1], sys.argv[2]
    ca = os.environ.get("NOVA_TEST_CA")
    if ca:
        with open(ca, "rb") as pem:
            credentials = grpc.ssl_channel_credentials(root_certificates=pem.read())
        channel = grpc.secure_channel(target, credentials)
        print("speaking TLS")
    else:
        channel = grpc.insecure_channel(target)
    token = os.environ.get("NOVA_TEST_TOKEN")
    metadata = [("authorization", f"Bearer {token}")] if token else None
    database = ProtoReflectionDescriptorDatabase(channel)
    services = set(database.get_services())
    for wanted in ("nova.v1.Nova", "grpc.health.v1.Health"):
        assert wanted in services, f"{wanted} not offered by reflection: {services}"
    print("reflection lists", ", ".join(sorted(services)))

    pool = descriptor_pool.DescriptorPool(database)

    def message(name):
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))

    check = channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=message("grpc.health.v1.HealthCheckResponse").FromString,
    )
    health = check(message("grpc.health.v1.HealthCheckRequest")(service="nova.v1.Nova"))
    assert health.status == 1, f"not SERVING: {health}"
    print("health SERVING")

    def unary(method, request_type, response_type):
        return channel.unary_unary(
            f"/nova.v1.Nova/{method}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=message(response_type).FromString,
        )

    create = unary("CreateStream", "nova.v1.CreateStreamRequest", "nova.v1.CreateStreamResponse")
    create(message("nova.v1.CreateStreamRequest")(stream=stream), metadata=metadata)
    print("created", stream)

    append = channel.stream_stream(
        "/nova.v1.Nova/Append",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=message("nova.v1.AppendAck").FromString,
    )
    Record = message("nova.v1.Record")
    request = message("nova.v1.AppendRequest")(
        stream=stream, records=[Record(body=b"from python"), Record(body=b"second")]
    )
    acks = list(append(iter([request]), metadata=metadata))
    assert len(acks) == 1 and acks[0].end_seq == 2, f"unexpected acks {acks}"
    print("appended", acks[0].start_seq, acks[0].end_seq)

    read = unary("Read", "nova.v1.ReadRequest", "nova.v1.ReadResponse")
    page = read(message("nova.v1.ReadRequest")(stream=stream, start_seq=0), metadata=metadata)
    bodies = [r.body for r in page.records]
    assert bodies == [b"from python", b"second"], bodies
    print("read back", len(bodies), "records")


if __name__ == "__main__":
    main()
