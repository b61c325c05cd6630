/**
 * The deploy layer's import boundaries (issue 43): providers/ never imports from stacks/ (the
 * program depends on the providers, not the other way round), and of the runtime it reads only
 * the services' public config modules (`runtime/<service>/config.ts`) and the shared core.
 */
import { readdirSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { relativeImports } from '../scripts/docs-check.ts';

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = resolve(HERE, '..');

/** Every .ts file under `dir` (tests included: they must not reach into stacks/ either). */
function tsFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? tsFiles(join(dir, e.name)) : e.name.endsWith('.ts') ? [join(dir, e.name)] : [],
  );
}

/** Repository-relative targets of every relative import of `file` (the docs check's parser). */
const importsOf = (file: string): string[] => relativeImports(relative(ROOT, file));

describe('providers/ import boundaries', () => {
  const files = tsFiles(HERE);

  it('nothing in providers/ imports from stacks/', () => {
    const bad = files.flatMap((f) =>
      importsOf(f)
        .filter((t) => t.startsWith('stacks/'))
        .map((t) => `${relative(ROOT, f)} -> ${t}`),
    );
    expect(files.length).toBeGreaterThan(20);
    // the parser finds imports, resolved from the importing file's folder (an empty list passes vacuously)
    expect(importsOf(join(HERE, 'kubernetes', 'runtime.ts'))).toContain('providers/runtime-settings.ts');
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
    // a runtime import is seen with its repository path (runtime-settings.ts reads the agent's config)
    expect(importsOf(join(HERE, 'runtime-settings.ts'))).toContain('runtime/agent/config.ts');
    expect(bad).toEqual([]);
  });
});
