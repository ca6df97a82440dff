// ClusterObjects: what the watches hand on to the proxiers. The proxiers depend on it; the watches
// depend on nothing in sync/.

/** The kinds a proxier reads. */
export type ObjectKind = 'Service' | 'EndpointSlice' | 'Node';

/** ClusterObjects: the current Services, EndpointSlices and this node's Node, as the watches hold them. */
export interface ClusterObjects {
  services(): unknown[];
  endpointSlices(): unknown[];
  node(): unknown;
}

/** Annotation the EndpointSlice controller sets to when the change behind the slice happened. */
export const lastChangeTriggerTimeAnnotation = 'endpoints.kubernetes.io/last-change-trigger-time';
