import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import {
  CliError,
  collectKeyValue,
  exitCodeOf,
  formatBytes,
  formatError,
  formatMode,
  formatRelative,
  metadataQuery,
  parseKeyValue,
  parsePositiveInt,
  table,
} from './output.ts';

describe('parseKeyValue', () => {
  it('splits at the first =', () => {
    expect(parseKeyValue('a=b=c')).toEqual(['a', 'b=c']);
    expect(parseKeyValue('EMPTY=')).toEqual(['EMPTY', '']);
  });
  it('rejects pairs without a key as usage errors', () => {
    for (const bad of ['novalue', '=x', '']) {
      expect(() => parseKeyValue(bad, '--env')).toThrowError(CliError);
      try {
        parseKeyValue(bad);
      } catch (err) {
        expect((err as CliError).exitCode).toBe(125);
      }
    }
  });
});

describe('r26 repeated K=V options', () => {
  it('keep different keys and refuse one key with two values (never silently the last)', () => {
    const add = collectKeyValue('--metadata');
    expect(add('team=x', add('role=a', undefined))).toEqual({ role: 'a', team: 'x' });
    expect(add('role=a', { role: 'a' })).toEqual({ role: 'a' });
    expect(() => add('role=b', { role: 'a' })).toThrowError(/role twice/);
  });
  it('`space sandbox ls -m role=a -m role=b` is a usage error (exit 125) before any request', async () => {
    const cli = fileURLToPath(new URL('./space.ts', import.meta.url));
    const run = promisify(execFile);
    const err = await run(process.execPath, [cli, 'sandbox', 'ls', '-m', 'role=a', '-m', 'role=b'], {
      // nothing listens there: a request would fail otherwise than with the usage error
      env: { ...process.env, SPACE_API_URL: 'http://127.0.0.1:9', SPACE_API_KEY: 'space_x' },
    }).then(
      () => null,
      (e: { code: number; stderr: string }) => e,
    );
    expect(err?.code).toBe(125);
    expect(err?.stderr).toMatch(/--metadata gives role twice/);
  });
});

describe('parsePositiveInt', () => {
  it('accepts digits only', () => {
    expect(parsePositiveInt('--x')('42')).toBe(42);
    expect(() => parsePositiveInt('--x')('0')).toThrow(/positive integer/);
    expect(() => parsePositiveInt('--x')('1.5')).toThrow();
    expect(() => parsePositiveInt('--x')('-3')).toThrow();
  });
});

describe('exitCodeOf', () => {
  it('maps exits like a shell', () => {
    expect(exitCodeOf({ exitCode: 3, signal: null, timedOut: false })).toBe(3);
    expect(exitCodeOf({ exitCode: 0, signal: null, timedOut: false })).toBe(0);
    expect(exitCodeOf({ exitCode: null, signal: 'SIGKILL', timedOut: false })).toBe(137);
    expect(exitCodeOf({ exitCode: null, signal: 'SIGINT', timedOut: false })).toBe(130);
    expect(exitCodeOf({ exitCode: null, signal: 'SIGKILL', timedOut: true })).toBe(124);
    expect(exitCodeOf({ exitCode: 127, signal: null, timedOut: false, error: 'x: command not found' })).toBe(
      127,
    );
    // no exit code and no signal: the CLI could not tell, which is its own failure, never a 1
    expect(exitCodeOf({ exitCode: null, signal: null, timedOut: false })).toBe(125);
  });
});

describe('formatting', () => {
  it('renders aligned tables without trailing spaces', () => {
    expect(
      table(
        ['ID', 'STATE'],
        [
          ['sbx_1', 'running'],
          ['sbx_long', 'killed'],
        ],
      ),
    ).toBe('ID        STATE\nsbx_1     running\nsbx_long  killed');
  });
  it('formats bytes, modes and times', () => {
    expect(formatBytes(512)).toBe('512 B');
    expect(formatBytes(1536)).toBe('1.5 KiB');
    expect(formatBytes(20 * 1024 * 1024)).toBe('20.0 MiB');
    expect(formatMode('dir', 0o755)).toBe('drwxr-xr-x');
    expect(formatMode('file', 0o640)).toBe('-rw-r-----');
    const now = Date.parse('2025-01-01T00:10:00Z');
    expect(formatRelative('2025-01-01T00:09:55Z', now)).toBe('5s ago');
    expect(formatRelative('2025-01-01T00:15:00Z', now)).toBe('in 5m');
    expect(formatRelative('2024-12-31T22:10:00Z', now)).toBe('2h ago');
  });
  it('encodes metadata filters as the API expects', () => {
    expect(metadataQuery({ team: 'a', 'x y': 'b&c' })).toBe('team=a&x+y=b%26c');
  });
  it('formats errors as "error CODE: message"', () => {
    expect(formatError(new CliError('SANDBOX_NOT_FOUND', 'no sandbox sbx_1'))).toBe(
      'error SANDBOX_NOT_FOUND: no sandbox sbx_1',
    );
    expect(new CliError('X', 'y', { details: { a: 1 } }).toBody()).toEqual({
      error: { code: 'X', message: 'y', details: { a: 1 } },
    });
  });
});

describe('exec --json bytes (R17)', () => {
  it('keeps valid UTF-8 as text and carries anything else as base64, byte for byte', async () => {
    const { exactText } = await import('./exec.ts');
    expect(exactText('stdout', Buffer.from('héllo\n'))).toEqual({
      stdout: 'héllo\n',
      stdoutEncoding: 'utf8',
    });
    const raw = Buffer.from([0xff, 0xfe, 0x41]);
    const enc = exactText('stdout', raw);
    expect(enc).toEqual({ stdout: '//5B', stdoutEncoding: 'base64' });
    expect(Buffer.from(enc.stdout, 'base64').equals(raw)).toBe(true);
    expect(exactText('stderr', Buffer.alloc(0))).toEqual({ stderr: '', stderrEncoding: 'utf8' });
  });
});
