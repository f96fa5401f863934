"""gRPC server reflection, both versions: grpc.reflection.v1 and grpc.reflection.v1alpha.

grpcio-reflection (1.85) ships only v1alpha, while newer clients (grpcurl,
Postman, grpc-js tools) ask for v1 first. The two protocols are the same
messages with the same field numbers under another package
(grpc/reflection/v1/reflection.proto was copied from v1alpha), so v1 is served
here by the same servicer: its file descriptor is v1alpha's renamed (added to
the default descriptor pool, so a client can also reflect on v1 itself), and
its one method is a generic handler that reads and writes the bytes with the
v1alpha classes.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection as v1alpha
from grpc_reflection.v1alpha import reflection_pb2 as alpha_pb2
from grpc_reflection.v1alpha import reflection_pb2_grpc as alpha_grpc

V1ALPHA_SERVICE_NAME = v1alpha.SERVICE_NAME
V1_PACKAGE = "grpc.reflection.v1"
V1_FILE = "grpc/reflection/v1/reflection.proto"
V1_SERVICE_NAME = f"{V1_PACKAGE}.ServerReflection"
SERVICE_NAMES = (V1_SERVICE_NAME, V1ALPHA_SERVICE_NAME)


def _rename(type_name: str) -> str:
    old = "." + alpha_pb2.DESCRIPTOR.package + "."
    return (
        "." + V1_PACKAGE + "." + type_name[len(old) :] if type_name.startswith(old) else type_name
    )


def _v1_file() -> descriptor_pb2.FileDescriptorProto:
    """v1's file descriptor: v1alpha's under the v1 package and file name."""
    fdp = descriptor_pb2.FileDescriptorProto()
    alpha_pb2.DESCRIPTOR.CopyToProto(fdp)
    fdp.name = V1_FILE
    fdp.package = V1_PACKAGE
    fdp.ClearField("options")

    def fix(messages) -> None:
        for m in messages:
            for f in m.field:
                if f.type_name:
                    f.type_name = _rename(f.type_name)
            fix(m.nested_type)

    fix(fdp.message_type)
    for svc in fdp.service:
        for method in svc.method:
            method.input_type = _rename(method.input_type)
            method.output_type = _rename(method.output_type)
    return fdp


def _register_v1_descriptor() -> None:
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(V1_FILE)
    except KeyError:
        pool.AddSerializedFile(_v1_file().SerializeToString())


def enable(service_names: Iterable[str], server: grpc.aio.Server) -> None:
    """Serve reflection v1 and v1alpha on `server` for `service_names` (and themselves)."""
    _register_v1_descriptor()
    servicer = v1alpha.aio.ReflectionServicer([*service_names, *SERVICE_NAMES])
    alpha_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                V1_SERVICE_NAME,
                {
                    "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
                        servicer.ServerReflectionInfo,
                        request_deserializer=alpha_pb2.ServerReflectionRequest.FromString,
                        response_serializer=alpha_pb2.ServerReflectionResponse.SerializeToString,
                    )
                },
            ),
        )
    )
