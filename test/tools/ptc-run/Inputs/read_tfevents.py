"""An independent reader of TensorBoard event files (TFRecord framing with
masked CRC-32C, Event / Summary protocol buffers), written from the formats'
specifications, not from ptc's writer. Prints one line per scalar:
"STEP TAG VALUE", and fails on a bad CRC, a truncated record or a first
record that is not the file_version event.

  read_tfevents.py FILE"""
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def fields(buf):
    """(field number, wire type, value) of a protocol buffer message."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(buf, i)
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        elif wire == 2:
            n, i = varint(buf, i)
            value, i = buf[i:i + n], i + n
        else:
            raise ValueError(f"wire type {wire}")
        yield number, wire, value


def records(path):
    data = open(path, "rb").read()
    i = 0
    while i < len(data):
        if i + 12 > len(data):
            raise ValueError(f"truncated record header at byte {i}")
        header = data[i:i + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[i + 8:i + 12])
        if length_crc != masked(header):
            raise ValueError(f"bad length CRC at byte {i}")
        body = data[i + 12:i + 12 + length]
        if len(body) != length or i + 16 + length > len(data):
            raise ValueError(f"truncated record at byte {i}")
        (body_crc,) = struct.unpack("<I", data[i + 12 + length:i + 16 + length])
        if body_crc != masked(body):
            raise ValueError(f"bad data CRC at byte {i}")
        yield body
        i += 16 + length


def main():
    events = list(records(sys.argv[1]))
    first = {n: v for n, _, v in fields(events[0])}
    if first.get(3) != b"brain.Event:2":
        raise ValueError("the first event is not file_version brain.Event:2")
    for event in events[1:]:
        step = 0
        for number, _, value in fields(event):
            if number == 2:
                step = value
            elif number == 5:
                for vn, _, v in fields(value):
                    if vn != 1:
                        continue
                    parts = {n: x for n, _, x in fields(v)}
                    tag = parts[1].decode()
                    (simple,) = struct.unpack("<f", parts[2])
                    print(step, tag, repr(simple))


if __name__ == "__main__":
    main()
