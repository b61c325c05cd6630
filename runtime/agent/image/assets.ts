/**
 * What the runtime image bakes in at build time (`npm run image`, scripts/image-assets.ts) so a
 * node needs neither apt nor the internet to serve its first sandbox:
 * ```
 * <assets>/guest-kernel/                      the VM drivers' guest kernel (guest-kernel.ts)
 * <assets>/templates/<name>/<digest>/rootfs   a default template, built as the agent would build it
 * <assets>/templates/<name>/<digest>/complete (templates.ts; used only when its digest is current)
 * ```
 * `<assets>` is `SPACE_IMAGE_ASSETS_DIR` (default {@link DEFAULT_IMAGE_ASSETS_DIR}).
 */
import { join } from 'node:path';

/** Where the runtime image puts its baked assets. */
export const DEFAULT_IMAGE_ASSETS_DIR = '/usr/lib/space';

/** The guest kernel's directory under `assets`. Pure. */
export function guestKernelDir(assets: string): string {
  return join(assets, 'guest-kernel');
}
