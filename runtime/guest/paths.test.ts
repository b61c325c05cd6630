import { describe, expect, it } from 'vitest';
import { SpaceError } from '../core/errors.ts';
import { FRAME_EXIT, FRAME_STDOUT } from '../core/guest-protocol.ts';
import { encodeFrame, FrameDecoder } from './output.ts';
import { isPlatformOwned, resolveSandboxPath } from './paths.ts';
import { parsePasswd } from './users.ts';

describe('guest paths', () => {
  it('resolves relative paths against home and keeps odd names', () => {
    expect(resolveSandboxPath('a/b', '/home/user')).toBe('/home/user/a/b');
    expect(resolveSandboxPath('./x%2Fy', '/home/user')).toBe('/home/user/x%2Fy');
    expect(resolveSandboxPath('/tmp//z/', '/home/user')).toBe('/tmp/z');
    expect(resolveSandboxPath('-rf', '/home/user')).toBe('/home/user/-rf');
  });

  it('refuses nul, .., long paths and names, and platform paths', () => {
    for (const p of [
      'a\0',
      '..',
      'a/../b',
      'x'.repeat(256),
      `/${'a/'.repeat(2049)}`,
      '/proc',
      '/dev/x',
      '/opt/space',
    ]) {
      expect(() => resolveSandboxPath(p, '/home/user')).toThrow(SpaceError);
    }
    expect(isPlatformOwned('/process')).toBe(false);
    expect(isPlatformOwned('/opt/spacex')).toBe(false);
    expect(isPlatformOwned('/sys')).toBe(true);
  });
});

describe('guest frames and passwd', () => {
  it('encodes and decodes frames across arbitrary splits', () => {
    const bytes = Buffer.concat([
      encodeFrame(FRAME_STDOUT, Buffer.from('hello')),
      encodeFrame(FRAME_EXIT, Buffer.from('{}')),
    ]);
    const d = new FrameDecoder();
    const frames = [...bytes].flatMap((b) => d.push(Buffer.from([b])));
    expect(frames.map((f) => [f.type, f.payload.toString()])).toEqual([
      [1, 'hello'],
      [3, '{}'],
    ]);
  });

  it('parses /etc/passwd', () => {
    const users = parsePasswd('root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n');
    expect(users.get('user')).toEqual({
      name: 'user',
      uid: 1000,
      gid: 1000,
      home: '/home/user',
      shell: '/bin/bash',
    });
  });
});
