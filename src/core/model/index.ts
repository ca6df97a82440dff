// The model's public surface: read manifests, build a ProxyModel per IP family, find what changed.
export type * from './types.ts';
export {buildProxyModel, ProxyModelBuilder, type ModelObjects, type ModelOptions} from './build.ts';
export {defaultProxyConfig, nftablesLayouts} from './config.ts';
export {changedServicePorts, nodeWideChange, portsWithIdentities, servicePortIdentity} from './changes.ts';
export {parseManifests, type ManifestProblem, type ParsedManifests} from './manifests.ts';
export {endpointKey} from './endpoint.ts';
export {cidrContains, joinHostPort, parseCIDR, parseIP, type ParsedCIDR, type ParsedIP} from './ip.ts';
export type {EndpointSliceInput, NodeInput, ServiceInput} from './objects.ts';
export {inputWarnings, type WarnedInput} from './input-warnings.ts';
