/**
 * The dependency split (issue 12, part 7): a node and the image install `dependencies` only
 * (`npm ci --omit=dev`), which must hold everything the runtime imports and no Pulumi package; the
 * deployment (Pulumi programs) and tooling live in `devDependencies`.
 */
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { packageOf, productionPackages, runtimeFiles } from './image-context.ts';

const ROOT = new URL('..', import.meta.url);
const lock = JSON.parse(readFileSync(new URL('package-lock.json', ROOT), 'utf8'));
const pkg = JSON.parse(readFileSync(new URL('package.json', ROOT), 'utf8')) as {
  dependencies: Record<string, string>;
  devDependencies: Record<string, string>;
};
const production = new Set(productionPackages(lock).map((p) => p.replace(/^node_modules\//, '')));

/** Bare package names a source file imports (static and dynamic imports). */
function importsOf(file: string): string[] {
  const text = readFileSync(new URL(file, ROOT), 'utf8');
  const specs = [
    ...text.matchAll(/(?:^|\n)\s*(?:import|export)\b[^'"]*?from\s*['"]([^'"]+)['"]/g),
    ...text.matchAll(/(?:^|\n)\s*import\s*['"]([^'"]+)['"]/g),
    ...text.matchAll(/\bimport\(\s*['"]([^'"]+)['"]\s*\)/g),
  ].map((m) => m[1]!);
  return specs.map(packageOf).filter((p): p is string => p !== null);
}

describe('dependency sets: runtime vs deployment', () => {
  it('the production set (what a node and the image install) holds no Pulumi package nor tooling', () => {
    const forbidden = [...production].filter((p) =>
      /^(@pulumi\/|@grpc\/|kubernetes-models|vitest|typescript|@biomejs\/|node$)/.test(p),
    );
    expect(forbidden).toEqual([]);
    expect(Object.keys(pkg.dependencies).filter((d) => d.startsWith('@pulumi/'))).toEqual([]);
  });

  it('every package the runtime imports is in the production set', () => {
    // code only: `.proto` sources (envd) import other .proto files, not npm packages
    const files = runtimeFiles().filter((f) => /\.(ts|js|mjs)$/.test(f));
    expect(files.length).toBeGreaterThan(50);
    const missing = files.flatMap((f) =>
      importsOf(f)
        .filter((p) => !production.has(p))
        .map((p) => `${f}: ${p}`),
    );
    expect(missing).toEqual([]);
  });

  it('the deployment still installs with a plain npm ci: every package it imports is a declared dependency', () => {
    const declared = new Set([...Object.keys(pkg.dependencies), ...Object.keys(pkg.devDependencies)]);
    const files = [
      'providers/akamai/index.ts',
      'providers/kubernetes/runtime.ts',
      'providers/systemd/cloud-init.ts',
      'stacks/index.ts',
    ];
    const undeclared = files.flatMap((f) =>
      importsOf(f)
        .filter((p) => !declared.has(p))
        .map((p) => `${f}: ${p}`),
    );
    expect(undeclared).toEqual([]);
    expect(pkg.devDependencies['@pulumi/pulumi']).toBeDefined();
  });

  it('the image carries no test nor test fixture of the runtime', () => {
    const files = runtimeFiles();
    expect(files).toContain('runtime/gateway/http-proxy.ts');
    const fixtures = [
      'runtime/gateway/test-proxy.ts',
      'runtime/gateway/test-upstreams.ts',
      'runtime/guest/test-harness.ts',
    ];
    expect(files.filter((f) => fixtures.includes(f) || f.endsWith('.test.ts'))).toEqual([]);
  });

  it('packageOf names the package of a specifier', () => {
    expect(packageOf('@pulumi/pulumi/dynamic')).toBe('@pulumi/pulumi');
    expect(packageOf('fastify')).toBe('fastify');
    expect(packageOf('@sinclair/typebox/value')).toBe('@sinclair/typebox');
    expect(packageOf('node:fs')).toBeNull();
    expect(packageOf('./x.ts')).toBeNull();
  });
});
