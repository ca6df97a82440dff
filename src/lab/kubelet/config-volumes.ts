// ConfigMap volumes as a lab kubelet gives them to the agents it runs (agent-container.ts). There
// is no container runtime, so no mount namespace: each configMap volume is written to a directory
// of the pod's (a file per key, or per `items` entry), and a container argument that names a path
// under one of its volumeMounts (`--config=/var/lib/kube-proxy/config.conf`) is pointed into that
// directory. They are written each time the container starts, so a restarted pod reads the
// ConfigMap as it is then, as kube-proxy does.
import {mkdir, rm, writeFile} from 'node:fs/promises';
import {dirname, join, normalize, relative} from 'node:path';
import type {ClusterStore} from '../apiserver/cluster-store.ts';
import type {KubeObject} from '../apiserver/object-log.ts';

/** A container's volumeMount whose volume the kubelet wrote: its mountPath and where the files are. */
export interface VolumeMount {
  mountPath: string;
  directory: string;
}

/** A key's file inside its volume's directory: relative, and never outside it. */
function filePath(directory: string, path: string, volume: string): string {
  const file = normalize(join(directory, path));
  if (relative(directory, file).startsWith('..')) throw new Error(`volume ${volume}: item path ${JSON.stringify(path)} leaves the volume`);
  return file;
}

/**
 * writeConfigMapVolumes writes the configMap volumes the container mounts into podDirectory and
 * returns its mounts of them. A ConfigMap that is not there (and not optional) is an error worded
 * as the kubelet's FailedMount event words it.
 */
export async function writeConfigMapVolumes(
  pod: KubeObject,
  container: any,
  store: ClusterStore,
  podDirectory: string,
): Promise<VolumeMount[]> {
  const mounts: VolumeMount[] = [];
  const volumes = new Map<string, any>((pod.spec?.volumes ?? []).map((volume: any) => [volume.name, volume]));
  await rm(join(podDirectory, 'volumes'), {recursive: true, force: true});
  for (const mount of container.volumeMounts ?? []) {
    const volume = volumes.get(mount.name);
    if (!volume?.configMap || typeof mount.mountPath !== 'string') continue;
    const source = volume.configMap;
    const configMap = store.tryGet('configmaps', pod.metadata.namespace, source.name);
    if (!configMap && !source.optional)
      throw new Error(`MountVolume.SetUp failed for volume "${volume.name}" : configmap "${source.name}" not found`);
    const directory = join(podDirectory, 'volumes', volume.name);
    await mkdir(directory, {recursive: true});
    const data: Record<string, string> = configMap?.data ?? {};
    const items: Array<{key: string; path: string}> = source.items ?? Object.keys(data).map((key) => ({key, path: key}));
    for (const item of items) {
      if (data[item.key] === undefined) {
        if (source.optional) continue;
        throw new Error(`MountVolume.SetUp failed for volume "${volume.name}" : configmap references non-existent config key: ${item.key}`);
      }
      const file = filePath(directory, item.path, volume.name);
      await mkdir(dirname(file), {recursive: true});
      await writeFile(file, data[item.key]);
    }
    mounts.push({
      mountPath: normalize(mount.mountPath),
      directory: mount.subPath ? filePath(directory, mount.subPath, volume.name) : directory,
    });
  }
  return mounts;
}

/** pointIntoVolumes: arg with each path under a mount's mountPath pointed into the mount's directory. */
export function pointIntoVolumes(arg: string, mounts: readonly VolumeMount[]): string {
  let result = arg;
  for (const {mountPath, directory} of mounts) {
    const escaped = mountPath.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
    // The mount path as a whole path: at the start or after "=" or ",", and followed by "/" or the end.
    result = result.replace(new RegExp(`(^|[=,])${escaped}(?=/|$|,)`, 'g'), (_whole, before: string) => `${before}${directory}`);
  }
  return result;
}
