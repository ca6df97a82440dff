// `--from client-0`: the lab's external client stands outside the cluster, so the API server knows
// no pod of that name; the lab's own state (found by the kubeconfig's cluster name) knows its
// address, its network namespace and the node it sends service traffic through.
import type {KubeConfig} from '@kubernetes/client-node';
import {labNameOfCluster, readLabState} from '../../lab/lab-state.ts';

export interface LabExternalClient {
  name: string;
  ip: string;
  netns: string;
  /** The node whose address is the client's gateway for service traffic. */
  node?: string;
}

/** labExternalClient finds NAME ("client" is client-0) among the external clients of the lab the kubeconfig points at. */
export async function labExternalClient(config: KubeConfig, name: string): Promise<LabExternalClient | undefined> {
  const lab = labNameOfCluster(config.getCurrentCluster()?.name ?? '');
  if (!lab) return undefined;
  let state;
  try {
    state = await readLabState(lab);
  } catch {
    // Not this machine's lab, or its state is unreadable: then NAME is no lab client either.
    return undefined;
  }
  const wanted = name === 'client' ? 'client-0' : name;
  const client = state?.topology?.externalClients.find((candidate) => candidate.name === wanted);
  if (!client) return undefined;
  const node = state?.topology?.nodes.find((candidate) => candidate.ip === client.gateway)?.name;
  return {name: client.name, ip: client.ip, netns: client.namespace, ...(node ? {node} : {})};
}
