/**
 * The deploy layer's import boundaries (issue 43): providers/ never imports from stacks/ (the
 * program depends on the providers, not the other way round), and of the runtime it reads only
 * the services' public config modules (`runtime/<service>/config.ts`) and the shared core.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = resolve(HERE, '..');

/** Every .ts file under `dir` (tests included: they must not reach into stacks/ either). */
function tsFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? tsFiles(join(dir, e.name)) : e.name.endsWith('.ts') ? [join(dir, e.name)] : [],
  );
}

/** Repository-relative targets of the relative imports and re-exports of `file`. */
function importsOf(file: string): string[] {
  const text = readFileSync(file, 'utf8');
  return [...text.matchAll(/\b(?:import|export)\b[^'";]*?\bfrom\s+'(\.[^']+)'/g)].map((m) =>
    relative(ROOT, resolve(dirname(file), m[1]!)),
  );
}

describe('providers/ import boundaries', () => {
  const files = tsFiles(HERE);

  it('nothing in providers/ imports from stacks/', () => {
    const bad = files.flatMap((f) =>
      importsOf(f)
        .filter((t) => t.startsWith('stacks/'))
        .map((t) => `${relative(ROOT, f)} -> ${t}`),
    );
    expect(files.length).toBeGreaterThan(20);
    expect(bad).toEqual([]);
  });

  it('non-test files read the runtime only through its config modules and runtime/core', () => {
    const allowed = (t: string) => /^runtime\/(core\/.+|[a-z]+\/config\.ts)$/.test(t);
    const bad = files
      .filter(
        (f) =>
          !f.endsWith('.test.ts') &&
          !/(^|\/)test-[^/]*\.ts$/.test(f) &&
          !relative(HERE, f).startsWith('testing/'),
      )
      .flatMap((f) =>
        importsOf(f)
          .filter((t) => t.startsWith('runtime/') && !allowed(t))
          .map((t) => `${relative(ROOT, f)} -> ${t}`),
      );
    expect(bad).toEqual([]);
  });
});
