/**
 * How every driver learns that an instance's guest daemon is up: `GET /health` on the guest port
 * at the sandbox's address (the same path for a gVisor sandbox and a microVM behind its tap).
 */
import { request } from 'node:http';
import { GUEST_PORT } from '../../core/guest-protocol.ts';

/**
 * Polls `GET http://<host>:GUEST_PORT/health` until it answers 2xx. Every ~500 ms asks `alive()` (when given)
 * and gives up early when it says false (the container stopped).
 * @throws Error on timeout or when the container died.
 */
export async function waitForHealth(
  host: string,
  timeoutMs: number,
  alive?: () => Promise<boolean>,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last = 'no answer';
  let nextAliveCheck = Date.now() + 500;
  while (Date.now() < deadline) {
    if (alive && Date.now() >= nextAliveCheck) {
      if (!(await alive())) throw new Error('the sandbox stopped before its guest answered /health');
      nextAliveCheck = Date.now() + 500;
    }
    const status = await httpStatus(host, GUEST_PORT, '/health', 1000).catch((e: Error) => {
      last = e.message;
      return 0;
    });
    if (status >= 200 && status < 300) return;
    if (status) last = `HTTP ${status}`;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`guest did not answer /health on ${host}:${GUEST_PORT} within ${timeoutMs} ms (${last})`);
}

/** Status code of one GET; rejects on connection errors or after `timeoutMs`. */
export function httpStatus(host: string, port: number, path: string, timeoutMs: number): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = request({ host, port, path, method: 'GET', timeout: timeoutMs, agent: false }, (res) => {
      res.resume();
      resolve(res.statusCode ?? 0);
    });
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', reject);
    req.end();
  });
}
