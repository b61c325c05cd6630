/** The README's error and config tables list exactly what the code declares (both ways). */
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { agentSettings } from '../agent/config.ts';
import { apiSettings } from '../api/config.ts';
import { ERROR_CODES } from './errors.ts';

const readme = readFileSync(new URL('../../README.md', import.meta.url), 'utf8');

function section(title: string): string {
  const start = readme.indexOf(`## ${title}`);
  expect(start, `README has a "## ${title}" section`).toBeGreaterThanOrEqual(0);
  const end = readme.indexOf('\n## ', start + 3);
  return readme.slice(start, end === -1 ? undefined : end);
}

describe('README stays in step with the code', () => {
  it('has one error-table row per error code, with its status, and no other', () => {
    const rows = [...section('Errors').matchAll(/^\| `([A-Z_]+)`\s*\|\s*(\d{3})\s*\|/gm)].map((m) => [
      m[1],
      Number(m[2]),
    ]);
    const declared = Object.entries(ERROR_CODES).map(([code, spec]) => [code, spec.status]);
    expect(rows.sort()).toEqual(declared.sort());
  });

  it('documents every setting of every service, and no other', () => {
    const documented = [...section('Configuration').matchAll(/^\| `(SPACE_[A-Z0-9_]+)`\s*\|/gm)].map(
      (m) => m[1],
    );
    const declared = [...Object.values(apiSettings), ...Object.values(agentSettings)].map((s) => s.env);
    expect([...new Set(documented)].sort()).toEqual([...new Set(declared)].sort());
  });
});
