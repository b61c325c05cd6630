/** Address plan of the `vm` mode, shared by the clouds that use it. */
import { createHash } from 'node:crypto';
import * as pulumi from '@pulumi/pulumi';
import { nthHost } from '../runtime/core/net-address.ts';

/** The control VM's private address: the subnet's 10th host (clouds reserve the first few). */
export function controlAddress(privateCidr: string): string {
  return nthHost(privateCidr, 10);
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
