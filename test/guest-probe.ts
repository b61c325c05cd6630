/** Test helper: does a sandbox's guest answer right now, hang (paused), or refuse? */
import { connect } from 'node:net';
import { GUEST_PORT } from '../runtime/core/guest-protocol.ts';

/**
 * Sends one raw `GET /health` to the guest at `host`. Resolves `'data'` when it answered within
 * `ms`, `'timeout'` when it hung (a paused sandbox), `'error'` when the connection failed.
 */
export function probe(host: string, ms: number): Promise<'data' | 'timeout' | 'error'> {
  return new Promise((resolve) => {
    const s = connect(GUEST_PORT, host);
    const t = setTimeout(() => {
      s.destroy();
      resolve('timeout');
    }, ms);
    s.on('connect', () => s.write('GET /health HTTP/1.0\r\n\r\n'));
    s.on('data', () => {
      clearTimeout(t);
      s.destroy();
      resolve('data');
    });
    s.on('error', () => {
      clearTimeout(t);
      resolve('error');
    });
  });
}
