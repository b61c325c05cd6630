#!/usr/bin/env node
/**
 * `node runtime/cli/vm-config-apply.ts <policy.json> <service>`: the check a VM's
 * `space-config-sync` runs (from the SPACE image, `podman run --network none`) on a service's VM
 * configuration before it touches an env file. Reads the service's document (JSON, as stored in
 * Redis) on stdin and the VM's policy from the file (runtime/core/vm-config.ts); prints the env
 * file on stdout. Exit status: 0 printed; 2 the document is refused (each problem on stderr,
 * nothing on stdout); 1 bad usage or policy.
 */
import { readFileSync } from 'node:fs';
import { parseVmConfigPolicy, vmServiceEnv } from '../core/vm-config.ts';

const [policyFile, service] = process.argv.slice(2);
if (!policyFile || !service) {
  process.stderr.write('usage: vm-config-apply <policy.json> <service>  (document on stdin)\n');
  process.exit(1);
}
let policy: ReturnType<typeof parseVmConfigPolicy>;
try {
  policy = parseVmConfigPolicy(readFileSync(policyFile, 'utf8'));
} catch (err) {
  process.stderr.write(`vm-config-apply: ${(err as Error).message}\n`);
  process.exit(1);
}
const entry = policy.services.find((s) => s.service === service);
if (!entry) {
  process.stderr.write(`vm-config-apply: ${service} is not a service of this VM\n`);
  process.exit(1);
}
const r = vmServiceEnv(entry, readFileSync(0, 'utf8'));
if (!r.ok) {
  for (const p of r.problems) process.stderr.write(`vm-config-apply: refused: ${p}\n`);
  process.exit(2);
}
process.stdout.write(r.env);
