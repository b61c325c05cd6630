/** Who commands run as: the sandbox's unprivileged user and root, read from /etc/passwd. */

import { readFileSync } from 'node:fs';

/** One account a process may run as. */
export interface Identity {
  name: string;
  uid: number;
  gid: number;
  home: string;
  shell: string;
}

/** Parses /etc/passwd-formatted text into accounts keyed by name. */
export function parsePasswd(text: string): Map<string, Identity> {
  const users = new Map<string, Identity>();
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const [name, , uid, gid, , home, shell] = line.split(':');
    if (!name || uid === undefined || gid === undefined) continue;
    const u = Number(uid);
    const g = Number(gid);
    if (!Number.isInteger(u) || !Number.isInteger(g)) continue;
    users.set(name, { name, uid: u, gid: g, home: home || '/', shell: shell || '/bin/sh' });
  }
  return users;
}

/** Reads /etc/passwd (empty map when it cannot be read). */
export function readPasswd(file = '/etc/passwd'): Map<string, Identity> {
  try {
    return parsePasswd(readFileSync(file, 'utf8'));
  } catch {
    return new Map();
  }
}
