/**
 * IPv4 forwarding on an agent VM: sandboxes' CIDR egress rules need it, because their replies come
 * in on the uplink and must be forwarded back to the sandbox (`space doctor`: ipv4-forwarding).
 */

/** The agent VM's sysctl drop-in turning IPv4 forwarding on; systemd-sysctl applies it at every boot. */
export const IP_FORWARD_SYSCTL_FILE = '/etc/sysctl.d/60-space.conf';

/** The drop-in as a cloud-init file, and the command that applies it on the first boot (whose
 * systemd-sysctl ran before the file was written). */
export const IP_FORWARDING = {
  file: { path: IP_FORWARD_SYSCTL_FILE, mode: '0644', content: 'net.ipv4.ip_forward = 1\n' },
  applyNow: `sysctl -p ${IP_FORWARD_SYSCTL_FILE}`,
} as const;
