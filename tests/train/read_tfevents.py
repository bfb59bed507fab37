#!/usr/bin/python3
"""Decodes a TensorBoard event file without any of Tessera's code.

The TFRecord framing is parsed here and both CRCs of every record checked
with this file's own CRC-32C; the Event protos are decoded by
google.protobuf, from message classes built at run time out of a descriptor
of the fields TensorFlow's event.proto and summary.proto give them (so no
protoc step). Prints one line per record:

  version <file_version> <step>
  scalar <step> <wall_time> <value> <tag>

tab-separated, values with enough digits to read back exactly. Exits 1
naming the record on a bad length, CRC or proto; 77 when google.protobuf is
missing (Debian: python3-protobuf).

Usage: read_tfevents.py EVENT_FILE
"""

import struct
import sys

try:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
except ImportError:
    sys.stderr.write("read_tfevents.py: google.protobuf missing (apt-get install python3-protobuf)\n")
    sys.exit(77)


def _crc32c_table():
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data):
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _event_class():
    F = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="tessera_test/event.proto", package="tensorflow",
                                               syntax="proto3")
    summary = proto.message_type.add(name="Summary")
    value = summary.nested_type.add(name="Value")
    value.field.add(name="tag", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    value.field.add(name="simple_value", number=2, type=F.TYPE_FLOAT, label=F.LABEL_OPTIONAL)
    summary.field.add(name="value", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                      type_name=".tensorflow.Summary.Value")
    event = proto.message_type.add(name="Event")
    event.field.add(name="wall_time", number=1, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
    event.field.add(name="step", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    event.field.add(name="file_version", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    event.field.add(name="summary", number=5, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                    type_name=".tensorflow.Summary")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    descriptor = pool.FindMessageTypeByName("tensorflow.Event")
    if hasattr(message_factory, "GetMessageClass"):  # protobuf >= 4.22
        return message_factory.GetMessageClass(descriptor)
    return message_factory.MessageFactory(pool).GetPrototype(descriptor)


def main(path):
    Event = _event_class()
    with open(path, "rb") as f:
        data = f.read()
    offset, index = 0, 0
    while offset < len(data):
        where = f"record {index} at byte {offset}"
        if len(data) - offset < 12:
            raise SystemExit(f"{where}: truncated header")
        header = data[offset:offset + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[offset + 8:offset + 12])
        if header_crc != masked_crc32c(header):
            raise SystemExit(f"{where}: length CRC {header_crc:#010x} != {masked_crc32c(header):#010x}")
        body_start = offset + 12
        if len(data) - body_start < length + 4:
            raise SystemExit(f"{where}: truncated data ({length} bytes announced)")
        body = data[body_start:body_start + length]
        (body_crc,) = struct.unpack("<I", data[body_start + length:body_start + length + 4])
        if body_crc != masked_crc32c(body):
            raise SystemExit(f"{where}: data CRC {body_crc:#010x} != {masked_crc32c(body):#010x}")
        event = Event()
        event.ParseFromString(body)
        if event.file_version:
            print(f"version\t{event.file_version}\t{event.step}")
        for value in event.summary.value:
            print(f"scalar\t{event.step}\t{event.wall_time!r}\t{value.simple_value!r}\t{value.tag}")
        offset = body_start + length + 4
        index += 1


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(sys.argv[1])
