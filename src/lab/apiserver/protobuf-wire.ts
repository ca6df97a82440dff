// Protocol buffers' wire format, read side: the fields of one message as (number, wire type, value).
// Used to read kube-apiserver's protobuf bodies (protobuf-codec.ts) and, at development time, the
// descriptors of Kubernetes' generated.proto files (scripts/generate-protobuf-messages.ts).

export interface WireField {
  number: number;
  /** 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32. */
  wireType: number;
  /** Varints as bigint (int64 needs all 64 bits); length-delimited fields as their bytes. */
  value: bigint | Buffer;
}

export class ProtobufError extends Error {}

function readVarint(buf: Buffer, at: number): [bigint, number] {
  let result = 0n;
  let shift = 0n;
  for (let i = at; i < buf.length && shift < 70n; i++) {
    const byte = buf[i];
    result |= BigInt(byte & 0x7f) << shift;
    if ((byte & 0x80) === 0) return [BigInt.asUintN(64, result), i + 1];
    shift += 7n;
  }
  throw new ProtobufError('truncated varint');
}

/** The `size` bytes of a fixed32 or fixed64 value at `at`, and where the next field starts. */
function readFixed(buf: Buffer, at: number, size: 4 | 8): [Buffer, number] {
  if (at + size > buf.length) throw new ProtobufError(`truncated fixed${size * 8}`);
  return [buf.subarray(at, at + size), at + size];
}

/** The value of field `number` of wire type `wireType` at `at`, and where the next field starts. */
function readValue(buf: Buffer, at: number, number: number, wireType: number): [bigint | Buffer, number] {
  switch (wireType) {
    case 0:
      return readVarint(buf, at);
    case 1:
      return readFixed(buf, at, 8);
    case 2: {
      const [length, after] = readVarint(buf, at);
      const end = after + Number(length);
      if (end > buf.length) throw new ProtobufError(`field ${number}: length ${length} runs past the message`);
      return [buf.subarray(after, end), end];
    }
    case 5:
      return readFixed(buf, at, 4);
    default:
      throw new ProtobufError(`field ${number}: wire type ${wireType} is not supported`);
  }
}

/** Every field of a message, in wire order (repeated fields appear once per element). */
export function readFields(buf: Buffer): WireField[] {
  const fields: WireField[] = [];
  let at = 0;
  while (at < buf.length) {
    const [key, afterKey] = readVarint(buf, at);
    const number = Number(key >> 3n);
    const wireType = Number(key & 7n);
    if (number === 0) throw new ProtobufError('field number 0');
    const [value, next] = readValue(buf, afterKey, number, wireType);
    fields.push({number, wireType, value});
    at = next;
  }
  return fields;
}

/** Varints of packed repeated scalars (proto3 style; Kubernetes' proto2 files send them unpacked, both are read). */
export function readPackedVarints(buf: Buffer): bigint[] {
  const out: bigint[] = [];
  let at = 0;
  while (at < buf.length) {
    const [value, next] = readVarint(buf, at);
    out.push(value);
    at = next;
  }
  return out;
}
