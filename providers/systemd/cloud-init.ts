/**
 * The "without Kubernetes" path: what a plain VM needs to run SPACE as systemd units, rendered as
 * cloud-init (`#cloud-config`, Linode metadata) or as a shell script (Crusoe `startup_script`).
 *
 * Two roles: `control` (Redis + API) and `agent` (one per pool node, with its egress gateway unless
 * disabled). Each service runs the one image (`space:imageRepository:space:version`) under podman
 * with the same environment as in Kubernetes (`runtime-settings.ts`).
 *
 * One secret is rendered here, the Redis password, because user data is the only channel into a
 * new VM: it goes only into root-only files (mode 0600: the Redis URL file every unit reads, the
 * password file for redis-cli, redis.conf), and the stacks pass the user data as a Pulumi secret.
 * User data stays readable by whoever can read the instance's metadata (the cloud API, the
 * metadata service from the VM itself; docs/security.md). Nothing else secret is: the control VM
 * makes its own Ed25519 key pair at first boot (the private key never leaves it) and publishes
 * the public key in Redis, where agents read it; Redis asks for the password and listens on
 * loopback and the private address only, closed to everything but the VPC by the cloud firewall
 * and by nftables on the control VM. The API writes the first API key to
 * `BOOTSTRAP_API_KEY_FILE` on the control VM.
 *
 * The gateway's CA is generated on each agent VM, by the gateway at its first start (ECDSA P-256,
 * key mode 0600 in a 0700 root directory): a CA key cannot travel in user data, and the only
 * channel from the control VM is Redis, which every node can read. So in vm
 * mode the "per-deployment" CA is per node: a sandbox only ever talks to its own node's gateway and
 * trusts that node's certificate (the agent mounts only `ca.crt`); a leaked key exposes one node.
 * The gateway's ports are closed to everything but sandbox interfaces by an nftables table applied
 * at every boot before the gateway starts.
 *
 * Each service renders in its own module: control.ts (Redis, API, router, ACME TLS: redis.ts,
 * api.ts, router.ts, acme.ts), agent.ts (the agent, with gateway.ts), the shared plan pieces in
 * plan.ts, the timers that follow the deployment in sync.ts, and the output forms in render.ts.
 * This module is their public face.
 */
import { AGENT_PORT, API_PORT, GATEWAY_PORTS, ROUTER_PORT } from '../runtime-settings.ts';

export { agentPlan, agentService, agentServiceEnv } from './agent.ts';
export { controlPlan, controlServiceEnv } from './control.ts';
export {
  type AcmeArgs,
  type AgentArgs,
  type ControlArgs,
  LETS_ENCRYPT_DIRECTORY,
  REDIS_PASSWORD,
  VERIFY_KEY_REDIS_KEY,
  type VmCommonArgs,
  type VmFile,
  type VmPlan,
  type VmServiceEnv,
} from './plan.ts';
export { PROVISIONED_MARKER, toCloudConfig, toShellScript } from './render.ts';

/** Every port a role serves clients on (for the firewall tests): API and router on control, none on agents. */
export const PUBLIC_PORTS = { control: [API_PORT, ROUTER_PORT], agent: [] } as const;
/** Ports an agent VM serves inside the private network only (dispatch and router forwarding). */
export const PRIVATE_PORTS = { agent: [AGENT_PORT] } as const;

/** Ports an agent VM listens on that only its sandboxes may reach (the gateway's). */
export const NODE_LOCAL_PORTS = Object.values(GATEWAY_PORTS);
