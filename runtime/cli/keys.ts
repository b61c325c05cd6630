/**
 * `space keys create|ls|revoke|rotate` and `space teams create|ls`: API keys and teams. A secret is
 * printed once, by the command that makes it (create, rotate); the API never shows it again.
 */
import type { Command } from 'commander';
import { ALL_SCOPES, isApiScope, QUOTA_NAMES, type TeamQuotas } from '../core/tenancy.ts';
import { apiClient, isJson } from './context.ts';
import {
  formatRelative,
  note,
  parseNonNegativeInt,
  parsePositiveInt,
  printJson,
  println,
  table,
  usageError,
} from './output.ts';

/** An API key as `GET /v1/keys` returns it. */
export interface ApiKeyView {
  id: string;
  name: string;
  team: string;
  scopes: string[];
  createdAt: string;
  expiresAt: string | null;
  lastUsedAt: string | null;
  rotatedTo: string | null;
}

/** A team as `GET /v1/teams` returns it. */
export interface TeamView {
  id: string;
  createdAt: string;
  quotaOverrides: Partial<TeamQuotas>;
  quotas: TeamQuotas;
}

/** Commander collector of repeatable `--scope` values; checks each against the scope table. Pure. */
export function collectScope(value: string, previous: string[] | undefined): string[] {
  const out = [...(previous ?? [])];
  for (const s of value
    .split(',')
    .map((x) => x.trim())
    .filter(Boolean)) {
    if (!isApiScope(s)) throw usageError(`unknown scope "${s}"; scopes: ${ALL_SCOPES.join(', ')}`);
    if (!out.includes(s)) out.push(s);
  }
  return out;
}

/** Commander collector of repeatable `--quota NAME=N` values. Pure. */
export function collectQuota(value: string, previous: Partial<TeamQuotas> | undefined): Partial<TeamQuotas> {
  const m = /^([A-Za-z]+)=(\d+)$/.exec(value.trim());
  const name = m?.[1] as keyof TeamQuotas | undefined;
  if (!m || !name || !(QUOTA_NAMES as readonly string[]).includes(name)) {
    throw usageError(`--quota takes NAME=N with NAME one of ${QUOTA_NAMES.join(', ')}; got "${value}"`);
  }
  return { ...(previous ?? {}), [name]: Number(m[2]) };
}

const never = (iso: string | null) => (iso ? formatRelative(iso) : '-');

function printSecret(key: ApiKeyView, secret: string, what: string): void {
  println(secret);
  note(`${what} ${key.id} (${key.name}) of team ${key.team}, scopes: ${key.scopes.join(' ') || '-'}`);
  note('the secret above is shown only now: store it');
}

