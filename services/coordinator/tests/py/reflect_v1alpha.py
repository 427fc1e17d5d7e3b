"""Lists and describes a gRPC server's services through reflection v1alpha
only (grpcio-reflection's client, as older grpcurl and Python tools do).

    python reflect_v1alpha.py ADDR [TOKEN]

Prints one JSON object: the services, and each drove service's methods with
their input and output types; or {"error": CODE, "details": ...}.
"""

import json
import sys

import grpc
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase


class Bearer(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def __init__(self, token):
        self.metadata = [("authorization", f"Bearer {token}")]

    def _details(self, details):
        return details._replace(metadata=list(details.metadata or []) + self.metadata)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._details(details), requests)


def main():
    addr = sys.argv[1]
    channel = grpc.insecure_channel(addr)
    if len(sys.argv) > 2:
        channel = grpc.intercept_channel(channel, Bearer(sys.argv[2]))
    db = ProtoReflectionDescriptorDatabase(channel)
    try:
        services = sorted(db.get_services())
        pool = DescriptorPool(db)
        described = {}
        for name in services:
            if name.startswith("drove."):
                service = pool.FindServiceByName(name)
                described[name] = {m.name: [m.input_type.full_name, m.output_type.full_name] for m in service.methods}
        print(json.dumps({"services": services, "described": described}))
    except grpc.RpcError as e:
        print(json.dumps({"error": e.code().name, "details": e.details()}))


if __name__ == "__main__":
    main()
