/**
 * What each stack config makes, pinned: every resource's URN before aliases (type, parent chain,
 * name) and a digest of its inputs, per variant, in `__snapshots__/resources-<variant>.json`. The
 * snapshots were written from the deploy layer before issue 43 made it components; a
 * restructuring that would replace live infrastructure (a child re-parented without an alias, a
 * renamed resource, a changed input) fails here. Resources of the new `space:<cloud>:Stack`
 * components are the only ones allowed to be new: they hold no cloud state of their own.
 */
import { createHash } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { priorUrns, type RecordedResource, unwrapSecrets } from '../providers/testing/mocks.ts';
import { render, VARIANTS, withSecrets } from './test-stacks.ts';

/** Components issue 43 added; their children carry aliases to where they were before. */
const NEW_COMPONENT = /::space:[a-z]+:Stack(\$|::)/;

/** Where this checkout is: a dynamic provider's serialized code names its modules by absolute URL. */
const ROOT_URL = new URL('..', import.meta.url).href.replace(/\/$/, '');
const ROOT_PATH = fileURLToPath(ROOT_URL);

/**
 * Inputs with what differs from run to run or from checkout to checkout taken out: PEM blocks (the
 * tests make fresh keys and CAs each run) become `<pem>` (the block, not the string around it), the checkout's own path becomes `<root>`
 * (a clone elsewhere must pin the same digests), and the secret marker is kept as `{ secret: … }`.
 */
function normalised(v: unknown): unknown {
  if (typeof v === 'string')
    // only the PEM blocks: a whole script that carries one (a Crusoe control VM's startup script
    // holds the control VMs' signing key) must stay pinned for the rest of its text
    return v
      .replace(/-----BEGIN ([A-Z ]+)-----[\s\S]*?-----END \1-----/g, '<pem>')
      .replaceAll(ROOT_URL, '<root>')
      .replaceAll(ROOT_PATH, '<root>');
  if (Array.isArray(v)) return v.map(normalised);
  if (typeof v === 'object' && v !== null) {
    const o = v as Record<string, unknown>;
    if (o['4dabf18193072939515e22adb298388d'] !== undefined) return { secret: normalised(unwrapSecrets(o)) };
    return Object.fromEntries(
      Object.keys(o)
        .sort()
        .map((k) => [k, normalised(o[k])]),
    );
  }
  return v;
}

/** `urn before aliases → sha256 of normalised inputs (first 16 hex)`, sorted; new components left out. */
function identity(recorded: readonly RecordedResource[]): Record<string, string> {
  const prior = priorUrns(recorded);
  const rows = recorded
    .filter((r) => r.urn && !NEW_COMPONENT.test(prior.get(r.urn)!))
    .map((r) => {
      const digest = createHash('sha256')
        .update(JSON.stringify(normalised(r.inputs)))
        .digest('hex')
        .slice(0, 16);
      return [prior.get(r.urn)!, digest] as const;
    })
    .sort(([a], [b]) => a.localeCompare(b));
  return Object.fromEntries(rows);
}

describe.each(Object.entries(VARIANTS))('resources of stack %s', (name, base) => {
  it('are the ones the deploy layer made before issue 43: same URNs (through aliases) and inputs', async () => {
    const recorded = await render(withSecrets(base));
    const rows = identity(recorded);
    expect(Object.keys(rows).length).toBeGreaterThan(3);
    await expect(`${JSON.stringify(rows, null, 2)}\n`).toMatchFileSnapshot(
      `./__snapshots__/resources-${name}.json`,
    );
    // a whole stack under the mock engine: seconds on a loaded 2-core machine
  }, 30_000);
});

describe.each(Object.entries(VARIANTS))('the component of stack %s', (_name, base) => {
  it('is one space:<cloud>:Stack, and everything else is made under it', async () => {
    const raw = withSecrets(base);
    const recorded = await render(raw);
    const stacks = recorded.filter((r) => /^space:[a-z]+:Stack$/.test(r.type));
    expect(stacks.map((r) => r.type)).toEqual([`space:${raw.cloud}:Stack`]);
    const root = stacks[0]!.urn;
    const byUrn = new Map(recorded.map((r) => [r.urn, r]));
    const under = (r: RecordedResource): boolean =>
      r.parent === root || (byUrn.has(r.parent) && under(byUrn.get(r.parent)!));
    const outside = recorded.filter((r) => r.urn && r !== stacks[0] && !under(r)).map((r) => r.urn);
    expect(outside).toEqual([]);
  }, 30_000);
});
