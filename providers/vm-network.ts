/** Address plan of the `vm` mode, shared by the clouds that use it. */
import { createHash, createPrivateKey, hkdfSync } from 'node:crypto';
import * as pulumi from '@pulumi/pulumi';
import { nthHost } from '../runtime/core/net-address.ts';
import type { BackupPlan } from './backup-schedule.ts';
import type { ImagePullCredentials } from './image-pull.ts';

/** The control VM's private address: the subnet's 10th host (clouds reserve the first few). */
export function controlAddress(privateCidr: string): string {
  return nthHost(privateCidr, 10);
}

/**
 * The private addresses of `n` control VMs where the program chooses them (Akamai): the first at
 * {@link controlAddress}, the others right after it (hosts 11, 12, …). Pure.
 */
export function controlAddresses(privateCidr: string, n: number): string[] {
  return Array.from({ length: n }, (_, i) => nthHost(privateCidr, 10 + i));
}

/** DER prefix of a PKCS#8 Ed25519 private key before its 32-byte seed (RFC 8410 section 7). */
const ED25519_PKCS8_PREFIX = Buffer.from('302e020100300506032b657004220420', 'hex');

/**
 * The API signing key every control VM of a highly available control plane shares (Ed25519,
 * PKCS#8 PEM; secret): `space:signingKey` when set (recommended: otherwise whoever holds the
 * bootstrap API key can derive it and sign session tokens), else derived from `space:bootstrapApiKey` (required in vm mode) with
 * HKDF-SHA256 (RFC 5869; info `space vm signing key`, 32 bytes as the Ed25519 seed, RFC 8032), so
 * the stack needs no further secret and every `pulumi up` renders the same key. Knowing it does
 * not reveal the API key. With one control VM the VM makes its own key instead.
 */
export function vmSigningKey(cfg: {
  readonly secrets: {
    readonly bootstrapApiKey?: pulumi.Output<string>;
    readonly signingKey?: pulumi.Output<string>;
  };
}): pulumi.Output<string> {
  if (cfg.secrets.signingKey) return pulumi.secret(cfg.secrets.signingKey);
  const key = cfg.secrets.bootstrapApiKey;
  if (!key) throw new Error('a control plane of several VMs needs space:bootstrapApiKey');
  return pulumi.secret(
    key.apply((k) => {
      const seed = Buffer.from(hkdfSync('sha256', k, '', 'space vm signing key', 32));
      return createPrivateKey({
        key: Buffer.concat([ED25519_PKCS8_PREFIX, seed]),
        format: 'der',
        type: 'pkcs8',
      })
        .export({ type: 'pkcs8', format: 'pem' })
        .toString();
    }),
  );
}

/**
 * SHA-256 (hex) of `space:bootstrapApiKey`, for the API's `SPACE_BOOTSTRAP_API_KEY_SHA256` in the
 * control VM's user data (undefined without the key). Not secret itself (the hash of a key with
 * 190+ random bits cannot be turned back into it), so the VM configuration that carries it stays
 * readable in diffs; the user data as a whole is secret for the Redis password
 * ({@link vmSecretArgs}).
 */
export function bootstrapKeySha256(cfg: {
  readonly secrets: { readonly bootstrapApiKey?: pulumi.Output<string> };
}): pulumi.Output<string | undefined> {
  const key = cfg.secrets.bootstrapApiKey;
  if (!key) return pulumi.output(undefined);
  return pulumi.unsecret(key.apply((k) => createHash('sha256').update(k).digest('hex')));
}

/**
 * The password of the control VM's Redis (secret): `space:redisPassword` when set, else derived
 * from `space:bootstrapApiKey` (required in vm mode) with HKDF-SHA256 (RFC 5869; info
 * `space vm redis password`, 32 bytes, hex), so a stack needs no second secret and every
 * `pulumi up` renders the same one. Knowing it does not reveal the API key. Undefined output when
 * neither is set (the stack configuration refuses that in vm mode).
 */
export function vmRedisPassword(cfg: {
  readonly secrets: {
    readonly redisPassword?: pulumi.Output<string>;
    readonly bootstrapApiKey?: pulumi.Output<string>;
  };
}): pulumi.Output<string> {
  if (cfg.secrets.redisPassword) return pulumi.secret(cfg.secrets.redisPassword);
  const key = cfg.secrets.bootstrapApiKey;
  if (!key) throw new Error('vm mode needs space:redisPassword or space:bootstrapApiKey');
  return pulumi.secret(
    key.apply((k) => Buffer.from(hkdfSync('sha256', k, '', 'space vm redis password', 32)).toString('hex')),
  );
}

/**
 * The secrets every VM's user data carries, as one secret output: the Redis password
 * ({@link vmRedisPassword}), when `space:imagePullUsername` is set the image pull credentials, and
 * with `space:backup` the backup plan with its secret key (only the control VM's plan renders it).
 */
export function vmSecretArgs(cfg: {
  readonly imagePullUsername: string | undefined;
  readonly backup?: BackupPlan | undefined;
  readonly secrets: {
    readonly redisPassword?: pulumi.Output<string>;
    readonly bootstrapApiKey?: pulumi.Output<string>;
    readonly imagePullPassword?: pulumi.Output<string>;
    readonly backupSecretAccessKey?: pulumi.Output<string>;
  };
}): pulumi.Output<{
  redisPassword: string;
  imagePull?: ImagePullCredentials;
  backup?: BackupPlan & { secretAccessKey?: string };
}> {
  const user = cfg.imagePullUsername;
  const pull = cfg.secrets.imagePullPassword;
  const backup = cfg.backup;
  return pulumi.secret(
    pulumi
      .all([
        vmRedisPassword(cfg),
        pull ?? pulumi.output(undefined),
        cfg.secrets.backupSecretAccessKey ?? pulumi.output(undefined),
      ])
      .apply(([redisPassword, password, backupSecret]) => ({
        redisPassword,
        ...(user !== undefined && password !== undefined ? { imagePull: { username: user, password } } : {}),
        ...(backup
          ? { backup: { ...backup, ...(backupSecret ? { secretAccessKey: backupSecret } : {}) } }
          : {}),
      })),
  );
}

/**
 * The secret arguments of control VM `index` (0-based) among several: only the first carries the
 * backup plan, so a schedule makes one backup rather than one per control VM (each would ask the
 * sentinels for the same primary). While that VM is down no scheduled backup runs.
 */
export function controlVmSecrets<T extends { readonly backup?: unknown }>(s: T, index: number): T {
  if (index === 0 || s.backup === undefined) return s;
  const { backup: _, ...rest } = s;
  return rest as T;
}
