/**
 * Test fixture: the VM plans the systemd tests render (one pool, one control VM), and small
 * readers of a plan's files. Not shipped (`test-*.ts`).
 */
import type { NodePool } from '../node-pool.ts';
import { agentPlan, controlPlan, type VmPlan } from './cloud-init.ts';

export const pool: NodePool = {
  name: 'default',
  driver: 'cloud-hypervisor',
  instanceType: 'c1a.8x',
  count: 2,
  labels: {},
  allowUnverifiedKvm: false,
};
/** The Redis password of the VMs rendered here (a test value: 16+ URL-unreserved characters). */
export const REDIS_PW = 'redis-pw-Ab3.9_x~Q7';
/** The settings every VM of these tests shares. */
export const common = {
  version: '0.1.0',
  imageRepository: 'ghcr.io/space-sandbox/space',
  privateCidr: '10.10.0.0/24',
  redisPassword: REDIS_PW,
};
export const ROUTER_URL = 'https://router.example.com';
/** The control VM's plan at `version`. */
export const control = (version = '0.1.0') => controlPlan({ ...common, version, routerUrl: ROUTER_URL });
/** An agent VM's plan (its control VM at 10.10.0.2). */
export const agent = (version = '0.1.0', gatewayEnabled = true) =>
  agentPlan({ ...common, version, pool, controlAddress: '10.10.0.2', gatewayEnabled });
/** The content of `path` in `plan`, or undefined. */
export const file = (plan: VmPlan, path: string) => plan.files.find((f) => f.path === path)?.content;
/** An env file's `NAME=value` lines as an object. */
export const envOf = (text: string) =>
  Object.fromEntries(
    text
      .trim()
      .split('\n')
      .map((l) => l.split('=', 2) as [string, string]),
  );
