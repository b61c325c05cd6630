/** Address plan of the `vm` mode, shared by the clouds that use it. */

/** The `n`-th host address of an IPv4 CIDR (n = 1 is the first after the network address). */
export function hostAddress(cidr: string, n: number): string {
  const [ip, bits] = cidr.split('/') as [string, string];
  const base = ip.split('.').reduce((acc, o) => acc * 256 + Number(o), 0);
  const mask = Number(bits) === 0 ? 0 : (0xffffffff << (32 - Number(bits))) >>> 0;
  const addr = ((base & mask) >>> 0) + n;
  return [24, 16, 8, 0].map((s) => (addr >>> s) & 255).join('.');
}

/** The control VM's private address: the subnet's 10th host (clouds reserve the first few). */
export function controlAddress(privateCidr: string): string {
  return hostAddress(privateCidr, 10);
}
