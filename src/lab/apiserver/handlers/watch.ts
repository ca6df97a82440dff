// The watch verb: a chunked stream of watch events from the object log, resuming from a
// resourceVersion, with BOOKMARKs and a time limit.
import {ApiError, badRequest} from '../api-error.ts';
import {groupVersion} from '../resources.ts';
import type {KubeObject, StoredEvent} from '../object-log.ts';
import {matchesFields, matchesLabels, parseFieldSelector, parseLabelSelector} from '../selectors.ts';
import {toTable} from '../table-printer.ts';
import type {ResourceHandler} from './context.ts';
import {tableRequest} from './response.ts';
import {present} from './served-version.ts';

/** How long a watch from a resourceVersion the server has not reached waits for it, as kube-apiserver's. */
const tooLargeWaitMs = 3000;
/** A watcher whose unread output passes this much is cut off rather than buffered without end. */
const slowWatcherBytes = 64 * 1024 * 1024;

export const watchObjects: ResourceHandler = async ({store, log, bookmarkMs, maxWatchMs, watchTimers}, {req, res, url, route}) => {
  const {type} = route;
  const search = url.searchParams;
  const labels = search.get('labelSelector') ? parseLabelSelector(search.get('labelSelector')!) : [];
  let fieldText = search.get('fieldSelector') ?? '';
  if (route.name) fieldText = fieldText ? `${fieldText},metadata.name=${route.name}` : `metadata.name=${route.name}`;
  const fields = fieldText ? parseFieldSelector(fieldText, type.resource) : [];
  const namespace = route.namespace;
  const visible = (o: KubeObject) =>
    (!namespace || o.metadata.namespace === namespace) &&
    (labels.length === 0 || matchesLabels(labels, o.metadata.labels)) &&
    (fields.length === 0 || matchesFields(fields, o));
  const table = tableRequest(req, url);
  const formatKey = `${type.version}|${table ?? 'json'}`;
  const encode = (obj: KubeObject) =>
    JSON.stringify(table ? toTable(type.kind, [present(type, obj)], obj.metadata.resourceVersion ?? '', table) : present(type, obj));
  const encodedEvent = (event: StoredEvent) => {
    let text = event.encoded.get(formatKey);
    if (text === undefined) {
      text = encode(event.object);
      event.encoded.set(formatKey, text);
    }
    return text;
  };
  const rvParam = search.get('resourceVersion') ?? '';
  const allowBookmarks = search.get('allowWatchBookmarks') === 'true' || search.get('allowWatchBookmarks') === '1';
  const timeoutSeconds = search.has('timeoutSeconds') ? Number(search.get('timeoutSeconds')) : undefined;

  res.writeHead(200, {'content-type': 'application/json', 'cache-control': 'no-cache, private', 'transfer-encoding': 'chunked'});
  res.flushHeaders();
  let finished = false;
  const write = (line: string) => {
    if (finished) return;
    res.write(line);
    if (res.writableLength > slowWatcherBytes) finish(true);
  };
  const bookmark = () => {
    const obj = {kind: type.kind, apiVersion: groupVersion(type), metadata: {resourceVersion: String(log.currentRevision)}};
    write(`{"type":"BOOKMARK","object":${JSON.stringify(obj)}}\n`);
  };

  let startRevision: number;
  if (rvParam === '' || rvParam === '0') {
    for (const obj of store.list(type, {namespace}).items) if (visible(obj)) write(`{"type":"ADDED","object":${encode(obj)}}\n`);
    startRevision = log.currentRevision;
  } else {
    startRevision = Number(rvParam);
    if (!Number.isInteger(startRevision) || startRevision < 0) {
      const status = badRequest(
        `invalid resource version: strconv.ParseUint: parsing ${JSON.stringify(rvParam)}: invalid syntax`,
      ).toStatus();
      write(`{"type":"ERROR","object":${JSON.stringify(status)}}\n`);
      res.end();
      return;
    }
  }
  if (startRevision > log.currentRevision) {
    // A resourceVersion this server has not reached, as a client that watched a server before its
    // storage was replaced holds: kube-apiserver waits up to 3 s for it, then refuses the watch
    // ("Too large resource version"), and the client lists again.
    const waitUntil = Date.now() + tooLargeWaitMs;
    while (startRevision > log.currentRevision && Date.now() < waitUntil && !finished && !req.destroyed)
      await new Promise((resolve) => setTimeout(resolve, 50));
    if (startRevision > log.currentRevision) {
      const status = new ApiError(504, 'Timeout', `Too large resource version: ${startRevision}, current: ${log.currentRevision}`, {
        causes: [{reason: 'ResourceVersionTooLarge', message: 'Too large resource version'}],
        retryAfterSeconds: 1,
      }).toStatus();
      write(`{"type":"ERROR","object":${JSON.stringify(status)}}\n`);
      finished = true;
      res.end();
      return;
    }
  }
  const deliver = (event: StoredEvent) => {
    if (event.revision <= startRevision) return;
    const now = visible(event.object);
    const before = event.previous !== undefined && event.type === 'MODIFIED' && visible(event.previous);
    let t: string | undefined;
    if (event.type === 'ADDED') t = now ? 'ADDED' : undefined;
    else if (event.type === 'DELETED') t = now ? 'DELETED' : undefined;
    else if (now) t = before ? 'MODIFIED' : 'ADDED';
    else if (before) t = 'DELETED';
    if (t) write(`{"type":"${t}","object":${encodedEvent(event)}}\n`);
  };
  let backlog: StoredEvent[];
  try {
    backlog = log.eventsSince(type.storageKey, startRevision);
  } catch (err) {
    const status = err instanceof ApiError ? err.toStatus() : badRequest(String(err)).toStatus();
    write(`{"type":"ERROR","object":${JSON.stringify(status)}}\n`);
    finished = true;
    res.end();
    return;
  }
  for (const event of backlog) deliver(event);
  const unsubscribe = log.subscribe(type.storageKey, deliver);
  const bookmarkTimer = allowBookmarks ? setInterval(bookmark, bookmarkMs) : undefined;
  const limitMs = timeoutSeconds !== undefined && timeoutSeconds >= 0 ? timeoutSeconds * 1000 : maxWatchMs;
  const endTimer = setTimeout(() => {
    if (allowBookmarks) bookmark();
    finish(false);
  }, limitMs);
  function finish(abort: boolean): void {
    if (finished) return;
    finished = true;
    unsubscribe();
    clearInterval(bookmarkTimer);
    clearTimeout(endTimer);
    watchTimers.delete(stopWatch);
    if (abort) res.destroy();
    else res.end();
  }
  const stopWatch = () => finish(false);
  watchTimers.add(stopWatch);
  req.on('close', () => finish(true));
  res.on('close', () => finish(true));
};
