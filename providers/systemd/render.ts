/** A VM plan rendered for the cloud: cloud-init user data, or one bash startup script. Pure. */
import { stringify } from 'yaml';
import type { VmPlan } from './plan.ts';

/** The plan as cloud-init user data (`#cloud-config` YAML). */
export function toCloudConfig(plan: VmPlan): string {
  const doc = {
    package_update: true,
    packages: [...plan.packages],
    write_files: plan.files.map((f) => ({
      path: f.path,
      permissions: f.mode,
      owner: 'root:root',
      content: f.content,
    })),
    runcmd: [...plan.commands],
  };
  return `#cloud-config\n${stringify(doc, { lineWidth: 0 })}`;
}

/** Marker the startup script leaves once the VM is provisioned (see {@link toShellScript}). */
export const PROVISIONED_MARKER = '/var/lib/space/provisioned';

/**
 * The plan as one bash script, for clouds without cloud-init (Crusoe `startup_script`). Crusoe
 * runs startup scripts at **every boot**, requires them to start with `#!/bin/bash` and to be
 * ASCII only (Crusoe docs, "startup scripts"; docs/deployment.md "What only a real cloud account can confirm"). So:
 * - a non-ASCII character anywhere (an operator setting, a comment) is refused here, at render time;
 * - the script provisions once and leaves {@link PROVISIONED_MARKER}; at every later boot it exits
 *   at once. Re-running it would rewrite `/etc/space/image.env` and so rewind an in-place upgrade
 *   (`space-upgrade`) to the version the VM was created with. What must happen at every boot is a
 *   systemd unit (the firewall guards, the services), never a line of this script.
 */
export function toShellScript(plan: VmPlan): string {
  const lines = [
    '#!/bin/bash',
    '# SPACE provisioning script (rendered by providers/systemd/cloud-init.ts).',
    '# Runs at every boot; provisions once. Boot-time work lives in systemd units.',
    'set -euo pipefail',
    `if [ -e ${PROVISIONED_MARKER} ]; then`,
    '  echo "space: provisioned already; nothing to do at this boot"',
    '  exit 0',
    'fi',
  ];
  lines.push(
    'export DEBIAN_FRONTEND=noninteractive',
    'apt-get update',
    `apt-get install -y ${plan.packages.join(' ')}`,
  );
  plan.files.forEach((f, i) => {
    const marker = `SPACE_EOF_${i}`;
    lines.push(
      `mkdir -p "$(dirname ${f.path})"`,
      // the mode before the content: a root-only file (the Redis password) is never readable by others
      `: > ${f.path}`,
      `chmod ${f.mode} ${f.path}`,
      `cat > ${f.path} <<'${marker}'`,
      f.content.replace(/\n$/, ''),
      marker,
    );
  });
  lines.push(
    ...plan.commands,
    `mkdir -p "$(dirname ${PROVISIONED_MARKER})"`,
    `touch ${PROVISIONED_MARKER}`,
    '',
  );
  const script = lines.join('\n');
  const bad = [...script].findIndex((c) => c.charCodeAt(0) > 0x7e || (c < ' ' && c !== '\n' && c !== '\t'));
  if (bad >= 0) {
    const line = script.slice(0, bad).split('\n').length;
    throw new Error(
      `startup script: character ${JSON.stringify(script[bad])} on line ${line} is not printable ASCII (Crusoe accepts ASCII only)`,
    );
  }
  return script;
}
