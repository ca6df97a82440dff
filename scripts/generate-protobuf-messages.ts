// Writes src/lab/apiserver/protobuf-messages.ts: the field numbers and types of the protobuf messages
// of every kind the lab's API server serves (resources.ts, plus `extraKinds`), and of every message they
// contain. The facts come from Kubernetes' generated.proto files, whose descriptors client-go registers:
// the current kubectl (scripts/current-kubectl.ts) carries them gzipped, one per API group version.
// Run it again after adding a resource: node scripts/generate-protobuf-messages.ts
import {readFileSync, writeFileSync} from 'node:fs';
import {fileURLToPath} from 'node:url';
import {gunzipSync} from 'node:zlib';
import {protobufMessageName} from '../src/lab/apiserver/protobuf-codec.ts';
import {readFields} from '../src/lab/apiserver/protobuf-wire.ts';
import {resourceTypes} from '../src/lab/apiserver/resources.ts';
import {currentKubectl} from './current-kubectl.ts';

/** Kinds clients send in protobuf that the lab answers without storing them as a resource of their own. */
const extraKinds: Array<[group: string, version: string, kind: string]> = [
  ['apps', 'v1', 'Deployment'],
  ['apps', 'v1', 'ReplicaSet'],
  ['', 'v1', 'Binding'],
];

// google.protobuf.FieldDescriptorProto.Type
const scalarTypes: Record<number, string> = {
  1: 'double',
  2: 'float',
  3: 'int64',
  4: 'uint64',
  5: 'int32',
  8: 'bool',
  9: 'string',
  12: 'bytes',
  13: 'uint32',
};

interface Field {
  name: string;
  number: number;
  repeated: boolean;
  type: string;
}

const text = (value: unknown) => (value as Buffer).toString('utf8');

/** FileDescriptorProto (package 2, message_type 4) -> messages by full name; map entries as their own messages. */
function readFile(descriptor: Buffer, messages: Map<string, {fields: Field[]; mapEntry: boolean}>): void {
  const file = readFields(descriptor);
  const pkg = text(file.find((f) => f.number === 2)!.value);
  const readMessage = (body: Buffer, prefix: string) => {
    const parts = readFields(body);
    const name = `${prefix}.${text(parts.find((p) => p.number === 1)!.value)}`;
    const options = parts.find((p) => p.number === 7);
    const mapEntry = options ? readFields(options.value as Buffer).some((o) => o.number === 7 && o.value === 1n) : false;
    const fields: Field[] = [];
    for (const part of parts) {
      if (part.number === 3) readMessage(part.value as Buffer, name);
      if (part.number !== 2) continue;
      const f = readFields(part.value as Buffer);
      const get = (n: number) => f.find((x) => x.number === n)?.value;
      const type = Number(get(5));
      fields.push({
        name: text(get(1)),
        number: Number(get(3)),
        repeated: Number(get(4)) === 3,
        type: type === 11 ? text(get(6)).replace(/^\./, '') : (scalarTypes[type] ?? `unsupported-${type}`),
      });
    }
    messages.set(name, {fields, mapEntry});
  };
  for (const part of file) if (part.number === 4) readMessage(part.value as Buffer, pkg);
}

function descriptors(binary: Buffer): Map<string, {fields: Field[]; mapEntry: boolean}> {
  const messages = new Map<string, {fields: Field[]; mapEntry: boolean}>();
  const magic = Buffer.from([0x1f, 0x8b, 0x08]);
  for (let at = binary.indexOf(magic); at >= 0; at = binary.indexOf(magic, at + 1)) {
    let out: Buffer;
    try {
      out = gunzipSync(binary.subarray(at, at + 1_000_000), {finishFlush: 2});
    } catch {
      continue;
    }
    if (!/^\n[\s\S]k8s\.io\/[\w/.-]+\/generated\.proto/.test(out.toString('latin1', 0, 80))) continue;
    readFile(out, messages);
  }
  return messages;
}

// Entries are laid out as the formatter (biome.json's lineWidth) would, and long field lists split,
// so that the generated file passes the format check and its lines fit a side-by-side diff.
const lineWidth = 140;
const pieceWidth = 100;

/** A message's field list cut at field boundaries into pieces of about `width` characters that concatenate back to it. */
function fieldPieces(fields: string, width: number): string[] {
  const pieces: string[] = [];
  let piece = '';
  for (const field of fields.split(' ')) {
    if (piece !== '' && piece.length + field.length > width) {
      pieces.push(piece);
      piece = '';
    }
    piece += `${field} `;
  }
  return [...pieces, piece.slice(0, -1)];
}

