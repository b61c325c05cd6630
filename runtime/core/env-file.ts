/**
 * The env-file format SPACE's VM units read (`podman run --env-file`, one `NAME=value` per line):
 * rendered in one place so that the files cloud-init writes at first boot and the files the
 * `space-config-sync` timer writes later from `PUT /v1/deployment/vm-config` (through
 * `core/vm-config.ts`) are byte-identical
 * for the same settings (a VM restarts a service only when its file really changes).
 */

/** What a variable name may look like (POSIX shell names, the form podman's env-file reads). */
export const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]{0,127}$/;
/** What a value may hold: printable text on one line (no control characters, so no newline). */
// biome-ignore lint/suspicious/noControlCharactersInRegex: the control characters are what it refuses
export const ENV_VALUE = /^[^\u0000-\u001f\u007f]*$/;

/** The names of `vars` in code-point order (locale-free): how env files and VM documents list them. Pure. */
export function sortedNames(vars: Readonly<Record<string, unknown>>): string[] {
  return Object.keys(vars).sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
}

/**
 * `vars` as an env file: `NAME=value` lines sorted by name (code-point order, locale-free), each
 * ending in `\n`. Pure. @throws Error naming the first variable whose name or value does not fit
 * {@link ENV_NAME} / {@link ENV_VALUE} (a newline in a value would smuggle in another variable).
 */
export function renderEnvFile(vars: Readonly<Record<string, string>>): string {
  const names = sortedNames(vars);
  for (const n of names) {
    if (!ENV_NAME.test(n)) throw new Error(`env file: ${JSON.stringify(n)} is not a variable name`);
    if (!ENV_VALUE.test(vars[n]!)) throw new Error(`env file: the value of ${n} holds a control character`);
  }
  return names.map((n) => `${n}=${vars[n]}\n`).join('');
}

/** The variables of an env file made by {@link renderEnvFile} (blank lines and `#` comments skipped). Pure. */
export function parseEnvFile(text: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const eq = line.indexOf('=');
    if (eq > 0) out[line.slice(0, eq)] = line.slice(eq + 1);
  }
  return out;
}
