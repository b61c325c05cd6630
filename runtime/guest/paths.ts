/**
 * Sandbox path rules for the file API: absolute or relative to the user's home; no NUL bytes, no `..`
 * segment, at most {@link MAX_PATH_BYTES} bytes and {@link MAX_NAME_BYTES} per component, and nothing
 * under the platform-owned locations {@link PLATFORM_PATHS}. Otherwise names are arbitrary UTF-8.
 */

import { realpath } from 'node:fs/promises';
import { posix } from 'node:path';
import { SpaceError } from '../core/errors.ts';

/** Longest accepted path (bytes, UTF-8), as Linux PATH_MAX. */
export const MAX_PATH_BYTES = 4096;
/** Longest accepted path component (bytes, UTF-8), as Linux NAME_MAX. */
export const MAX_NAME_BYTES = 255;
/** Locations owned by the platform: the file API refuses them and everything under them. */
export const PLATFORM_PATHS: readonly string[] = ['/proc', '/sys', '/dev', '/opt/space'];

function invalid(message: string, path?: string): SpaceError {
  return new SpaceError('PATH_INVALID', message, path === undefined ? undefined : { path });
}

/** True when `abs` (normalized, absolute) is a platform-owned location or under one. */
export function isPlatformOwned(abs: string): boolean {
  return PLATFORM_PATHS.some((p) => abs === p || abs.startsWith(p + '/'));
}

/**
 * Checks `input` and returns the normalized absolute path (lexically; symlinks are checked by
 * {@link realTarget}). Throws PATH_INVALID.
 */
export function resolveSandboxPath(input: unknown, home: string): string {
  if (typeof input !== 'string' || input === '') throw invalid('path is required');
  if (input.includes('\0')) throw invalid('path contains a nul byte');
  if (Buffer.byteLength(input) > MAX_PATH_BYTES) throw invalid(`path is longer than ${MAX_PATH_BYTES} bytes`);
  for (const segment of input.split('/')) {
    if (segment === '..') throw invalid('path must not contain a ".." segment', input);
    if (Buffer.byteLength(segment) > MAX_NAME_BYTES) {
      throw invalid(`a path component is longer than ${MAX_NAME_BYTES} bytes`, input);
    }
  }
  const abs = posix.resolve(home, input);
  if (Buffer.byteLength(abs) > MAX_PATH_BYTES) throw invalid(`path is longer than ${MAX_PATH_BYTES} bytes`);
  if (isPlatformOwned(abs)) throw invalid('path is in a platform-owned location', abs);
  return abs;
}

/**
 * The real location `abs` refers to: symlinks in its existing part resolved (the last component too
 * when `followFinal`), the missing rest appended. Refuses targets that land in a platform-owned place.
 */
export async function realTarget(abs: string, followFinal: boolean): Promise<string> {
  let head = followFinal ? abs : posix.dirname(abs);
  const tail: string[] = followFinal ? [] : [posix.basename(abs)];
  for (;;) {
    try {
      const real = posix.join(await realpath(head), ...tail);
      if (isPlatformOwned(real)) throw invalid('path resolves into a platform-owned location', abs);
      return real;
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if ((code !== 'ENOENT' && code !== 'ENOTDIR') || head === '/') {
        if (err instanceof SpaceError) throw err;
        if (code === 'ELOOP') throw invalid('too many levels of symbolic links', abs);
        if (code === 'ENOENT' || code === 'ENOTDIR') return abs;
        throw err;
      }
      tail.unshift(posix.basename(head));
      head = posix.dirname(head);
    }
  }
}
