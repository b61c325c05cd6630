/**
 * The docs check: every relative link of the repository's Markdown pages reaches its file and
 * heading, and no code comment cites a path the repository does not have. The matchers are
 * checked on small fixture trees first, so a check that passes is one that can fail.
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import {
  anchors,
  brokenCitations,
  brokenLinks,
  citedPaths,
  comments,
  listFiles,
  REPO_ROOT,
  repoIndex,
  resolves,
  slug,
} from './docs-check.ts';

const fixtures: string[] = [];
afterAll(() => {
  for (const d of fixtures) rmSync(d, { recursive: true, force: true });
});

/** A throwaway repository root holding `files` (path → text). */
function tree(files: Record<string, string>): string {
  const root = mkdtempSync(join(tmpdir(), 'space-docs-check-'));
  fixtures.push(root);
  for (const [p, text] of Object.entries(files)) {
    mkdirSync(dirname(join(root, p)), { recursive: true });
    writeFileSync(join(root, p), text);
  }
  return root;
}

describe('links: the matcher', () => {
  it('makes GitHub heading anchors, repeats numbered', () => {
    expect(slug('Per-cloud `pulumi up`')).toBe('per-cloud-pulumi-up');
    expect(slug('Faults: what clients see, and recovery')).toBe('faults-what-clients-see-and-recovery');
    expect(slug('SPACE_API_PORT and [links](x.md)')).toBe('space_api_port-and-links');
    expect([...anchors('# A\n## B b\n## B b\n```sh\n# not a heading\n```\n')]).toEqual(['a', 'b-b', 'b-b-1']);
  });

  it('flags a missing file, a missing anchor and a way out of the repository; not code or URLs', () => {
    const root = tree({
      'README.md': [
        '# Top',
        '[ok](docs/a.md) [ok anchor](docs/a.md#the-part) [self](#top) [web](https://example.com/x.md)',
        '[gone](docs/none.md) [bad anchor](docs/a.md#nope) [out](../shared/DESIGN.md)',
        '`[in code](nowhere.md)`',
        '```md',
        '[in a fence](nowhere.md)',
        '```',
        '[source line](runtime/x.ts#L3)',
      ].join('\n'),
      'docs/a.md': '# A\n\n## The part\n\n[back](../README.md#top)\n',
      'runtime/x.ts': 'export {};\n',
    });
    expect(brokenLinks('README.md', root)).toEqual([
      'README.md:3: docs/none.md (no such file: docs/none.md)',
      'README.md:3: docs/a.md#nope (no heading #nope in docs/a.md)',
      'README.md:3: ../shared/DESIGN.md (outside the repository)',
    ]);
    expect(brokenLinks('docs/a.md', root)).toEqual([]);
  });
});

describe('comment citations: the matcher', () => {
  const root = tree({
    'runtime/gateway/DESIGN.md': '# Gateway\n',
    'runtime/gateway/a.ts': '',
    'runtime/core/config.ts': '',
    'runtime/api/config.ts': '',
    'docs/egress.md': '# Egress\n',
    'README.md': '# R\n',
    '.gitignore': 'node_modules/\nbenchmarks/results/\n',
    'node_modules/undici/package.json': '{}',
  });
  const index = repoIndex(root);
  const check = (file: string, comment: string): string[] =>
    citedPaths(comment, root).filter((p) => !resolves(file, p, index));

  it('reads comments, not strings or code', () => {
    const ts = [
      '// one: ../shared/DESIGN.md',
      "const s = '// not a comment: e2b-protocol.md';",
      '/** two: STYLE.md */ const r = /\\/\\/ nor this/;',
      // a template literal with a substitution: `${1} // …` is still the string's text
      'const t = `$' + '{1} // nor machine-notes.md`; // three: cases/faults.md',
    ].join('\n');
    expect(comments('x.ts', ts).map((c) => c.text.trim())).toEqual([
      '// one: ../shared/DESIGN.md',
      '/** two: STYLE.md */',
      '// three: cases/faults.md',
    ]);
    expect(
      comments('x.sh', '#!/bin/sh\necho "$#" # see reference/egress.md\n# two\n').map((c) => c.text.trim()),
    ).toEqual(['see reference/egress.md', 'two']);
  });

  it('flags paths the repository does not have', () => {
    expect(
      check('runtime/core/a.ts', 'see ../shared/DESIGN.md and shared/reference/e2b-protocol.md §3'),
    ).toEqual(['../shared/DESIGN.md', 'shared/reference/e2b-protocol.md']);
    expect(
      check('runtime/core/a.ts', '(DESIGN.md "Credentials", egress.md §0, reference/*.md, STYLE.md)'),
    ).toEqual(['DESIGN.md', 'egress.md', 'reference/*.md', 'STYLE.md']);
    expect(check('test/x.ts', 'the map (docs/architecture.md), runtime/core/nope.ts')).toEqual([
      'docs/architecture.md',
      'runtime/core/nope.ts',
    ]);
  });

  it('accepts what exists, by folder, by tail, by glob, or generated', () => {
    expect(check('runtime/gateway/a.ts', 'DESIGN.md "Credentials"; docs/egress.md; README.md')).toEqual([]);
    expect(check('test/x.ts', 'core/config.ts, runtime/*/config.ts, ./a.ts, config.ts')).toEqual([]);
    expect(check('runtime/cli/b.ts', 'writes benchmarks/results/<command>/ and table.md')).toEqual([]);
  });

  it('leaves URLs, packages, absolute paths, templates and prose alone', () => {
    const prose = [
      'https://github.com/e2b-dev/e2b/blob/main/x.md docs.coreweave.com/products/cks/x',
      'node:fs/promises @pulumi/pulumi undici/lib/x.ts /proc/self/stat ~/.space/api-key $HOME/x.md',
      'stacks/Pulumi.<stack>.yaml runtime/<service>/config.ts read/write TCP/53 application/json 1/2',
      'the `.ts` files, a 2.14.1 SDK',
    ].join('\n');
    expect(check('runtime/core/a.ts', prose)).toEqual([]);
  });
});

describe('the repository', () => {
  it('every relative link of its Markdown pages reaches its file and heading', () => {
    const pages = listFiles('.').filter((f) => f.endsWith('.md'));
    expect(pages).toContain('README.md');
    expect(pages.length).toBeGreaterThan(5);
    expect(pages.flatMap((p) => brokenLinks(p))).toEqual([]);
  });

  it('no code comment cites a path the repository does not have', { timeout: 60_000 }, () => {
    expect(
      brokenCitations(),
      'comments citing paths that do not exist (cite a docs/ page or the upstream URL)',
    ).toEqual([]);
  });

  it('is the tree this check reads', () => {
    expect(listFiles('scripts', REPO_ROOT)).toContain('scripts/docs-check.ts');
  });
});