/** A message as its entry of the table: on one line when it fits, else its field list on the next, in concatenated pieces when long. */
function messageLine(name: string, fields: string): string {
  const oneLine = `  '${name}': '${fields}',`;
  if (oneLine.length <= lineWidth) return oneLine;
  if (!needsPieces(fields)) return `  '${name}':\n    '${fields}',`;
  return `  '${name}':\n    ${piecesText(fields, '    ')},`;
}

/** Whether a field list is too long for a line of its own, and so is written in pieces. */
function needsPieces(fields: string): boolean {
  return `    '${fields}',`.length > lineWidth;
}

/** A long field list as concatenated string literals, one a line, each line after the first indented by `indent`. */
function piecesText(fields: string, indent: string): string {
  return fieldPieces(fields, pieceWidth)
    .map((piece) => `'${piece}'`)
    .join(` +\n${indent}`);
}

/**
 * Long field lists that several messages have (Container and EphemeralContainerCommon, say), each
 * to be written once as a constant named after its first message.
 */
function sharedFieldLists(messages: Array<[string, string]>): Map<string, {name: string; messages: string[]; fields: string}> {
  const byFields = new Map<string, string[]>();
  for (const [name, fields] of messages) {
    if (!needsPieces(fields)) continue;
    byFields.set(fields, [...(byFields.get(fields) ?? []), name]);
  }
  const shared = new Map<string, {name: string; messages: string[]; fields: string}>();
  for (const [fields, names] of byFields) {
    if (names.length < 2) continue;
    const kind = names[0].slice(names[0].lastIndexOf('.') + 1);
    shared.set(fields, {name: `${kind[0].toLowerCase()}${kind.slice(1)}Fields`, messages: names, fields});
  }
  return shared;
}

/** One entry per message: `name=number[:type][*]`, type string by default, `*` for repeated, `map:TYPE` for maps. */
function render(messages: Map<string, {fields: Field[]; mapEntry: boolean}>, roots: string[]): string {
  const wanted = new Map<string, string>();
  const fieldText = (f: Field): string => {
    const entry = messages.get(f.type);
    if (entry?.mapEntry) {
      const value = entry.fields.find((x) => x.number === 2)!;
      visit(value.type);
      return `${f.name}=${f.number}:map:${value.type}`;
    }
    visit(f.type);
    return `${f.name}=${f.number}${f.type === 'string' ? '' : `:${f.type}`}${f.repeated ? '*' : ''}`;
  };
  const visit = (name: string) => {
    const message = messages.get(name);
    if (!message || wanted.has(name)) return;
    wanted.set(name, '');
    wanted.set(name, message.fields.map(fieldText).join(' '));
  };
  for (const root of roots) {
    if (!messages.has(root)) throw new Error(`kubectl's descriptors have no message ${root}`);
    visit(root);
  }
  const sorted = [...wanted].sort(([a], [b]) => a.localeCompare(b));
  const shared = sharedFieldLists(sorted);
  const lines = sorted.map(([name, fields]) => {
    const constant = shared.get(fields);
    return constant ? `  '${name}': ${constant.name},` : messageLine(name, fields);
  });
  const constants = [...shared.values()].map(
    ({name, messages, fields}) => `// The fields of ${messages.join(' and ')}.\nconst ${name} =\n  ${piecesText(fields, '  ')};\n`,
  );
  return `// Generated by scripts/generate-protobuf-messages.ts from the descriptors of Kubernetes' generated.proto
// files: the fields of the messages of the lab's kinds, as \`name=number[:type][*]\` (type string unless
// given, \`*\` repeated, \`map:TYPE\` a map from string). Do not edit; run the script again.
${constants.map((constant) => `\n${constant}`).join('')}${constants.length > 0 ? '\n' : ''}export const protobufMessages: Record<string, string> = {
${lines.join('\n')}
};
`;
}

const roots = [
  ...resourceTypes.map((t) => protobufMessageName(t.group, t.version, t.kind)),
  ...extraKinds.map(([group, version, kind]) => protobufMessageName(group, version, kind)),
  'k8s.io.apimachinery.pkg.apis.meta.v1.DeleteOptions',
];
const out = fileURLToPath(new URL('../src/lab/apiserver/protobuf-messages.ts', import.meta.url));
writeFileSync(out, render(descriptors(readFileSync(currentKubectl())), [...new Set(roots)]));
console.log(out);
