// `lab up --observe`, in iptables and nftables mode: kube-proxy as kubeadm installs it (its
// ConfigMap and DaemonSet, whose pods run the agent standing in for kube-proxy) and the observers
// installed from manifests/observe/ (its DaemonSet's pods, run by the nodes' kubelets as the real
// agent with only its service account's RBAC); kubectl proxyctl status and diff go to the
// observers. The tampering `lab up` suggests, run as written, makes diff name the service port and
// exit 1; kube-proxy switched to another mode as users switch it makes the observer start again in
// that mode. Root only; the lab is torn down on failure too.
import assert from 'node:assert/strict';
import {existsSync} from 'node:fs';
import {readFile} from 'node:fs/promises';
import {join} from 'node:path';
import {after, before, describe, it} from 'node:test';
import {execa} from 'execa';
import {currentKubectl} from '../../scripts/current-kubectl.ts';
import {labDir, type LabState} from '../../src/lab/lab-state.ts';
import {readLabStatus, usageExamples} from '../../src/lab/lab-status.ts';
import {netnsUnavailableReason} from '../../src/lab/netns/index.ts';
import {describeRun, root, runPlugin, type PluginRun} from './agent-cluster.ts';

const unavailable = await netnsUnavailableReason();
const built = existsSync(join(root, 'dist/src/plugin/commands/lab/up.js'));
const skip = unavailable ? `needs root: ${unavailable}` : built ? undefined : 'needs the build: run `npm run build` first';

const modes = [
  {mode: 'iptables', found: 'KUBE-SERVICES in iptables-nft', tamper: ' -- iptables -t nat -F KUBE-SVC-'},
  {mode: 'nftables', found: 'table ip kube-proxy', tamper: ' -- nft flush chain ip kube-proxy service-'},
] as const;

