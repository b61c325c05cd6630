/**
 * The diagram of docs/architecture.md ("Who imports whom") against the code: its nodes are
 * folders, `A --> B` means some non-test file under A imports a module under B. Every arrow must
 * exist in the code, and every import between two drawn folders must be drawn.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { importGraph, listFiles, parseMermaid, REPO_ROOT } from './docs-check.ts';

const page = readFileSync(join(REPO_ROOT, 'docs/architecture.md'), 'utf8');

describe('docs/architecture.md: the import diagram', () => {
  const { nodes, edges } = parseMermaid(page);
  const folders = [...nodes.values()];

  it('draws folders that exist, each once, with the services among them', () => {
    for (const f of folders) expect(listFiles(f).length, `${f} is a folder with files`).toBeGreaterThan(0);
    expect(new Set(folders).size, 'no folder drawn twice').toBe(folders.length);
    for (const s of ['api', 'agent', 'gateway', 'router', 'guest', 'cli', 'core']) {
      expect(folders, `the diagram draws runtime/${s}`).toContain(`runtime/${s}`);
    }
  });

  it('has exactly the imports between the folders it draws', () => {
    const drawn = new Set(edges.map(([a, b]) => `${nodes.get(a)} --> ${nodes.get(b)}`));
    const code = new Set(importGraph(folders));
    const notInCode = [...drawn].filter((e) => !code.has(e)).sort();
    const notDrawn = [...code].filter((e) => !drawn.has(e)).sort();
    expect(notInCode, 'arrows of the diagram that no import backs (remove them)').toEqual([]);
    expect(notDrawn, 'imports the diagram does not draw (add them, or fix the import)').toEqual([]);
  });
});

describe('the diagram parser and the import graph', () => {
  it('reads node labels and arrows, and refuses an arrow to an undeclared node', () => {
    const g = parseMermaid(
      'x\n```mermaid\nflowchart TD\n  a["runtime/a"]\n  b[runtime/b] %% note\n  a --> b\n```\n',
    );
    expect([...g.nodes]).toEqual([
      ['a', 'runtime/a'],
      ['b', 'runtime/b'],
    ]);
    expect(g.edges).toEqual([['a', 'b']]);
    expect(() => parseMermaid('```mermaid\nflowchart LR\n  a["x"]\n  a --> c\n```\n')).toThrow(
      /undeclared node c/,
    );
    expect(() => parseMermaid('no diagram')).toThrow(/no ```mermaid/);
  });

  it('finds a known import and gives each file to its deepest drawn folder', () => {
    const g = importGraph(['runtime/agent', 'runtime/agent/drivers', 'runtime/core']);
    expect(g).toContain('runtime/agent/drivers --> runtime/core');
    expect(g).toContain('runtime/agent --> runtime/agent/drivers');
    expect(g).not.toContain('runtime/agent --> runtime/agent');
  });
});
