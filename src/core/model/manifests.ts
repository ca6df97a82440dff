// Manifest text (multi-document YAML, or JSON: one object, a v1 List or a typed *List) -> the
// Kubernetes objects it holds, sorted into the kinds the model reads.
import {parseAllDocuments} from 'yaml';
import {errorText} from '../error-text.ts';

/** ManifestProblem is a document (or List item) that could not be read, and why. */
export interface ManifestProblem {
  /** The file name (or other source label) the text came from. */
  source: string;
  /** 1-based index of the YAML document; 1 for JSON. */
  document: number;
  /** JSON path inside the document for List items, e.g. "items[2]"; absent for the document itself. */
  path?: string;
  /** Full sentence naming source, document and cause. */
  message: string;
}

export interface ParsedManifests {
  /** Every object found, in document order, List items spread out; other kinds included. */
  objects: unknown[];
  services: unknown[];
  endpointSlices: unknown[];
  nodes: unknown[];
  problems: ManifestProblem[];
}

/** The apiVersion each kind the model reads must have. */
const modelKinds: Record<string, {apiVersion: string; bucket: 'services' | 'endpointSlices' | 'nodes'}> = {
  Service: {apiVersion: 'v1', bucket: 'services'},
  EndpointSlice: {apiVersion: 'discovery.k8s.io/v1', bucket: 'endpointSlices'},
  Node: {apiVersion: 'v1', bucket: 'nodes'},
};

const maxListDepth = 4;

/**
 * parseManifests reads YAML or JSON text. It never throws: unreadable documents, objects
 * without a kind and model kinds of an unsupported apiVersion are reported in problems and the
 * rest is returned.
 */
export function parseManifests(text: string, source: string): ParsedManifests {
  const result: ParsedManifests = {objects: [], services: [], endpointSlices: [], nodes: [], problems: []};
  if (typeof text !== 'string') {
    result.problems.push({source, document: 1, message: `${source}: not text`});
    return result;
  }
  const documents = readDocuments(text, source, result.problems);
  for (const {index, value} of documents) {
    if (value === null || value === undefined) continue; // empty document, e.g. a trailing "---"
    collectObject(value, {source, document: index, path: undefined, depth: 0}, result);
  }
  return result;
}

interface Location {
  source: string;
  document: number;
  path: string | undefined;
  depth: number;
  /** apiVersion and kind of the items of a typed List (ServiceList items carry neither). */
  inherited?: {apiVersion: string; kind: string};
}

function readDocuments(text: string, source: string, problems: ManifestProblem[]): Array<{index: number; value: unknown}> {
  const trimmed = text.trimStart();
  if (trimmed.startsWith('{') || trimmed.startsWith('[')) {
    try {
      return [{index: 1, value: JSON.parse(text)}];
    } catch (jsonError) {
      // Flow-style YAML also starts with a brace; only report JSON's complaint if YAML fails too.
      const yaml = readYamlDocuments(text, source);
      if (yaml.problems.length === 0) return yaml.documents;
      problems.push({source, document: 1, message: `${source} document 1: invalid JSON: ${firstLine(jsonError)}`});
      return [];
    }
  }
  const yaml = readYamlDocuments(text, source);
  problems.push(...yaml.problems);
  return yaml.documents;
}

function readYamlDocuments(text: string, source: string): {documents: Array<{index: number; value: unknown}>; problems: ManifestProblem[]} {
  const documents: Array<{index: number; value: unknown}> = [];
  const problems: ManifestProblem[] = [];
  let parsed;
  try {
    parsed = parseAllDocuments(text, {prettyErrors: true});
  } catch (error) {
    problems.push({source, document: 1, message: `${source} document 1: invalid YAML: ${firstLine(error)}`});
    return {documents, problems};
  }
  for (const [position, document] of (Array.isArray(parsed) ? parsed : []).entries()) {
    const index = position + 1;
    if (document.errors.length > 0) {
      problems.push({source, document: index, message: `${source} document ${index}: invalid YAML: ${firstLine(document.errors[0])}`});
      continue;
    }
    try {
      // The alias limit stops "billion laughs" documents from expanding without bound.
      documents.push({index, value: document.toJS({maxAliasCount: 100})});
    } catch (error) {
      problems.push({source, document: index, message: `${source} document ${index}: unreadable YAML: ${firstLine(error)}`});
    }
  }
  return {documents, problems};
}

function collectObject(value: unknown, location: Location, result: ParsedManifests): void {
  const where = `${location.source} document ${location.document}${location.path ? ` ${location.path}` : ''}`;
  const report = (cause: string) => {
    const problem: ManifestProblem = {source: location.source, document: location.document, message: `${where}: ${cause}`};
    if (location.path) problem.path = location.path;
    result.problems.push(problem);
  };
  if (Array.isArray(value)) {
    collectItems(value, location, undefined, result);
    return;
  }
  if (typeof value !== 'object' || value === null) {
    report(`${describeValue(value)} is not a Kubernetes object`);
    return;
  }
  const object = value as Record<string, unknown>;
  const kind = object.kind ?? location.inherited?.kind;
  const apiVersion = object.apiVersion ?? location.inherited?.apiVersion;
  if (typeof kind !== 'string' || kind === '') {
    report('object has no kind');
    return;
  }
  if (typeof apiVersion !== 'string' || apiVersion === '') {
    report(`${kind} has no apiVersion`);
    return;
  }
  const isList = kind === 'List' || (kind.endsWith('List') && 'items' in object);
  if (isList) {
    if (!Array.isArray(object.items)) {
      report(`${kind} has no items list`);
      return;
    }
    const itemKind = kind === 'List' ? undefined : {apiVersion, kind: kind.slice(0, -'List'.length)};
    collectItems(object.items, location, itemKind, result);
    return;
  }
  const normalized = object.kind === kind && object.apiVersion === apiVersion ? object : {...object, apiVersion, kind};
  result.objects.push(normalized);
  const modelKind = modelKinds[kind];
  if (!modelKind) return;
  if (apiVersion !== modelKind.apiVersion) {
    report(`${kind} of apiVersion ${apiVersion} is not supported (want ${modelKind.apiVersion})`);
    return;
  }
  result[modelKind.bucket].push(normalized);
}

function collectItems(items: unknown[], location: Location, inherited: Location['inherited'], result: ParsedManifests): void {
  if (location.depth >= maxListDepth) {
    result.problems.push({
      source: location.source,
      document: location.document,
      message: `${location.source} document ${location.document}: Lists nested deeper than ${maxListDepth}`,
    });
    return;
  }
  for (const [index, item] of items.entries()) {
    const path = `${location.path ?? ''}${location.path ? '.' : ''}items[${index}]`;
    collectObject(item, {source: location.source, document: location.document, path, depth: location.depth + 1, inherited}, result);
  }
}

function firstLine(error: unknown): string {
  const message = errorText(error);
  return message.split('\n')[0].trim();
}

function describeValue(value: unknown): string {
  if (value === null) return 'null';
  if (typeof value === 'string') return `the string ${JSON.stringify(value.length > 40 ? `${value.slice(0, 37)}...` : value)}`;
  return `the ${typeof value} ${String(value)}`;
}