for (const {mode, found, tamper: tamperCommand} of modes)
  describe(`lab up --observe --proxy-mode ${mode}: observers beside stand-ins for kube-proxy`, {concurrency: false, skip}, () => {
    const name = `pxobs-${mode.slice(0, 3)}-${process.pid}`;
    let state: LabState;
    let env: Record<string, string>;
    const plugin = (...args: string[]): Promise<PluginRun> => runPlugin(args, env);

    before(async () => {
      const up = await runPlugin(['lab', 'up', '--name', name, '--nodes', '1', '--pods-per-node', '2', '--observe', '--proxy-mode', mode]);
      assert.equal(up.code, 0, describeRun(up));
      assert.match(up.stdout, new RegExp(`observing agents beside stand-ins for kube-proxy in ${mode} mode`));
      state = JSON.parse(await readFile(join(labDir(name), 'state.json'), 'utf8')) as LabState;
      env = {KUBECONFIG: state.kubeconfig};
    });
    after(async () => {
      await runPlugin(['lab', 'down', '--name', name]);
    });

    const kubectl = async (args: string[], input?: string) => {
      const result = await execa(currentKubectl(), ['--kubeconfig', state.kubeconfig, ...args], {reject: false, input});
      assert.equal(result.exitCode, 0, `kubectl ${args.join(' ')}: ${result.stderr}`);
      return String(result.stdout);
    };

    it('kube-proxy and the observer are DaemonSets as on a kubeadm cluster: kubectl sees them scheduled and ready', async () => {
      const kubeProxy = JSON.parse(await kubectl(['-n', 'kube-system', 'get', 'daemonset', 'kube-proxy', '-o', 'json']));
      assert.equal(kubeProxy.status.numberReady, 1);
      assert.equal(kubeProxy.spec.template.spec.volumes[0].configMap.name, 'kube-proxy');
      const kubeProxyLog = await kubectl(['-n', 'kube-system', 'logs', 'daemonset/kube-proxy']);
      assert.match(kubeProxyLog, new RegExp(`agent started .*mode=${mode}`));
      const daemonSet = JSON.parse(await kubectl(['-n', 'kube-system', 'get', 'daemonset', 'proxyctl-observer', '-o', 'json']));
      assert.equal(daemonSet.status.desiredNumberScheduled, 1);
      assert.equal(daemonSet.status.numberReady, 1);
      const pods = JSON.parse(
        await kubectl(['-n', 'kube-system', 'get', 'pods', '-l', 'app.kubernetes.io/component=observer', '-o', 'json']),
      );
      assert.equal(pods.items.length, 1);
      const [pod] = pods.items;
      assert.equal(pod.metadata.ownerReferences[0].kind, 'DaemonSet');
      assert.equal(pod.spec.nodeName, 'node-0');
      assert.equal(pod.spec.serviceAccountName, 'proxyctl-observer');
      assert.equal(pod.status.podIP, '10.240.0.10', "hostNetwork: the pod has the node's address");
      // The same applied again changes nothing: the lab installed exactly what the manifests say.
      const again = await kubectl(['apply', '-f', join(root, 'manifests/observe/')]);
      assert.match(again, /daemonset\.apps\/proxyctl-observer unchanged/);
      const logs = await kubectl(['-n', 'kube-system', 'logs', pod.metadata.name]);
      assert.match(logs, /observing kube-proxy/);
      assert.doesNotMatch(logs, /forbidden|cannot (list|watch|get) resource/i);
    });

    it(`status shows the observer, finding kube-proxy ${mode} mode and its settings in kube-proxy's ConfigMap; diff finds nothing`, async () => {
      assert.equal(state.standIns?.length, 1);
      const status = await plugin('status');
      assert.equal(status.code, 0, describeRun(status));
      assert.match(status.stdout, new RegExp(`^node-0\\s+observe: kube-proxy ${mode}\\s+true\\s`, 'm'));
      assert.ok(status.stdout.includes(`node-0: kube-proxy ${mode} (${found}); kube-proxy's settings:`), status.stdout);
      // The lab gives kube-proxy's ConfigMap as kubeadm does; the observer reads its settings there.
      assert.match(status.stdout, /^ {2}clusterCIDR: 10\.244\.0\.0\/16 {2}\(ConfigMap kube-system\/kube-proxy\)$/m);
      assert.doesNotMatch(status.stdout, /cannot read it/);
      const diff = await plugin('diff', 'node-0');
      assert.equal(diff.code, 0, describeRun(diff));
    });

    it('the tampering lab up suggests, run as written: diff names the service port and exits 1', async () => {
      const examples = usageExamples(await readLabStatus(state)).map((line) => line.replace(/\s+#.*$/, ''));
      const tamper = examples.find((line) => line.includes(tamperCommand));
      assert.ok(tamper, `lab up suggests tampering: ${examples.join('\n')}`);
      const argv = tamper.replace(/^kubectl proxyctl /, '').split(' ');
      const ran = await plugin(...argv);
      assert.equal(ran.code, 0, describeRun(ran));
      const diff = await plugin('diff', 'node-0');
      assert.equal(diff.code, 1, describeRun(diff));
      assert.match(diff.stdout, /^node-0: default\/demoapp:http: /m);
      const log = await readFile(state.agents[0].log, 'utf8');
      assert.doesNotMatch(log, /refused/);
    });

    if (mode === 'iptables')
      it('kube-proxy switched to nftables as users switch it (ConfigMap, rollout restart): the observer starts again in that mode', async () => {
        const configMap = JSON.parse(await kubectl(['-n', 'kube-system', 'get', 'configmap', 'kube-proxy', '-o', 'json']));
        configMap.data['config.conf'] = configMap.data['config.conf'].replace('mode: iptables', 'mode: nftables');
        await kubectl(['replace', '-f', '-'], JSON.stringify(configMap));
        await kubectl(['-n', 'kube-system', 'rollout', 'restart', 'daemonset/kube-proxy']);
        await kubectl(['-n', 'kube-system', 'rollout', 'status', 'daemonset/kube-proxy', '--timeout=60s']);
        // kube-proxy removed its iptables rules as it started; the observer, finding none, looks for the mode again.
        let status: PluginRun | undefined;
        for (const deadline = Date.now() + 90_000; Date.now() < deadline; await new Promise((resolve) => setTimeout(resolve, 2000))) {
          status = await plugin('status');
          if (/^node-0\s+observe: kube-proxy nftables\s+true\s/m.test(status.stdout)) break;
        }
        assert.match(status!.stdout, /^node-0\s+observe: kube-proxy nftables\s+true\s/m, describeRun(status!));
        const observer = JSON.parse(
          await kubectl(['-n', 'kube-system', 'get', 'pods', '-l', 'app.kubernetes.io/component=observer', '-o', 'json']),
        );
        const [container] = observer.items[0].status.containerStatuses;
        assert.equal(container.restartCount, 1, 'the observer started again once');
        assert.equal(container.lastState.terminated.exitCode, 0);
        const diff = await plugin('diff', 'node-0');
        assert.equal(diff.code, 0, describeRun(diff));
      });
  });
