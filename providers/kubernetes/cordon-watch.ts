/**
 * Tells the node's agent when Kubernetes has cordoned its node. Runs as the `cordon-watch`
 * container of every agent pod (mounted from a ConfigMap, run by the image's Node 24, no imports
 * beyond Node's): every `SPACE_CORDON_CHECK_SECONDS` (default 10) it reads its Node and, while
 * `spec.unschedulable` is true — what `kubectl cordon`/`drain` and the clouds' node replacement
 * (LKE recycle, a CKS NodePool replaced) set first — keeps the agent's `SPACE_DRAIN_FILE` in place,
 * removing it when the node is uncordoned. The agent then takes no new sandbox, and at SIGTERM
 * waits for its sandboxes to end within its drain budget (runtime/agent/service.ts).
 *
 * Kubernetes API: `GET /api/v1/nodes/{name}` (kubernetes.io/docs/reference/kubernetes-api/
 * cluster-resources/node-v1/) with the pod's projected service-account token, re-read each time
 * (the kubelet rotates it); the API server's CA comes through `NODE_EXTRA_CA_CERTS`. The agent's
 * service account may only `get` nodes (a ClusterRole the component makes).
 */
import { readFileSync, rmSync, writeFileSync } from 'node:fs';

/** What {@link checkCordon} needs. */
export interface CordonArgs {
  /** API server base URL, e.g. `https://kubernetes.default.svc`. */
  readonly apiUrl: string;
  /** Reads the bearer token (a file the kubelet rotates). */
  readonly token: () => string;
  /** The Node's name (`spec.nodeName` through the downward API). */
  readonly nodeName: string;
  /** The agent's `SPACE_DRAIN_FILE`. */
  readonly file: string;
}

/** Reads the Node; returns whether it is cordoned, after making `file` say so. Throws on an API error. */
export async function checkCordon(a: CordonArgs): Promise<boolean> {
  const res = await fetch(`${a.apiUrl.replace(/\/$/, '')}/api/v1/nodes/${encodeURIComponent(a.nodeName)}`, {
    headers: { authorization: `Bearer ${a.token().trim()}`, accept: 'application/json' },
  });
  const text = await res.text();
  if (!res.ok) throw new Error(`GET node ${a.nodeName}: HTTP ${res.status}: ${text.slice(0, 300)}`);
  const node = JSON.parse(text) as { spec?: { unschedulable?: boolean } };
  const cordoned = node.spec?.unschedulable === true;
  if (cordoned) writeFileSync(a.file, `cordoned ${new Date().toISOString()}\n`);
  else rmSync(a.file, { force: true });
  return cordoned;
}

/** The container's loop: check, log a JSON line when the state changes or a check fails, repeat. */
async function main(): Promise<void> {
  const env = process.env;
  const tokenFile = env['SPACE_CORDON_TOKEN_FILE'] ?? '/var/run/secrets/kubernetes.io/serviceaccount/token';
  const a: CordonArgs = {
    apiUrl: `https://${env['KUBERNETES_SERVICE_HOST']}:${env['KUBERNETES_SERVICE_PORT'] ?? '443'}`,
    token: () => readFileSync(tokenFile, 'utf8'),
    nodeName: env['NODE_NAME'] ?? '',
    file: env['SPACE_DRAIN_FILE'] ?? '',
  };
  if (!a.nodeName || !a.file || !env['KUBERNETES_SERVICE_HOST'])
    throw new Error('set NODE_NAME, SPACE_DRAIN_FILE and KUBERNETES_SERVICE_HOST');
  const every = Number(env['SPACE_CORDON_CHECK_SECONDS'] || 10) * 1000;
  let last: boolean | undefined;
  for (;;) {
    try {
      const cordoned = await checkCordon(a);
      if (cordoned !== last)
        console.log(JSON.stringify({ msg: 'node cordon checked', node: a.nodeName, cordoned }));
      last = cordoned;
    } catch (err) {
      // a failed check changes nothing: the file stays as the last answer left it
      console.error(JSON.stringify({ msg: 'node cordon check failed', node: a.nodeName, err: String(err) }));
    }
    await new Promise((r) => setTimeout(r, every));
  }
}

if (process.argv[1]?.endsWith('cordon-watch.ts') && process.env['NODE_NAME']) {
  process.once('SIGTERM', () => process.exit(0));
  main().catch((err: unknown) => {
    console.error(String(err));
    process.exit(1);
  });
}
