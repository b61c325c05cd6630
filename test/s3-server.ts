/**
 * A throwaway S3-protocol server on loopback (s3rver, npm): the store `space backup` ships to in
 * the tests. Its data lives in a temporary folder removed at stop; its credentials are s3rver's
 * fixed `S3RVER`/`S3RVER`, which it checks (SigV4) like a real store.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

interface S3rverInstance {
  run(): Promise<{ address: string; port: number }>;
  close(): Promise<void>;
}
type S3rverClass = new (o: {
  address: string;
  port: number;
  silent: boolean;
  directory: string;
  configureBuckets: { name: string }[];
}) => S3rverInstance;

/** A running s3rver: its endpoint, the bucket made at start, and the settings `space backup` reads. */
export interface S3Server {
  endpoint: string;
  bucket: string;
  /** `SPACE_BACKUP_S3_*` for this store (deployment `deployment`). */
  env(deployment?: string): Record<string, string>;
  stop(): Promise<void>;
}

/** Starts s3rver on a free loopback port with one bucket, `bucket`. */
export async function startS3Server(bucket = 'space-backups'): Promise<S3Server> {
  const S3rver = createRequire(import.meta.url)('s3rver') as S3rverClass;
  const dir = await mkdtemp(join(tmpdir(), 'space-s3rver-'));
  const server = new S3rver({
    address: '127.0.0.1',
    port: 0,
    silent: true,
    directory: dir,
    configureBuckets: [{ name: bucket }],
  });
  const { port } = await server.run();
  const endpoint = `http://127.0.0.1:${port}`;
  return {
    endpoint,
    bucket,
    env: (deployment = 'test') => ({
      SPACE_BACKUP_S3_ENDPOINT: endpoint,
      SPACE_BACKUP_S3_BUCKET: bucket,
      SPACE_BACKUP_S3_ACCESS_KEY_ID: 'S3RVER',
      SPACE_BACKUP_S3_SECRET_ACCESS_KEY: 'S3RVER',
      SPACE_BACKUP_DEPLOYMENT: deployment,
    }),
    async stop() {
      await server.close();
      await rm(dir, { recursive: true, force: true });
    },
  };
}
