/**
 * Removes credential values that earlier agent versions wrote into each sandbox's state file
 * (`<stateDir>/sandboxes/<id>/sandbox.json`, once mode 0644). Values now stay in the state of record
 * and are fetched by the gateway; a file from before is rewritten without them, mode 0600, before
 * the sandboxes are re-adopted. Idempotent; a file it cannot parse is left for adoption to judge.
 */
import { chmod, readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { writeFileAtomic } from '../host/durable-file.ts';

/** Scrubs every sandbox state file under `sandboxesDir`; returns how many held values. */
export async function scrubCredentialValues(sandboxesDir: string): Promise<number> {
  let scrubbed = 0;
  for (const id of await readdir(sandboxesDir).catch(() => [] as string[])) {
    const file = join(sandboxesDir, id, 'sandbox.json');
    let rec: { req?: { credentials?: Record<string, unknown>[] } };
    try {
      rec = JSON.parse(await readFile(file, 'utf8')) as typeof rec;
    } catch {
      continue;
    }
    const grants = rec.req?.credentials ?? [];
    if (grants.some((g) => 'value' in g)) {
      for (const g of grants) delete g.value;
      await writeFileAtomic(file, JSON.stringify(rec));
      scrubbed++;
    }
    await chmod(file, 0o600);
  }
  return scrubbed;
}
