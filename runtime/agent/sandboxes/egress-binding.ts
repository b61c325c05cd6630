/**
 * A sandbox's egress binding: its policy pushed to the packet layer (CIDR rules on its network)
 * and to the node's egress gateway (names, credential grants), and what the gateway is known to
 * hold for it. Registrations of one sandbox are tracked in flight, so an unregistration is always
 * the gateway's last word on an address (its address is reused by a later sandbox).
 */
import { isDeepStrictEqual } from 'node:util';
import type { Logger } from 'pino';
import type { CredentialGrant } from '../../core/credentials.ts';
import type { EgressPolicy } from '../../core/egress.ts';
import { F } from '../../core/log-fields.ts';
import type { InstanceInfo } from '../drivers/driver.ts';
import type { HostNetworks, LocalSandbox, SandboxManagerOptions } from './types.ts';

export class EgressBinding {
  readonly #networks: HostNetworks;
  readonly #gateway: SandboxManagerOptions['gateway'];
  readonly #log: Logger;
  /**
   * Registrations with the gateway in flight (a warm claim's, a policy change's, the watchdog's),
   * by sandbox id.
   */
  readonly #registering = new Map<string, Promise<void>>();
  /**
   * What the gateway last confirmed it holds for each sandbox, by sandbox id: the id of the
   * gateway's registry that answered (a restarted gateway has a new one and holds nothing) and the
   * policy and grants sent. Absent while unknown: never registered, a try in flight or failed, or
   * a gateway older than `registryId`. The watchdog registers again only sandboxes not held so.
   */
  readonly #atGateway = new Map<
    string,
    { registryId: string; policy: EgressPolicy; credentials: CredentialGrant[] }
  >();

  constructor(o: { networks: HostNetworks; gateway: SandboxManagerOptions['gateway']; log: Logger }) {
    this.#networks = o.networks;
    this.#gateway = o.gateway;
    this.#log = o.log;
  }

  /** Whether a registration of sandbox `id` is in flight. */
  registering(id: string): boolean {
    return this.#registering.has(id);
  }

  /** Resolves once every registration of `id` in flight has settled. */
  async settled(id: string): Promise<void> {
    await this.#registering.get(id);
  }

  /** Pushes a sandbox's egress policy to the packet layer (CIDR rules) and to the gateway (names). */
  async apply(
    sandboxId: string,
    inst: InstanceInfo,
    egress: EgressPolicy,
    credentials: CredentialGrant[],
    opts: { fresh?: boolean } = {},
  ): Promise<void> {
    // `fresh`: the network was just made (no CIDR rules): an empty list changes nothing there
    const cidrs =
      opts.fresh && egress.cidrs.length === 0
        ? undefined
        : this.#networks.setCidrAllows(inst.network, egress.cidrs);
    await Promise.all([cidrs, this.#register(sandboxId, inst.network.sandboxAddress, egress, credentials)]);
  }

  /**
   * Records `p`, a registration of sandbox `id` with the gateway, as in flight (with any already
   * in flight), so a delete or a policy change waits for it: the gateway's last word on an address
   * is always the latest one sent. Returns `p`.
   */
  track(id: string, p: Promise<void>): Promise<void> {
    const all = Promise.allSettled([this.#registering.get(id), p]).then(() => {
      if (this.#registering.get(id) === all) this.#registering.delete(id);
    });
    this.#registering.set(id, all);
    return p;
  }

  /**
   * Registers sandbox `id` at source `address` with the gateway (policy and grants), and records
   * what the gateway then holds: nothing while the call is in flight or after it failed, so a
   * watchdog pass registers it again. Nothing without a gateway.
   * @throws what GatewayClient.register throws.
   */
  async #register(
    id: string,
    address: string,
    policy: EgressPolicy,
    credentials: CredentialGrant[],
  ): Promise<void> {
    const gateway = this.#gateway;
    if (!gateway) return;
    this.#atGateway.delete(id);
    const { registryId } = await gateway.register(address, { sandboxId: id, policy, credentials });
    if (registryId !== undefined) this.#atGateway.set(id, { registryId, policy, credentials });
  }

  /**
   * Forgets sandbox `id`'s registration at `address` with the gateway, and the record of it, after
   * any registration of it still in flight ({@link track}): the unregistration is always the
   * gateway's last word on that address, whichever path ends the sandbox.
   */
  async unregister(id: string, address: string): Promise<void> {
    await this.#registering.get(id);
    this.#atGateway.delete(id);
    await this.#gateway?.unregister(address);
  }

  /**
   * Whether the gateway holds `sb`'s current policy and grants, as far as this agent knows: its
   * last registration succeeded, sent what `sb` holds now, and was answered by the registry
   * `registryId` the gateway reports now (undefined: unknown, so not held).
   */
  #held(sb: LocalSandbox, registryId: string | undefined): boolean {
    const at = this.#atGateway.get(sb.id);
    return (
      registryId !== undefined &&
      at?.registryId === registryId &&
      isDeepStrictEqual(at.policy, sb.egress) &&
      isDeepStrictEqual(at.credentials, sb.credentials)
    );
  }

  /**
   * Registers again, all at once, every live sandbox of `live` the gateway may not hold and that
   * has no registration in flight (that one records its own outcome). Before `registryId` this was
   * every sandbox on every pass: one control call per sandbox every 5 s. A sandbox being deleted
   * (`deleted`: its tombstone is set before it unregisters) is left out; a delete waits for one
   * still in flight, so the unregistration is always the gateway's last word on that address.
   */
  async registerStale(live: LocalSandbox[], deleted: (id: string) => boolean): Promise<void> {
    const gateway = this.#gateway;
    if (!gateway || live.length === 0) return;
    const registryId = await gateway.registryId().catch((err: unknown) => {
      this.#log.warn({ err }, 'the gateway did not say its registry id; registering every sandbox again');
      return undefined;
    });
    const stale = live.filter((sb) => !this.#registering.has(sb.id) && !this.#held(sb, registryId));
    await Promise.allSettled(
      stale.map((sb) =>
        deleted(sb.id)
          ? undefined
          : this.track(
              sb.id,
              this.#register(sb.id, sb.instance.network.sandboxAddress, sb.egress, sb.credentials).catch(
                (err: unknown) =>
                  this.#log.warn({ err, [F.sandboxId]: sb.id }, 'gateway re-registration failed'),
              ),
            ),
      ),
    );
  }
}
