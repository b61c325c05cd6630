/**
 * Small host helpers for the deployment rehearsal: run a command and fail with its stderr, and the
 * rehearsal's fixed addresses. Root only (namespaces, taps, debootstrap).
 */
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';

const execFileP = promisify(execFile);

/**
 * Runs `cmd args` and returns its stdout. Throws an Error naming the command, its exit status and
 * the last 2,000 characters of its stderr. `timeoutMs` kills it (SIGKILL) when exceeded.
 */
export async function run(
  cmd: string,
  args: readonly string[],
  opts: { timeoutMs?: number; env?: NodeJS.ProcessEnv; cwd?: string } = {},
): Promise<string> {
  try {
    const { stdout } = await execFileP(cmd, [...args], {
      maxBuffer: 64 * 1024 * 1024,
      timeout: opts.timeoutMs ?? 600_000,
      killSignal: 'SIGKILL',
      env: opts.env ?? process.env,
      cwd: opts.cwd,
    });
    return stdout;
  } catch (err) {
    const e = err as { stderr?: string; code?: unknown; signal?: unknown };
    throw new Error(
      `${cmd} ${args.join(' ')} failed (${e.signal ? `signal ${e.signal}` : `status ${e.code}`}): ${String(e.stderr ?? '').slice(-2000)}`,
    );
  }
}

/**
 * The rehearsal's addresses. The VMs share one bridge in a network namespace the rehearsal makes
 * (the cloud's private network, `PRIVATE_CIDR`); a veth pair joins that namespace to the host, whose
 * end (`HOST_ADDRESS`) serves the registry, the apt cache and the load-balancer stand-in. Nothing
 * routes further: the VMs reach the host and each other, nothing else.
 */
export const REHEARSAL_NET = {
  /** Network namespace holding the bridge and the VMs' taps. */
  namespace: 'space-rehearse',
  bridge: 'rh-br0',
  /** The cloud's private network (the stacks' `space:privateCidr`). */
  privateCidr: '10.88.0.0/24',
  /** The bridge's own address inside the namespace: the VMs' default gateway. */
  gateway: '10.88.0.1',
  /** The host end of the veth pair: registry, apt cache and load balancer listen here. */
  hostAddress: '10.88.1.1',
  /** The namespace end of the veth pair. */
  namespaceAddress: '10.88.1.2',
  /** Registry port (TLS, basic auth). */
  registryPort: 5443,
  /** apt-cacher-ng port. */
  aptCachePort: 3142,
} as const;
