/**
 * The off-node half of `space backup`: snapshots as objects of an S3-compatible store, through
 * `@aws-sdk/client-s3` (any store that speaks the S3 REST API: AWS, Linode/Akamai Object Storage,
 * MinIO, Ceph RGW, s3rver in the tests).
 *
 * Layout: `<prefix><deployment>/redis-<YYYYMMDDTHHMMSSmmmZ>.rdb`, one object per backup, its
 * SHA-256 in the object's user metadata (`x-amz-meta-sha256`, with `x-amz-meta-space-deployment`
 * and `x-amz-meta-space-keys`). Only keys of exactly that form under this deployment's folder are
 * backups: `list`, `restore` and `prune` never see or touch anything else in the bucket.
 *
 * The SDK's default request/response checksums (CRC32 trailers, aws-chunked uploads, added to
 * S3 in SDK 3.729) are asked for only where S3 requires them (`WHEN_REQUIRED`): several
 * S3-compatible stores refuse the chunked form, and the backup's own SHA-256 is what restore
 * checks.
 */
import { createHash } from 'node:crypto';
import { createReadStream, createWriteStream } from 'node:fs';
import { stat } from 'node:fs/promises';
import type { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import {
  DeleteObjectsCommand,
  GetObjectCommand,
  HeadObjectCommand,
  ListObjectsV2Command,
  PutObjectCommand,
  S3Client,
  S3ServiceException,
} from '@aws-sdk/client-s3';
import type { BackupConfig } from './backup-config.ts';
import { CliError } from './output.ts';

/** One backup object as `list` shows it. */
export interface BackupObject {
  /** Object key in the bucket. */
  key: string;
  /** When the snapshot was taken (from the key), ISO 8601 UTC. */
  takenAt: string;
  /** Object size, bytes. */
  size: number;
}

/** What a backup's metadata says. */
export interface BackupMeta {
  /** SHA-256 of the RDB, lower-case hex. */
  sha256: string;
  /** Keys the database held when the snapshot was taken (`DBSIZE`). */
  keys: number;
  /** Redis server the snapshot came from (`host:port` or a socket path). */
  source: string;
}

const NAME = /^redis-(\d{8}T\d{9}Z)\.rdb$/;

/** The object name of a snapshot taken at `at` (UTC, ms precision, sorts by time). */
export function backupName(at: Date): string {
  return `redis-${at.toISOString().replace(/[-:.]/g, '')}.rdb`;
}

/** When a backup named `name` was taken, or null when `name` is not a backup's name. */
export function takenAtOf(name: string): Date | null {
  const m = NAME.exec(name);
  if (!m) return null;
  const s = m[1]!;
  const iso = `${s.slice(0, 4)}-${s.slice(4, 6)}-${s.slice(6, 8)}T${s.slice(9, 11)}:${s.slice(11, 13)}:${s.slice(13, 15)}.${s.slice(15, 18)}Z`;
  const t = new Date(iso);
  return Number.isNaN(t.getTime()) ? null : t;
}

/**
 * Which backups retention deletes, newest first in, `now` the present: a backup is kept when it is
 * among the newest `keepLast` (rule off at 0) or younger than `keepDays` days (off at 0); the
 * newest is always kept, and with both rules off nothing is deleted. Pure.
 */
export function expired(
  backups: readonly BackupObject[],
  keepLast: number,
  keepDays: number,
  now: Date,
): BackupObject[] {
  if (keepLast === 0 && keepDays === 0) return [];
  const newestFirst = [...backups].sort((a, b) => b.takenAt.localeCompare(a.takenAt));
  const cutoff = now.getTime() - keepDays * 86_400_000;
  return newestFirst.filter(
    (b, i) => i > 0 && !(keepLast > 0 && i < keepLast) && !(keepDays > 0 && Date.parse(b.takenAt) >= cutoff),
  );
}

/** The backups of one deployment in one bucket. */
export class BackupStore {
  readonly #s3: S3Client;
  readonly #bucket: string;
  /** `<prefix><deployment>/` */
  readonly folder: string;
  readonly #deployment: string;

  constructor(c: BackupConfig) {
    this.#bucket = c.bucket;
    this.#deployment = c.deployment;
    this.folder = `${c.prefix}${c.deployment}/`;
    this.#s3 = new S3Client({
      region: c.region,
      ...(c.endpoint ? { endpoint: c.endpoint } : {}),
      forcePathStyle: c.pathStyle === 'path' || (c.pathStyle === 'auto' && Boolean(c.endpoint)),
      ...(c.accessKeyId
        ? { credentials: { accessKeyId: c.accessKeyId, secretAccessKey: c.secretAccessKey } }
        : {}),
      requestChecksumCalculation: 'WHEN_REQUIRED',
      responseChecksumValidation: 'WHEN_REQUIRED',
      maxAttempts: 4,
    });
  }

  /** Where this store is, for messages: `s3://bucket/folder`. */
  get url(): string {
    return `s3://${this.#bucket}/${this.folder}`;
  }

  /**
   * Uploads the RDB at `file` (taken at `at`) with its metadata. @returns its key.
   * @throws CliError BACKUP_STORE_FAILED when the store refuses or cannot be reached.
   */
  async put(file: string, at: Date, meta: BackupMeta): Promise<string> {
    const key = this.folder + backupName(at);
    const { size } = await stat(file);
    await this.#call('upload', key, () =>
      this.#s3.send(
        new PutObjectCommand({
          Bucket: this.#bucket,
          Key: key,
          Body: createReadStream(file),
          ContentLength: size,
          ContentType: 'application/octet-stream',
          Metadata: {
            sha256: meta.sha256,
            'space-deployment': this.#deployment,
            'space-keys': String(meta.keys),
            'space-source': meta.source,
          },
        }),
      ),
    );
    return key;
  }

  /** This deployment's backups, oldest first. @throws CliError BACKUP_STORE_FAILED. */
  async list(): Promise<BackupObject[]> {
    const out: BackupObject[] = [];
    let token: string | undefined;
    do {
      const page = await this.#call('list', this.folder, () =>
        this.#s3.send(
          new ListObjectsV2Command({
            Bucket: this.#bucket,
            Prefix: this.folder,
            ...(token ? { ContinuationToken: token } : {}),
          }),
        ),
      );
      for (const o of page.Contents ?? []) {
        const name = o.Key?.slice(this.folder.length) ?? '';
        const at = takenAtOf(name);
        if (at) out.push({ key: o.Key!, takenAt: at.toISOString(), size: o.Size ?? 0 });
      }
      token = page.IsTruncated ? page.NextContinuationToken : undefined;
    } while (token);
    return out.sort((a, b) => a.takenAt.localeCompare(b.takenAt));
  }

  /**
   * The key of backup `ref`: `latest`, an object key, or an object name of this deployment.
   * @throws CliError BACKUP_NOT_FOUND when there is no such backup.
   */
  async resolve(ref: string): Promise<string> {
    const all = await this.list();
    const found =
      ref === 'latest' ? all.at(-1) : all.find((b) => b.key === ref || b.key === this.folder + ref);
    if (!found)
      throw new CliError(
        'BACKUP_NOT_FOUND',
        ref === 'latest' ? `no backup in ${this.url}` : `no backup "${ref}" in ${this.url}`,
        { hint: 'see `space backup list`' },
      );
    return found.key;
  }

  /**
   * Downloads backup `key` to `file` and checks it against the SHA-256 in its metadata.
   * @returns its metadata. @throws CliError BACKUP_CORRUPT when the checksum is missing or differs
   * (the file is left for inspection), BACKUP_NOT_FOUND, BACKUP_STORE_FAILED.
   */
  async get(key: string, file: string): Promise<BackupMeta> {
    const res = await this.#call('download', key, () =>
      this.#s3.send(new GetObjectCommand({ Bucket: this.#bucket, Key: key })),
    );
    const md = res.Metadata ?? {};
    const hash = createHash('sha256');
    const body = res.Body as Readable;
    body.on('data', (d: Buffer) => hash.update(d));
    await pipeline(body, createWriteStream(file, { mode: 0o600 }));
    const actual = hash.digest('hex');
    const want = md['sha256'];
    if (!want || !/^[0-9a-f]{64}$/.test(want))
      throw new CliError('BACKUP_CORRUPT', `${key} carries no SHA-256 in its metadata: not a SPACE backup`);
    if (actual !== want)
      throw new CliError(
        'BACKUP_CORRUPT',
        `${key} does not match its checksum (sha256 ${actual}, the backup recorded ${want}): the object changed after it was written; nothing was restored`,
        { details: { key, expected: want, actual }, hint: 'restore an older backup (`space backup list`)' },
      );
    return { sha256: want, keys: Number(md['space-keys'] ?? 0), source: md['space-source'] ?? '' };
  }

  /** The metadata of backup `key` (no download). @throws as {@link get}. */
  async head(key: string): Promise<Partial<BackupMeta>> {
    const res = await this.#call('read', key, () =>
      this.#s3.send(new HeadObjectCommand({ Bucket: this.#bucket, Key: key })),
    );
    const md = res.Metadata ?? {};
    return {
      ...(md['sha256'] ? { sha256: md['sha256'] } : {}),
      ...(md['space-keys'] ? { keys: Number(md['space-keys']) } : {}),
    };
  }

  /** Deletes the given backups of this deployment (keys outside its folder are refused). */
  async delete(keys: readonly string[]): Promise<void> {
    for (const k of keys)
      if (!k.startsWith(this.folder) || !takenAtOf(k.slice(this.folder.length)))
        throw new Error(`refusing to delete ${k}: not a backup of this deployment`);
    for (let i = 0; i < keys.length; i += 1000) {
      const batch = keys.slice(i, i + 1000);
      const res = await this.#call('delete', this.folder, () =>
        this.#s3.send(
          new DeleteObjectsCommand({
            Bucket: this.#bucket,
            Delete: { Objects: batch.map((Key) => ({ Key })), Quiet: true },
          }),
        ),
      );
      if (res.Errors?.length)
        throw new CliError(
          'BACKUP_STORE_FAILED',
          `the store did not delete ${res.Errors.map((e) => `${e.Key} (${e.Code})`).join(', ')}`,
        );
    }
  }

  /** Closes the client's connections. */
  close(): void {
    this.#s3.destroy();
  }

  async #call<T>(what: string, key: string, fn: () => Promise<T>): Promise<T> {
    try {
      return await fn();
    } catch (err) {
      if (err instanceof S3ServiceException && (err.name === 'NoSuchKey' || err.name === 'NotFound'))
        throw new CliError('BACKUP_NOT_FOUND', `no object ${key} in bucket ${this.#bucket}`);
      const name = err instanceof S3ServiceException ? `${err.name}: ` : '';
      throw new CliError(
        'BACKUP_STORE_FAILED',
        `${what} ${key} in bucket ${this.#bucket}: ${name}${(err as Error).message}`,
        { cause: err },
      );
    }
  }
}