export function registerKeys(program: Command): void {
  const k = program.command('keys').alias('key').description('API keys of a team (needs keys:admin)');
  k.command('create')
    .description('create an API key; prints its secret once')
    .requiredOption('--name <name>', 'what the key is for')
    .option('--team <id>', 'team of the key (default: your key’s; another needs teams:admin)')
    .option(
      '--scope <scope>',
      `scope to grant, repeatable or comma-separated (${ALL_SCOPES.join(', ')}); default: everyday scopes`,
      collectScope,
    )
    .option(
      '--expires-in <sec>',
      'lifetime in seconds (default: never expires)',
      parsePositiveInt('--expires-in'),
    )
    .addHelpText(
      'after',
      `
Examples:
  space keys create --name ci --team other                 # a key of team "other"
  space keys create --name ro --scope sandboxes:read --expires-in 86400 --json`,
    )
    .action(
      async (o: { name: string; team?: string; scope?: string[]; expiresIn?: number }, cmd: Command) => {
        const out = await apiClient(cmd).json<{ key: ApiKeyView; secret: string }>('POST', '/v1/keys', {
          body: {
            name: o.name,
            ...(o.team ? { team: o.team } : {}),
            ...(o.scope ? { scopes: o.scope } : {}),
            ...(o.expiresIn ? { expiresInSec: o.expiresIn } : {}),
          },
        });
        if (isJson(cmd)) return printJson(out);
        printSecret(out.key, out.secret, 'created');
      },
    );

  k.command('ls')
    .description('list the API keys of a team (never their secrets)')
    .option('--team <id>', 'team (default: your key’s; another needs teams:admin)')
    .action(async (o: { team?: string }, cmd: Command) => {
      const { keys } = await apiClient(cmd).json<{ keys: ApiKeyView[] }>('GET', '/v1/keys', {
        query: { team: o.team },
      });
      if (isJson(cmd)) return printJson({ keys });
      if (keys.length === 0) return println('no keys');
      println(
        table(
          ['ID', 'NAME', 'TEAM', 'SCOPES', 'CREATED', 'EXPIRES', 'LAST USED'],
          keys.map((x) => [
            x.id,
            x.name,
            x.team,
            x.scopes.join(' '),
            formatRelative(x.createdAt),
            x.expiresAt ? `${x.expiresAt}${x.rotatedTo ? ` (rotated to ${x.rotatedTo})` : ''}` : 'never',
            never(x.lastUsedAt),
          ]),
        ),
      );
    });

  k.command('revoke')
    .alias('rm')
    .description('revoke an API key: refused from the next request on')
    .argument('<id>', 'key id (from `space keys ls`)')
    .option('--team <id>', 'team of the key (default: your key’s)')
    .action(async (id: string, o: { team?: string }, cmd: Command) => {
      const view = await apiClient(cmd).json<ApiKeyView>('DELETE', `/v1/keys/${encodeURIComponent(id)}`, {
        query: { team: o.team },
      });
      if (isJson(cmd)) return printJson(view);
      println(`revoked ${view.id} (${view.name})`);
    });

  k.command('rotate')
    .description(
      'rotate an API key: prints its successor’s secret; the old key works for --overlap more seconds',
    )
    .argument('<id>', 'key id')
    .option('--team <id>', 'team of the key (default: your key’s)')
    .option(
      '--overlap <sec>',
      'seconds the old key keeps working (default: the API’s SPACE_KEY_ROTATION_OVERLAP_SEC)',
      parseNonNegativeInt('--overlap'),
    )
    .addHelpText('after', '\nExamples:\n  space keys rotate key_abc --overlap 600')
    .action(async (id: string, o: { team?: string; overlap?: number }, cmd: Command) => {
      const out = await apiClient(cmd).json<{ key: ApiKeyView; secret: string; previous: ApiKeyView }>(
        'POST',
        `/v1/keys/${encodeURIComponent(id)}/rotate`,
        { query: { team: o.team }, body: o.overlap === undefined ? {} : { overlapSec: o.overlap } },
      );
      if (isJson(cmd)) return printJson(out);
      printSecret(
        out.key,
        out.secret,
        `rotated ${out.previous.id} (works until ${out.previous.expiresAt}) to`,
      );
    });

  const t = program
    .command('teams')
    .alias('team')
    .description('teams: who owns sandboxes, credentials, usage (needs teams:admin)');
  t.command('create')
    .description('create a team; then `space keys create --team <id>` gives it a key')
    .argument('<id>', 'team id: lower-case letters, digits and -')
    .option(
      '--quota <name=n>',
      `quota override, repeatable (${QUOTA_NAMES.join(', ')}; 0 = unlimited)`,
      collectQuota,
    )
    .addHelpText('after', '\nExamples:\n  space teams create other --quota sandboxes=20 --quota vcpus=40')
    .action(async (id: string, o: { quota?: Partial<TeamQuotas> }, cmd: Command) => {
      const team = await apiClient(cmd).json<TeamView>('POST', '/v1/teams', {
        body: { id, ...(o.quota ? { quotas: o.quota } : {}) },
      });
      if (isJson(cmd)) return printJson(team);
      println(`created team ${team.id}`);
    });
  t.command('ls')
    .description('list teams and the quotas in force')
    .action(async (_o: unknown, cmd: Command) => {
      const { teams } = await apiClient(cmd).json<{ teams: TeamView[] }>('GET', '/v1/teams');
      if (isJson(cmd)) return printJson({ teams });
      println(
        table(
          ['ID', 'CREATED', ...QUOTA_NAMES.map((q) => q.toUpperCase())],
          teams.map((x) => [
            x.id,
            formatRelative(x.createdAt),
            ...QUOTA_NAMES.map((q) => `${x.quotas[q] || '∞'}${q in x.quotaOverrides ? '*' : ''}`),
          ]),
        ),
      );
    });
}
