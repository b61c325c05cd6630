/** Address plan of the `vm` mode, shared by the clouds that use it. */
import { createHash } from 'node:crypto';
import * as pulumi from '@pulumi/pulumi';

/** The `n`-th host address of an IPv4 CIDR (n = 1 is the first after the network address). */
export function hostAddress(cidr: string, n: number): string {
  const [ip, bits] = cidr.split('/') as [string, string];
  const base = ip.split('.').reduce((acc, o) => acc * 256 + Number(o), 0);
  const mask = Number(bits) === 0 ? 0 : (0xffffffff << (32 - Number(bits))) >>> 0;
  const addr = ((base & mask) >>> 0) + n;
  return [24, 16, 8, 0].map((s) => (addr >>> s) & 255).join('.');
}

/** The control VM's private address: the subnet's 10th host (clouds reserve the first few). */
export function controlAddress(privateCidr: string): string {
  return hostAddress(privateCidr, 10);
}

/**
 * SHA-256 (hex) of `space:bootstrapApiKey`, for the API's `SPACE_BOOTSTRAP_API_KEY_SHA256` in the
 * control VM's user data (undefined without the key). Deliberately not secret: user data is not a
 * secret place, the hash of a key with 190+ random bits cannot be turned back into it, and a
 * secret user data would hide every diff of it.
 */
export function bootstrapKeySha256(cfg: {
  readonly secrets: { readonly bootstrapApiKey?: pulumi.Output<string> };
}): pulumi.Output<string | undefined> {
  const key = cfg.secrets.bootstrapApiKey;
  if (!key) return pulumi.output(undefined);
  return pulumi.unsecret(key.apply((k) => createHash('sha256').update(k).digest('hex')));
}
