/**
 * Regenerates the docs' tables from the code (`npm run docs`): the error table in docs/api.md and
 * the configuration tables in docs/configuration.md. The tables sit between
 * `<!-- generated:<name> -->` and `<!-- /generated:<name> -->` markers;
 * `runtime/core/docs.test.ts` fails when they are out of date.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { agentSettings } from '../runtime/agent/config.ts';
import { apiSettings } from '../runtime/api/config.ts';
import { backupSettings } from '../runtime/cli/backup-config.ts';
import { describeConfig, type SettingsSpec } from '../runtime/core/config.ts';
import { ERROR_CODES } from '../runtime/core/errors.ts';
import { gatewaySettings } from '../runtime/gateway/config.ts';
import { routerSettings } from '../runtime/router/config.ts';

/** Settings whose default is read from the host at start (shown as such, not as this machine's value). */
const HOST_DEFAULTS = new Set(['SPACE_NODE_ID', 'SPACE_NODE_VCPUS', 'SPACE_NODE_MEMORY_MIB']);

export function errorTable(): string {
  const rows = Object.entries(ERROR_CODES).map(
    ([code, s]) => `| \`${code}\` | ${s.status} | ${s.retryable ? 'yes' : 'no'} | ${s.doc} |`,
  );
  return ['| code | HTTP | retryable | meaning |', '|---|---|---|---|', ...rows].join('\n');
}

export function configTable(spec: SettingsSpec): string {
  const rows = describeConfig(spec).map(
    (r) => `| \`${r.env}\` | ${HOST_DEFAULTS.has(r.env) ? '(from the host)' : r.default} | ${r.doc} |`,
  );
  return ['| variable | default | meaning |', '|---|---|---|', ...rows].join('\n');
}

/** Every generated block, by marker name. */
export function generatedBlocks(): Record<string, string> {
  return {
    errors: errorTable(),
    'config-api': configTable(apiSettings),
    'config-agent': configTable(agentSettings),
    'config-gateway': configTable(gatewaySettings),
    'config-router': configTable(routerSettings),
    'config-backup': configTable(backupSettings),
  };
}

/** Which docs page (path from the repository root) holds each generated block. */
export const GENERATED_PAGES: Record<string, readonly string[]> = {
  'docs/api.md': ['errors'],
  'docs/configuration.md': ['config-api', 'config-agent', 'config-gateway', 'config-router', 'config-backup'],
};

/** `text` with every marked block replaced by its generated content. */
export function fill(text: string, blocks: Record<string, string>): string {
  let out = text;
  for (const [name, body] of Object.entries(blocks)) {
    const re = new RegExp(`(<!-- generated:${name} -->)[\\s\\S]*?(<!-- /generated:${name} -->)`);
    out = out.replace(re, (_m, open: string, close: string) => `${open}\n${body}\n${close}`);
  }
  return out;
}

if (import.meta.main) {
  const blocks = generatedBlocks();
  for (const page of Object.keys(GENERATED_PAGES)) {
    const path = new URL(`../${page}`, import.meta.url);
    const before = readFileSync(path, 'utf8');
    const after = fill(before, blocks);
    writeFileSync(path, after);
    console.log(`${page}: ${after === before ? 'tables already current' : 'tables regenerated'}`);
  }
}
