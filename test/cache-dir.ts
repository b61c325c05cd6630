/**
 * The one template/image cache every test suite and benchmark uses (a template build takes about a
 * minute, VM images more; reruns reuse them): `SPACE_TEST_CACHE_DIR`, default `/var/lib/space` —
 * the agent's own default, so `npm start` and the tests share builds. No other variable names it.
 */
export const TEST_CACHE_DIR = process.env['SPACE_TEST_CACHE_DIR'] ?? '/var/lib/space';
