/**
 * Keeps an LKE node attached to the nodes' Cloud Firewall. Runs in the `space-lke-firewall`
 * DaemonSet on every LKE node (mounted from a ConfigMap, run by the image's Node 24, no imports):
 * LKE replaces nodes on recycle, upgrade and autoscaling, and a firewall attached by instance id
 * at `pulumi up` time silently stops covering the new ones. This attaches the node it runs on,
 * then checks again every `SPACE_LKE_FIREWALL_RECHECK_SECONDS` (default 600).
 *
 * Linode API v4 (techdocs.akamai.com/linode-api/reference): the node's instance is found by label
 * (`GET /linode/instances` with `X-Filter: {"label": …}`; an LKE node's Kubernetes name is its
 * Linode label — observed, e.g. teocns/lke-firewall-autoattach reads it from `spec.nodeName`;
 * unverified by us); the firewall's devices are `GET /networking/firewalls/{id}/devices`
 * (`data[].entity.{id,type}`), and a device is added with `POST` of `{ "id": …, "type": "linode" }`
 * to the same path. The token needs Firewalls read/write and Linodes read-only.
 */

/** What {@link attachNode} needs. */
export interface AttachArgs {
  /** API base, e.g. `https://api.linode.com/v4`. */
  readonly apiUrl: string;
  readonly token: string;
  readonly firewallId: number;
  /** The Kubernetes node name (= the Linode label on LKE). */
  readonly nodeName: string;
}

/** What happened. */
export type AttachResult = { readonly instanceId: number; readonly attached: 'now' | 'already' };

async function api(
  a: AttachArgs,
  method: string,
  path: string,
  body?: unknown,
  headers: Record<string, string> = {},
) {
  const res = await fetch(`${a.apiUrl.replace(/\/$/, '')}${path}`, {
    method,
    headers: {
      authorization: `Bearer ${a.token}`,
      accept: 'application/json',
      ...(body === undefined ? {} : { 'content-type': 'application/json' }),
      ...headers,
    },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  const text = await res.text();
  if (!res.ok) throw new Error(`linode ${method} ${path}: HTTP ${res.status}: ${text.slice(0, 300)}`);
  return JSON.parse(text || '{}') as Record<string, unknown>;
}

/** Attaches the instance labelled `nodeName` to the firewall unless it is already there. */
export async function attachNode(a: AttachArgs): Promise<AttachResult> {
  const found = await api(a, 'GET', '/linode/instances', undefined, {
    'x-filter': JSON.stringify({ label: a.nodeName }),
  });
  const instances = (found['data'] as { id: number; label: string }[] | undefined) ?? [];
  const instance = instances.find((i) => i.label === a.nodeName);
  if (!instance) throw new Error(`no Linode labelled ${JSON.stringify(a.nodeName)} (is this an LKE node?)`);
  const path = `/networking/firewalls/${a.firewallId}/devices`;
  for (let page = 1, pages = 1; page <= pages; page++) {
    const devices = await api(a, 'GET', `${path}?page=${page}&page_size=500`);
    pages = Number(devices['pages'] ?? 1);
    const list = (devices['data'] as { entity?: { id: number; type: string } }[] | undefined) ?? [];
    if (list.some((d) => d.entity?.type === 'linode' && d.entity.id === instance.id))
      return { instanceId: instance.id, attached: 'already' };
  }
  await api(a, 'POST', path, { id: instance.id, type: 'linode' });
  return { instanceId: instance.id, attached: 'now' };
}

/** The DaemonSet's loop: attach, then re-check forever; log one JSON line per check. */
async function main(): Promise<void> {
  const env = process.env;
  const a: AttachArgs = {
    apiUrl: env['LINODE_API_URL'] || 'https://api.linode.com/v4',
    token: env['LINODE_TOKEN'] ?? '',
    firewallId: Number(env['SPACE_LKE_FIREWALL_ID']),
    nodeName: env['NODE_NAME'] ?? '',
  };
  if (!a.token || !a.nodeName || !Number.isInteger(a.firewallId))
    throw new Error('set LINODE_TOKEN, NODE_NAME and SPACE_LKE_FIREWALL_ID');
  const every = Number(env['SPACE_LKE_FIREWALL_RECHECK_SECONDS'] || 600) * 1000;
  for (;;) {
    try {
      const r = await attachNode(a);
      console.log(JSON.stringify({ msg: 'node firewall checked', node: a.nodeName, ...r }));
    } catch (err) {
      console.error(
        JSON.stringify({ msg: 'node firewall check failed', node: a.nodeName, err: String(err) }),
      );
    }
    await new Promise((r) => setTimeout(r, every));
  }
}

if (process.argv[1]?.endsWith('firewall-attach.ts') && process.env['NODE_NAME']) {
  process.once('SIGTERM', () => process.exit(0));
  main().catch((err: unknown) => {
    console.error(String(err));
    process.exit(1);
  });
}
